package routing

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Mode selects how pod traffic reaches other nodes.
type Mode string

const (
	// ModeHostGW routes each remote podCIDR via the remote node's address:
	// every node must share one L2 segment (Flannel's host-gw).
	ModeHostGW Mode = "hostgw"
	// ModeVXLAN encapsulates pod traffic in VXLAN between node addresses
	// (Flannel's vxlan backend, with static neighbour and FDB entries).
	ModeVXLAN Mode = "vxlan"
	// ModeIPIP encapsulates IPv4 pod traffic in IPv4 (Calico's IPIP mode),
	// to every node or, with IPIPConfig.CrossSubnet, only to nodes outside
	// the node's own subnet. IPv6 podCIDRs are routed as in host-gw.
	ModeIPIP Mode = "ipip"
)

// DefaultIPIPDevice is the IPIP device's name unless IPIPConfig says
// otherwise; OverheadIPIP what it adds to a packet (the outer IPv4 header).
const (
	DefaultIPIPDevice = "weft.ipip"
	OverheadIPIP      = 20
)

// IPIPConfig configures IPIP mode.
type IPIPConfig struct {
	Device string // DefaultIPIPDevice if empty
	// CrossSubnet encapsulates only to nodes whose address is outside
	// Subnet (the node's own underlay subnet); those inside it get
	// host-gw routes.
	CrossSubnet bool
	Subnet      netip.Prefix
	MTU         int // 0: the underlay link's MTU minus OverheadIPIP, at Apply
}

// IPIPDevice is the node's IPIP device: any remote, the node's IPv4
// underlay address as local.
type IPIPDevice struct {
	Name  string
	Local netip.Addr
	MTU   int            // 0: underlay link MTU minus OverheadIPIP, at Apply
	Addrs []netip.Prefix // the IPv4 podCIDR's network address, as a /32
}

// Defaults of VXLANConfig.
const (
	DefaultDevice = "weft.vxlan"
	DefaultVNI    = 1
	DefaultPort   = 8472 // Linux's historical VXLAN port, Flannel's default
)

// Encapsulation overhead of VXLAN: outer IP + UDP (8) + VXLAN (8) + inner
// Ethernet (14); the outer IP header is 20 bytes for IPv4, 40 for IPv6.
const (
	OverheadIPv4 = 50
	OverheadIPv6 = 70
)

// Node is what routing needs to know about one Kubernetes node.
type Node struct {
	Name        string
	InternalIPs []netip.Addr   // at most one per family
	PodCIDRs    []netip.Prefix // at most one per family
	// VTEPMAC is the MAC of the node's VXLAN device, as the node published
	// it (nil until it has). Only VXLAN uses it.
	VTEPMAC net.HardwareAddr
}

// VXLANConfig configures the VXLAN device; zero values take the defaults.
type VXLANConfig struct {
	Device string // DefaultDevice if empty
	VNI    uint32 // DefaultVNI if 0; at most 2^24-1
	Port   uint16 // DefaultPort if 0
	// MTU of the device. If 0, it is UnderlayMTU minus the overhead; if that
	// is 0 too, Apply derives it from the link holding the local address.
	MTU         int
	UnderlayMTU int
	// IPv6Underlay encapsulates between the nodes' IPv6 InternalIPs. The
	// default is IPv4 when Self has an IPv4 InternalIP, else IPv6.
	IPv6Underlay bool
}

// Config is the node's own routing configuration.
type Config struct {
	Mode  Mode
	Self  Node // Self.VTEPMAC defaults to VTEPMAC(Self.Name)
	VXLAN VXLANConfig
	IPIP  IPIPConfig
}

// Route is one route weft owns, in the main table. Dev is empty when the
// kernel chooses the link from the gateway (host-gw).
type Route struct {
	Dst    netip.Prefix
	Via    netip.Addr
	Dev    string
	OnLink bool
}

func (r Route) String() string {
	s := fmt.Sprintf("route %s via %s", r.Dst, r.Via)
	if r.Dev != "" {
		s += " dev " + r.Dev
	}
	if r.OnLink {
		s += " onlink"
	}
	return s
}

// Neighbor is a permanent neighbour entry on the VXLAN device.
type Neighbor struct {
	IP  netip.Addr
	MAC net.HardwareAddr
}

func (n Neighbor) String() string { return fmt.Sprintf("neighbour %s lladdr %s", n.IP, n.MAC) }

// FDBEntry is a permanent forwarding entry on the VXLAN device: frames for
// MAC are encapsulated to Dst.
type FDBEntry struct {
	MAC net.HardwareAddr
	Dst netip.Addr
}

func (f FDBEntry) String() string { return fmt.Sprintf("fdb %s dst %s", f.MAC, f.Dst) }

// VXLANDevice is the node's VXLAN device. Learning is always off.
type VXLANDevice struct {
	Name  string
	VNI   uint32
	Port  uint16
	Local netip.Addr // the node's underlay address
	MTU   int        // 0: underlay link MTU minus the overhead, at Apply
	MAC   net.HardwareAddr
	Addrs []netip.Prefix // host prefixes (/32, /128) the device carries
}

// Desired is everything weft wants programmed on one node. Compute returns
// it sorted; a zero Desired has no Mode and Apply refuses it.
type Desired struct {
	Mode      Mode
	Routes    []Route    // by Dst
	Neighbors []Neighbor // by IP
	FDB       []FDBEntry // by MAC, then Dst
	Device    *VXLANDevice
	IPIP      *IPIPDevice
}

// Errors a NodeError wraps.
var (
	ErrMissing   = errors.New("missing")
	ErrInvalid   = errors.New("invalid")
	ErrOverlap   = errors.New("overlapping podCIDR")
	ErrDuplicate = errors.New("duplicate")
)

// NodeError says why (part of) a node was left out of the desired state.
type NodeError struct {
	Node string // the node's name
	// Field is the Node or Config field at fault: Name, InternalIPs,
	// PodCIDRs, VTEPMAC, or, for the node's own Config, Mode, VXLAN.Device,
	// VXLAN.VNI, VXLAN.MTU, IPIP.Device, IPIP.Subnet, IPIP.MTU.
	Field string
	Err   error
}

func (e NodeError) Error() string { return fmt.Sprintf("node %q: %s: %v", e.Node, e.Field, e.Err) }

func (e NodeError) Unwrap() error { return e.Err }
