package wireguard

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Where each node publishes what its peers need: the public key of its
// device (base64, as `wg` prints it) and the underlay endpoint it listens
// on (address:port, [address]:port for IPv6).
const (
	PublicKeyAnnotation = "weft.dev/wireguard-public-key"
	EndpointAnnotation  = "weft.dev/wireguard-endpoint"
)

// Defaults of Config.
const (
	DefaultDevice = "weft.wg"
	DefaultPort   = 51822
	// Table is the routing table of the encrypted routes; Rule's priority
	// puts it before the main table (32766), where the routing mode's
	// routes are. A route in this table wins; a destination it lacks falls
	// through to the main table.
	Table        = 87
	RulePriority = 99
	// RouteProtocol marks the routes weft owns in Table, as package
	// routing's in the main table.
	RouteProtocol = 0x57
	// StrictMetric is the metric of strict mode's blackholes: behind the
	// device's routes (metric 0), so they drop what no tunnel carries.
	StrictMetric = 4096
)

// Overhead of WireGuard per packet: outer IP header (20 or 40), UDP (8),
// and the data message's header (16) and authentication tag (16).
const (
	OverheadIPv4 = 60
	OverheadIPv6 = 80
)

// Node is what encryption needs of one Kubernetes node: its podCIDRs
// (validated by the caller) and its two annotations as published.
type Node struct {
	Name      string
	PodCIDRs  []netip.Prefix
	PublicKey string
	Endpoint  string
}

// Config is the node's own side.
type Config struct {
	Self Node
	// Strict drops pod traffic to a node that has no tunnel instead of
	// letting it take the routing mode's route in clear.
	Strict bool
}

// Peer is another node's tunnel.
type Peer struct {
	Node       string
	PublicKey  wgtypes.Key
	Endpoint   netip.AddrPort
	AllowedIPs []netip.Prefix // the node's podCIDRs
}

// Route is a route in Table: to the device (with Src, the own podCIDR
// network address of the family, so that the node's own traffic to pods
// elsewhere is answered through the tunnel too), or a blackhole of strict
// mode at StrictMetric.
type Route struct {
	Dst       netip.Prefix
	Src       netip.Addr // invalid for a blackhole, or without an own podCIDR of the family
	Blackhole bool
}

func (r Route) String() string {
	if r.Blackhole {
		return fmt.Sprintf("blackhole %s metric %d table %d", r.Dst, StrictMetric, Table)
	}
	s := fmt.Sprintf("route %s dev %s table %d", r.Dst, DefaultDevice, Table)
	if r.Src.IsValid() {
		s += " src " + r.Src.String()
	}
	return s
}

// Desired is the node's encryption state: sorted, plain data.
type Desired struct {
	Peers  []Peer  // by node name
	Routes []Route // by destination, device route before blackhole
	// Addrs are the host prefixes the device carries: each own podCIDR's
	// network address (what masquerade picks as the source of traffic
	// leaving through the device).
	Addrs []netip.Prefix
}

// NodeError names a node left out and why.
type NodeError struct {
	Node  string
	Field string
	Err   error
}

func (e NodeError) Error() string { return fmt.Sprintf("node %s: %s: %v", e.Node, e.Field, e.Err) }

// Compute returns the node's peers and routes. A node whose public key or
// endpoint annotation is missing or malformed gets no peer and no device
// route (strict mode still blackholes its podCIDRs), and is reported; the
// others are unaffected. Two nodes publishing one key: the later by name
// is left out.
func Compute(cfg Config, nodes []Node) (Desired, []NodeError) {
	var d Desired
	var errs []NodeError
	for _, p := range cfg.Self.PodCIDRs {
		d.Addrs = append(d.Addrs, netip.PrefixFrom(p.Masked().Addr(), p.Addr().BitLen()))
	}
	src := func(dst netip.Prefix) netip.Addr {
		for _, a := range d.Addrs {
			if a.Addr().Is4() == dst.Addr().Is4() {
				return a.Addr()
			}
		}
		return netip.Addr{}
	}
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	keys := map[wgtypes.Key]string{}
	for _, n := range sorted {
		if n.Name == cfg.Self.Name || len(n.PodCIDRs) == 0 {
			continue
		}
		peer, err := parsePeer(n)
		if err == nil {
			if other, dup := keys[peer.PublicKey]; dup {
				err = &NodeError{n.Name, "metadata.annotations[" + PublicKeyAnnotation + "]", fmt.Errorf("the same key as node %s", other)}
			}
		}
		for _, p := range n.PodCIDRs {
			if err == nil {
				d.Routes = append(d.Routes, Route{Dst: p.Masked(), Src: src(p)})
			}
			if cfg.Strict {
				d.Routes = append(d.Routes, Route{Dst: p.Masked(), Blackhole: true})
			}
		}
		if err != nil {
			errs = append(errs, *err)
			continue
		}
		keys[peer.PublicKey] = n.Name
		d.Peers = append(d.Peers, peer)
	}
	slices.SortFunc(d.Routes, func(a, b Route) int {
		if c := a.Dst.Addr().Compare(b.Dst.Addr()); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Dst.Bits(), b.Dst.Bits()); c != 0 {
			return c
		}
		return cmp.Compare(boolInt(a.Blackhole), boolInt(b.Blackhole))
	})
	return d, errs
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// parsePeer reads a node's annotations.
func parsePeer(n Node) (Peer, *NodeError) {
	field := func(a string) string { return "metadata.annotations[" + a + "]" }
	if n.PublicKey == "" {
		return Peer{}, &NodeError{n.Name, field(PublicKeyAnnotation), fmt.Errorf("not published yet")}
	}
	key, err := wgtypes.ParseKey(n.PublicKey)
	if err != nil {
		return Peer{}, &NodeError{n.Name, field(PublicKeyAnnotation), fmt.Errorf("%q: %w", n.PublicKey, err)}
	}
	if key == (wgtypes.Key{}) {
		return Peer{}, &NodeError{n.Name, field(PublicKeyAnnotation), fmt.Errorf("the all-zero key")}
	}
	ep, err := ParseEndpoint(n.Endpoint)
	if err != nil {
		return Peer{}, &NodeError{n.Name, field(EndpointAnnotation), err}
	}
	allowed := make([]netip.Prefix, 0, len(n.PodCIDRs))
	for _, p := range n.PodCIDRs {
		allowed = append(allowed, p.Masked())
	}
	return Peer{Node: n.Name, PublicKey: key, Endpoint: ep, AllowedIPs: allowed}, nil
}

// ParseEndpoint reads an endpoint annotation: a unicast address and a port
// other than 0.
func ParseEndpoint(s string) (netip.AddrPort, error) {
	if s == "" {
		return netip.AddrPort{}, fmt.Errorf("not published yet")
	}
	ep, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: %w", s, err)
	}
	a := ep.Addr().Unmap()
	if ep.Port() == 0 || !a.IsGlobalUnicast() || a.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%q: not a unicast address and port", s)
	}
	return netip.AddrPortFrom(a, ep.Port()), nil
}
