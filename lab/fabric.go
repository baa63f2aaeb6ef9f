package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

// The lab's address plan. Everything lives inside namespaces the lab makes.
const (
	NSPrefix      = "weftlab-"
	UnderlayNS    = NSPrefix + "underlay"
	UnderlayBr    = "ul0"
	ControlNS     = NSPrefix + "cp"
	ExternalNS    = NSPrefix + "ext"
	ToRNS         = NSPrefix + "tor"
	underlayBits  = 24
	firstNodeHost = 11
	ClusterCIDR   = "10.244.0.0/16"
	ServiceCIDR   = "10.96.0.0/16"
	// ClusterCIDR6 and ServiceCIDR6 are the IPv6 ranges of a dual-stack
	// lab (a /64 per node).
	ClusterCIDR6  = "fd00:10:244::/56"
	ServiceCIDR6  = "fd00:10:96::/112"
	APIServerPort = 6443
)

var (
	underlayNet = netip.MustParsePrefix("172.18.0.0/24")
	// ControlIP is the control plane's address on the underlay.
	ControlIP = netip.MustParseAddr("172.18.0.2")
	// ExternalIP is the outside client's address on a one-segment
	// underlay; on racks it is outsideNet's ExternalHost.
	ExternalIP = netip.MustParseAddr("172.18.0.100")
	// outsideNet is the external host's segment behind the ToR, on racks.
	outsideNet = netip.MustParsePrefix("172.18.100.0/24")
	// underlayNet6 is the IPv6 underlay of a dual-stack lab: a member at
	// 172.18.0.h is at fd00:18::h (h in decimal digits).
	underlayNet6 = netip.MustParsePrefix("fd00:18::/64")
)

// MaxRacks is how many racks a lab can have (rack r's subnet is
// 172.18.r.0/24).
const MaxRacks = 8

// Member is one namespace on the underlay: a node, the control plane or the
// external host.
type Member struct {
	Name string     // node name, "cp" or "ext"
	NS   string     // namespace name
	IP   netip.Addr // underlay address
	// Rack is the member's rack, on a lab with racks (the external host's
	// is -1: it is behind the ToR, on no rack).
	Rack int `json:"rack,omitempty"`
	// Gateway is the member's default router: the external host on one
	// segment, its rack's ToR on racks, none for the external host itself.
	Gateway netip.Addr `json:"gateway,omitzero"`
	// IP6 and Gateway6 are the same in IPv6, on a dual-stack lab.
	IP6      netip.Addr `json:"ip6,omitzero"`
	Gateway6 netip.Addr `json:"gateway6,omitzero"`
}

// nodeIPs is the member's address, and its IPv6 one on a dual-stack lab,
// as the kubelet's --node-ip takes them.
func (m Member) nodeIPs() string {
	if m.IP6.IsValid() {
		return m.IP.String() + "," + m.IP6.String()
	}
	return m.IP.String()
}

// addIPv6 gives the members of a one-segment lab their IPv6 addresses
// and default routers (dual stack).
func addIPv6(members []Member) {
	v6 := func(a netip.Addr) netip.Addr {
		if !a.IsValid() {
			return a
		}
		return netip.MustParseAddr(fmt.Sprintf("%s%d", underlayNet6.Addr(), a.As4()[3]))
	}
	for i := range members {
		members[i].IP6, members[i].Gateway6 = v6(members[i].IP), v6(members[i].Gateway)
	}
}

// NSPath is the member's namespace path.
func (m Member) NSPath() string { return netnsutil.RunDir + "/" + m.NS }

// bridge is the underlay bridge of the member's segment.
func (m Member) bridge() string {
	if m.Rack < 0 {
		return "ulx"
	}
	return fmt.Sprintf("ul%d", m.Rack)
}

// NodeName is the name of the i-th node (0-based).
func NodeName(i int) string { return fmt.Sprintf("node%d", i+1) }

// Members returns the lab's underlay members for n nodes on racks racks
// (0 or 1: one segment). On racks, node i is on rack i % racks, at
// 172.18.<rack>.<11+i>, the control plane on rack 0, and the external host
// behind the ToR.
func Members(n, racks int) []Member {
	if racks <= 1 {
		ms := []Member{
			{Name: "cp", NS: ControlNS, IP: ControlIP, Gateway: ExternalIP},
			{Name: "ext", NS: ExternalNS, IP: ExternalIP},
		}
		for i := 0; i < n; i++ {
			ms = append(ms, Member{Name: NodeName(i), NS: NSPrefix + NodeName(i), IP: hostIn(underlayNet, firstNodeHost+i), Gateway: ExternalIP})
		}
		return ms
	}
	ms := []Member{
		{Name: "cp", NS: ControlNS, IP: ControlIP, Gateway: torAddr(0)},
		{Name: "ext", NS: ExternalNS, IP: hostIn(outsideNet, 100), Rack: -1, Gateway: hostIn(outsideNet, 1)},
	}
	for i := 0; i < n; i++ {
		r := i % racks
		ms = append(ms, Member{Name: NodeName(i), NS: NSPrefix + NodeName(i), IP: hostIn(rackNet(r), firstNodeHost+i), Rack: r, Gateway: torAddr(r)})
	}
	return ms
}

// rackNet is rack r's subnet; torAddr the ToR's address on it.
func rackNet(r int) netip.Prefix {
	a := underlayNet.Addr().As4()
	a[2] = byte(r)
	return netip.PrefixFrom(netip.AddrFrom4(a), underlayBits)
}

