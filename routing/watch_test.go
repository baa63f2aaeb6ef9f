package routing_test

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/routing"
)

// watcher records the rtnetlink notifications of one node, to prove that
// an Apply changed nothing weft owns.
type watcher struct {
	l    *lab
	ns   string
	sock *nl.NetlinkSocket
	dev  *netlink.Vxlan      // weft's device when the watch began
	addr map[netip.Addr]bool // its addresses then
}

const markerProto = 0x58 // a route protocol only the watcher uses

func (l *lab) watch(i int) *watcher {
	l.t.Helper()
	w := &watcher{l: l, ns: l.node(i).ns, addr: map[netip.Addr]bool{}}
	l.do(w.ns, func() (err error) {
		w.sock, err = nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK, unix.RTNLGRP_NEIGH,
			unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE)
		if err == nil {
			err = w.sock.SetReceiveTimeout(&unix.Timeval{Sec: 10})
		}
		return err
	})
	l.t.Cleanup(w.sock.Close)
	// The snapshot is taken after subscribing: nothing falls in between.
	if w.dev = l.state(i).dev; w.dev != nil {
		l.do(w.ns, func() error {
			addrs, err := netlink.AddrList(w.dev, netlink.FAMILY_ALL)
			for _, a := range addrs {
				ip, _ := netip.AddrFromSlice(a.IP)
				w.addr[ip.Unmap()] = true
			}
			return err
		})
	}
	return w
}

// changes returns the notifications, since the watch began or the last
// call, that show a change to weft's routes or device (link attributes,
// addresses other than link-local, permanent neighbour and FDB entries).
// A marker route, added now, tells where "since" ends: the kernel queues
// notifications in order, so everything before the marker's is complete.
func (w *watcher) changes() []string {
	w.l.t.Helper()
	marker := &netlink.Route{Dst: &net.IPNet{IP: net.IPv4(192, 0, 2, 1), Mask: net.CIDRMask(32, 32)},
		Protocol: markerProto, Type: unix.RTN_BLACKHOLE}
	w.l.do(w.ns, func() error { return netlink.RouteAdd(marker) })
	defer w.l.do(w.ns, func() error { return netlink.RouteDel(marker) })
	var seen []string
	for {
		msgs, _, err := w.sock.Receive()
		if err != nil {
			w.l.t.Fatalf("reading notifications: %v", err)
		}
		for _, m := range msgs {
			what, marker := w.classify(m)
			if marker {
				return seen
			}
			if what != "" {
				seen = append(seen, what)
			}
		}
	}
}

// noChanges asserts that nothing weft owns changed since the last look.
func (w *watcher) noChanges(when string) {
	w.l.t.Helper()
	if got := w.changes(); len(got) > 0 {
		w.l.t.Fatalf("%s changed the kernel:\n  %s", when, strings.Join(got, "\n  "))
	}
}

// classify describes m if it shows a change to what weft owns. Two kinds
// of notification the kernel sends on its own, late, for a device weft
// just set up are not changes: the end of IPv6 DAD (an address that was
// there, no longer tentative) and link-watch's operational state updates
// (a link message whose attributes are as they were).
func (w *watcher) classify(m syscall.NetlinkMessage) (what string, marker bool) {
	typ, devIndex := m.Header.Type, 0
	if w.dev != nil {
		devIndex = w.dev.Index
	}
	switch typ {
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		rt := nl.DeserializeRtMsg(m.Data)
		switch {
		case rt.Protocol == markerProto:
			return "", typ == unix.RTM_NEWROUTE
		case rt.Protocol == routing.RouteProtocol:
			return fmt.Sprintf("%s %s/%d", msgName(typ), attrIP(m.Data[unix.SizeofRtMsg:], unix.RTA_DST), rt.Dst_len), false
		}
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		if devIndex != 0 && int(nl.DeserializeIfInfomsg(m.Data).Index) == devIndex {
			l, err := netlink.LinkDeserialize(nil, m.Data)
			if v, ok := l.(*netlink.Vxlan); typ == unix.RTM_NEWLINK && err == nil && ok && sameLink(v, w.dev) {
				return "", false
			}
			return msgName(typ) + " vxlan device", false
		}
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		ifa := nl.DeserializeIfAddrmsg(m.Data)
		ip, _ := netip.AddrFromSlice(attrIP(m.Data[unix.SizeofIfAddrmsg:], unix.IFA_ADDRESS))
		dadDone := typ == unix.RTM_NEWADDR && w.addr[ip.Unmap()] && ifa.Flags&unix.IFA_F_TENTATIVE == 0
		if devIndex != 0 && int(ifa.Index) == devIndex && !ip.IsLinkLocalUnicast() && !dadDone {
			return fmt.Sprintf("%s %s", msgName(typ), ip), false
		}
	case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
		n, err := netlink.NeighDeserialize(m.Data)
		if err == nil && devIndex != 0 && n.LinkIndex == devIndex && n.State&unix.NUD_PERMANENT != 0 {
			return fmt.Sprintf("%s family %d %s %s", msgName(typ), n.Family, n.IP, n.HardwareAddr), false
		}
	}
	return "", false
}

// sameLink compares what Apply sets on the device.
func sameLink(a, b *netlink.Vxlan) bool {
	return a.MTU == b.MTU && a.HardwareAddr.String() == b.HardwareAddr.String() && a.Alias == b.Alias &&
		a.Flags&net.FlagUp == b.Flags&net.FlagUp && a.Learning == b.Learning && a.VxlanId == b.VxlanId &&
		a.Port == b.Port && a.SrcAddr.Equal(b.SrcAddr)
}

func attrIP(b []byte, typ uint16) net.IP {
	attrs, _ := nl.ParseRouteAttr(b)
	for _, a := range attrs {
		if a.Attr.Type == typ {
			return net.IP(a.Value)
		}
	}
	return nil
}

func msgName(typ uint16) string {
	return map[uint16]string{
		unix.RTM_NEWROUTE: "new route", unix.RTM_DELROUTE: "deleted route",
		unix.RTM_NEWLINK: "new link", unix.RTM_DELLINK: "deleted link",
		unix.RTM_NEWADDR: "new address", unix.RTM_DELADDR: "deleted address",
		unix.RTM_NEWNEIGH: "new neighbour/fdb", unix.RTM_DELNEIGH: "deleted neighbour/fdb",
	}[typ]
}
