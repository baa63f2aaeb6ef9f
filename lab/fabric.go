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

	"github.com/weftnet/weft/internal/netnsutil"
)

// The lab's address plan. Everything lives inside namespaces the lab makes.
const (
	NSPrefix      = "weftlab-"
	UnderlayNS    = NSPrefix + "underlay"
	UnderlayBr    = "ul0"
	ControlNS     = NSPrefix + "cp"
	ExternalNS    = NSPrefix + "ext"
	underlayBits  = 24
	firstNodeHost = 11
	ClusterCIDR   = "10.244.0.0/16"
	ServiceCIDR   = "10.96.0.0/16"
	APIServerPort = 6443
)

var (
	underlayNet = netip.MustParsePrefix("172.18.0.0/24")
	// ControlIP is the control plane's address on the underlay.
	ControlIP = netip.MustParseAddr("172.18.0.2")
	// ExternalIP is the outside client's address on the underlay.
	ExternalIP = netip.MustParseAddr("172.18.0.100")
)

// Member is one namespace on the underlay: a node, the control plane or the
// external host.
type Member struct {
	Name string     // node name, "cp" or "ext"
	NS   string     // namespace name
	IP   netip.Addr // underlay address
}

// NSPath is the member's namespace path.
func (m Member) NSPath() string { return netnsutil.RunDir + "/" + m.NS }

// NodeName is the name of the i-th node (0-based).
func NodeName(i int) string { return fmt.Sprintf("node%d", i+1) }

// Members returns the lab's underlay members for n nodes.
func Members(n int) []Member {
	ms := []Member{
		{Name: "cp", NS: ControlNS, IP: ControlIP},
		{Name: "ext", NS: ExternalNS, IP: ExternalIP},
	}
	for i := 0; i < n; i++ {
		ip := underlayNet.Addr().As4()
		ip[3] = byte(firstNodeHost + i)
		ms = append(ms, Member{Name: NodeName(i), NS: NSPrefix + NodeName(i), IP: netip.AddrFrom4(ip)})
	}
	return ms
}

// buildFabric creates the underlay namespace with its bridge and attaches
// every member namespace to it by a veth (eth0 inside the member).
func buildFabric(members []Member) error {
	if _, err := netnsutil.NewNamed(UnderlayNS); err != nil {
		return err
	}
	err := netnsutil.Do(netnsutil.RunDir+"/"+UnderlayNS, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: UnderlayBr, Flags: net.FlagUp, TxQLen: -1}}
		return netlink.LinkAdd(br)
	})
	if err != nil {
		return fmt.Errorf("creating the underlay bridge: %w", err)
	}
	for _, m := range members {
		if err := attach(m); err != nil {
			return fmt.Errorf("attaching %s to the underlay: %w", m.Name, err)
		}
	}
	return nil
}

func attach(m Member) error {
	if _, err := netnsutil.NewNamed(m.NS); err != nil {
		return err
	}
	member, err := netns.GetFromPath(m.NSPath())
	if err != nil {
		return err
	}
	defer member.Close()
	err = netnsutil.Do(netnsutil.RunDir+"/"+UnderlayNS, func() error {
		br, err := netlink.LinkByName(UnderlayBr)
		if err != nil {
			return err
		}
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: "ul-" + m.Name, MasterIndex: br.Attrs().Index, Flags: net.FlagUp, TxQLen: -1},
			PeerName:      "eth0",
			PeerNamespace: netlink.NsFd(int(member)),
		}
		return netlink.LinkAdd(veth)
	})
	if err != nil {
		return err
	}
	return netnsutil.Do(m.NSPath(), func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: m.IP.AsSlice(), Mask: net.CIDRMask(underlayBits, 32)}}
		if err := netlink.AddrAdd(eth, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(eth); err != nil {
			return err
		}
		if m.NS != ExternalNS {
			// Like real machines, members have a default route: the external
			// host plays the outside world's router.
			gw := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: ExternalIP.AsSlice()}
			if err := netlink.RouteAdd(gw); err != nil {
				return fmt.Errorf("default route: %w", err)
			}
		}
		return writeSysctl("net/ipv4/ip_forward", "1")
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