func torAddr(r int) netip.Addr { return hostIn(rackNet(r), 1) }

// hostIn is host number h of an IPv4 /24.
func hostIn(p netip.Prefix, h int) netip.Addr {
	a := p.Addr().As4()
	a[3] = byte(h)
	return netip.AddrFrom4(a)
}

// buildFabric creates the underlay namespace with a bridge per segment
// (one, or a rack's each and the outside's), attaches every member
// namespace to its segment by a veth (eth0 inside the member) and, on
// racks, the ToR namespace to every segment.
func buildFabric(members []Member, racks int) error {
	if _, err := netnsutil.NewNamed(UnderlayNS); err != nil {
		return err
	}
	bridges := []string{UnderlayBr}
	if racks > 1 {
		bridges = []string{"ulx"}
		for r := range racks {
			bridges = append(bridges, fmt.Sprintf("ul%d", r))
		}
	}
	err := netnsutil.Do(netnsutil.RunDir+"/"+UnderlayNS, func() error {
		for _, name := range bridges {
			br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, Flags: net.FlagUp, TxQLen: -1}}
			if err := netlink.LinkAdd(br); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("creating the underlay bridges: %w", err)
	}
	for _, m := range members {
		if err := attach(m); err != nil {
			return fmt.Errorf("attaching %s to the underlay: %w", m.Name, err)
		}
	}
	if racks > 1 {
		if err := buildToR(racks); err != nil {
			return fmt.Errorf("the ToR: %w", err)
		}
	}
	return nil
}

// buildToR makes the top-of-rack router: a namespace with a leg on every
// rack's segment and on the outside's, forwarding between them. The routes
// to pods and Services it learns by BGP (tor.go).
func buildToR(racks int) error {
	if _, err := netnsutil.NewNamed(ToRNS); err != nil {
		return err
	}
	legs := map[string]netip.Prefix{"ulx": netip.PrefixFrom(hostIn(outsideNet, 1), underlayBits)}
	for r := range racks {
		legs[fmt.Sprintf("ul%d", r)] = netip.PrefixFrom(torAddr(r), underlayBits)
	}
	for br, addr := range legs {
		if err := plug(ToRNS, "tor-"+br, br, "eth-"+br, []netip.Prefix{addr}, nil); err != nil {
			return err
		}
	}
	return netnsutil.Do(netnsutil.RunDir+"/"+ToRNS, func() error {
		return writeSysctl("net/ipv4/ip_forward", "1")
	})
}

func attach(m Member) error {
	if _, err := netnsutil.NewNamed(m.NS); err != nil {
		return err
	}
	addrs, gws := []netip.Prefix{netip.PrefixFrom(m.IP, underlayBits)}, []netip.Addr{m.Gateway}
	if m.IP6.IsValid() {
		addrs, gws = append(addrs, netip.PrefixFrom(m.IP6, underlayNet6.Bits())), append(gws, m.Gateway6)
	}
	if err := plug(m.NS, "ul-"+m.Name, m.bridge(), "eth0", addrs, gws); err != nil {
		return err
	}
	// Like real machines, members forward: the external host plays the
	// outside world's router on one segment.
	return netnsutil.Do(m.NSPath(), func() error {
		if m.IP6.IsValid() {
			if err := writeSysctl("net/ipv6/conf/all/forwarding", "1"); err != nil {
				return err
			}
		}
		return writeSysctl("net/ipv4/ip_forward", "1")
	})
}

// plug connects namespace ns to the underlay bridge br by a veth (outer
// name in the underlay namespace, inner name in ns) and gives the inner end
// addrs and a default route through each valid gw.
func plug(ns, outer, br, inner string, addrs []netip.Prefix, gws []netip.Addr) error {
	nsPath := netnsutil.RunDir + "/" + ns
	h, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	err = netnsutil.Do(netnsutil.RunDir+"/"+UnderlayNS, func() error {
		bridge, err := netlink.LinkByName(br)
		if err != nil {
			return err
		}
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: outer, MasterIndex: bridge.Attrs().Index, Flags: net.FlagUp, TxQLen: -1},
			PeerName:      inner,
			PeerNamespace: netlink.NsFd(int(h)),
		}
		return netlink.LinkAdd(veth)
	})
	if err != nil {
		return err
	}
	return netnsutil.Do(nsPath, func() error {
		link, err := netlink.LinkByName(inner)
		if err != nil {
			return err
		}
		for _, addr := range addrs {
			a := &netlink.Addr{IPNet: &net.IPNet{IP: addr.Addr().AsSlice(), Mask: net.CIDRMask(addr.Bits(), addr.Addr().BitLen())}}
			if addr.Addr().Is6() {
				a.Flags = unix.IFA_F_NODAD // usable at once, no duplicate address detection
			}
			if err := netlink.AddrAdd(link, a); err != nil {
				return fmt.Errorf("address %s: %w", addr, err)
			}
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return err
		}
		for _, gw := range gws {
			if gw.IsValid() {
				if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
					return fmt.Errorf("default route via %s: %w", gw, err)
				}
			}
		}
		return nil
	})
}

// writeSysctl sets a sysctl of the calling thread's network namespace.
func writeSysctl(name, value string) error {
	return os.WriteFile("/proc/sys/"+name, []byte(value), 0o644)
}

// labNamespaces lists every namespace with the lab's prefix.
func labNamespaces() ([]string, error) {
	entries, err := os.ReadDir(netnsutil.RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), NSPrefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}
