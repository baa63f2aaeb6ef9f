package cni

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/internal/sysctl"
	"github.com/weftnet/weft/ipam"
)

// fallbackMTU is used when the node has no default route to derive one from.
const fallbackMTU = 1500

// ensureBridge returns the node bridge, creating it (up, with a fixed MAC so
// that pods never see their gateway's MAC change as ports come and go) when
// it does not exist yet.
func ensureBridge(name string, mtu int) (*netlink.Bridge, error) {
	link, err := netlink.LinkByName(name)
	if err == nil {
		br, ok := link.(*netlink.Bridge)
		if !ok {
			return nil, fmt.Errorf("bridge: %s exists but is a %s, not a bridge", name, link.Type())
		}
		if br.Attrs().Flags&net.FlagUp == 0 {
			if err := netlink.LinkSetUp(br); err != nil {
				return nil, fmt.Errorf("setting bridge %s up: %w", name, err)
			}
		}
		return br, nil
	}
	var notFound netlink.LinkNotFoundError
	if !errors.As(err, &notFound) {
		return nil, fmt.Errorf("looking up bridge %s: %w", name, err)
	}
	mac, err := randomMAC()
	if err != nil {
		return nil, err
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu, HardwareAddr: mac, Flags: net.FlagUp, TxQLen: -1}}
	if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("creating bridge %s: %w", name, err)
	}
	// Re-read: a concurrent ADD may have created it first.
	link, err = netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("looking up bridge %s: %w", name, err)
	}
	created, ok := link.(*netlink.Bridge)
	if !ok {
		return nil, fmt.Errorf("bridge: %s exists but is a %s, not a bridge", name, link.Type())
	}
	return created, nil
}

// nodeBridge returns the node bridge (name), making sure that it exists,
// is up and carries the gateway of each lease. What every ADD but a node's
// first finds is checked in two short exchanges on host: the bridge's link,
// then its addresses. Anything missing or wrong goes to the general path
// (ensureBridge, ensureGateways), which creates or repairs it, or names
// what is in the way.
func nodeBridge(host *rtnl, name string, mtu int, leases []ipam.Lease) (rtLink, error) {
	if br, ok := bridgeReady(host, name, leases); ok {
		return br, nil
	}
	br, err := ensureBridge(name, mtu)
	if err != nil {
		return rtLink{}, err
	}
	if err := ensureGateways(br, leases); err != nil {
		return rtLink{}, err
	}
	return rtLink{index: br.Index, mac: br.HardwareAddr, name: br.Name, kind: "bridge", flags: unix.IFF_UP}, nil
}

// bridgeReady reports whether the link called name is a bridge, up, and
// holds every lease's gateway, and returns it if so. Any failure to tell
// is a no.
func bridgeReady(host *rtnl, name string, leases []ipam.Lease) (rtLink, bool) {
	br, found, err := host.getLink(getLinkMsg(name))
	if err != nil || !found || br.kind != "bridge" || br.flags&unix.IFF_UP == 0 {
		return rtLink{}, false
	}
	var have []netip.Addr
	errs, err := host.exchange(func(_ int, typ uint16, body []byte) {
		if typ != unix.RTM_NEWADDR {
			return
		}
		// A kernel that ignores the dump's filter sends every link's.
		if idx, a, err := parseAddr(body); err == nil && idx == br.index {
			have = append(have, a)
		}
	}, getAddrsMsg(br.index))
	if err != nil || errs[0] != nil {
		return rtLink{}, false
	}
	for _, l := range leases {
		if !slices.Contains(have, l.Gateway) {
			return rtLink{}, false
		}
	}
	return br, true
}

// EnsureBridge makes sure the node bridge exists, is up and carries the
// gateway address of each pod CIDR (e.g. 10.244.1.1/24), and that the node
// forwards those families. weft-agent calls it so that the node can route to
// its pods before the first pod starts.
func EnsureBridge(name string, mtu int, gateways []netip.Prefix) error {
	br, err := ensureBridge(name, mtu)
	if err != nil {
		return err
	}
	leases := make([]ipam.Lease, len(gateways))
	for i, gw := range gateways {
		leases[i] = ipam.Lease{Address: gw, Gateway: gw.Addr()}
	}
	if err := ensureGateways(br, leases); err != nil {
		return err
	}
	return enableForwarding(leases)
}

// ensureGateways puts each lease's gateway on the bridge, with the lease's
// prefix length, unless it is already there.
func ensureGateways(br *netlink.Bridge, leases []ipam.Lease) error {
	have, err := nlutil.Dump("addresses of "+br.Name, func() ([]netlink.Addr, error) { return netlink.AddrList(br, netlink.FAMILY_ALL) })
	if err != nil {
		return err
	}
	for _, l := range leases {
		gw := net.IP(l.Gateway.AsSlice())
		if hasIP(have, gw) {
			continue
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: gw, Mask: net.CIDRMask(l.Address.Bits(), l.Gateway.BitLen())}}
		if l.Gateway.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(br, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("adding gateway %s to %s: %w", addr.IPNet, br.Name, err)
		}
	}
	return nil
}

func hasIP(addrs []netlink.Addr, ip net.IP) bool {
	for _, a := range addrs {
		if a.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// enableForwarding turns on forwarding for the families the pod uses; a
// value that is already 1 is not rewritten (weft-agent's container cannot
// write /proc/sys: its DaemonSet's init container sets it).
func enableForwarding(leases []ipam.Lease) error {
	for _, l := range leases {
		name := "net.ipv4.ip_forward"
		if l.Address.Addr().Is6() {
			name = "net.ipv6.conf.all.forwarding"
		}
		if err := sysctl.Ensure(name, "1"); err != nil {
			return fmt.Errorf("enabling forwarding: %w", err)
		}
	}
	return nil
}

// defaultMTU is the MTU of the interface of the node's default route.
func defaultMTU() int {
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := nlutil.Dump("routes", func() ([]netlink.Route, error) { return netlink.RouteList(nil, family) })
		if err != nil {
			continue
		}
		for _, r := range routes {
			if r.Dst != nil && !isDefaultDst(r.Dst) {
				continue
			}
			if link, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				return link.Attrs().MTU
			}
		}
	}
	return fallbackMTU
}

func isDefaultDst(dst *net.IPNet) bool {
	ones, _ := dst.Mask.Size()
	return ones == 0
}

// ipNet converts a netip prefix to the net form netlink wants, keeping the host bits.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
