package routing_test

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/routing"
)

// nodeState is what weft owns in one node, read back from the kernel.
type nodeState struct {
	routes []netlink.Route
	dev    *netlink.Vxlan // nil when there is none
	neighs []netlink.Neigh
	fdb    []netlink.Neigh
}

func (l *lab) state(i int) nodeState {
	l.t.Helper()
	var s nodeState
	l.do(l.node(i).ns, func() (err error) {
		s.routes, err = netlink.RouteListFiltered(netlink.FAMILY_ALL,
			&netlink.Route{Protocol: routing.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return err
		}
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, lk := range links {
			if v, ok := lk.(*netlink.Vxlan); ok && v.Alias == routing.DeviceAlias {
				if s.dev != nil {
					return fmt.Errorf("two weft devices: %s and %s", s.dev.Name, v.Name)
				}
				s.dev = v
			}
		}
		if s.dev == nil {
			return nil
		}
		s.neighs, err = permanent(s.dev.Index, unix.AF_INET, unix.AF_INET6)
		if err == nil {
			s.fdb, err = permanent(s.dev.Index, unix.AF_BRIDGE)
		}
		return err
	})
	return s
}

func permanent(index int, families ...int) ([]netlink.Neigh, error) {
	var out []netlink.Neigh
	for _, f := range families {
		ns, err := netlink.NeighList(index, f)
		if err != nil {
			return nil, err
		}
		for _, n := range ns {
			if n.State&unix.NUD_PERMANENT != 0 {
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// routeTo is weft's route to dst, or nil.
func (s nodeState) routeTo(dst netip.Prefix) *netlink.Route {
	for i, r := range s.routes {
		if r.Dst != nil && r.Dst.String() == dst.String() {
			return &s.routes[i]
		}
	}
	return nil
}

func (s nodeState) hasNeigh(ip netip.Addr, mac net.HardwareAddr) bool {
	return slices.ContainsFunc(s.neighs, func(n netlink.Neigh) bool {
		return n.IP.Equal(ip.AsSlice()) && n.HardwareAddr.String() == mac.String()
	})
}

func (s nodeState) hasFDB(mac net.HardwareAddr, dst netip.Addr) bool {
	return slices.ContainsFunc(s.fdb, func(n netlink.Neigh) bool {
		return n.IP.Equal(dst.AsSlice()) && n.HardwareAddr.String() == mac.String()
	})
}

// watcher records the rtnetlink notifications of one namespace, to prove
// that an Apply changed nothing weft owns.
type watcher struct {
	l    *lab
	ns   string
	sock *nl.NetlinkSocket
}

const markerProto = 0x58 // a route protocol only the watcher uses

func (l *lab) watch(i int) *watcher {
	l.t.Helper()
	w := &watcher{l: l, ns: l.node(i).ns}
	l.do(w.ns, func() (err error) {
		w.sock, err = nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK, unix.RTNLGRP_NEIGH,
			unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE)
		if err == nil {
			err = w.sock.SetReceiveTimeout(&unix.Timeval{Sec: 10})
		}
		return err
	})
	l.t.Cleanup(w.sock.Close)
	return w
}

// changes returns the notifications about weft's routes, and about the
// device at devIndex (link, addresses other than link-local, permanent
// neighbour and FDB entries) since the watch began or the last call. A
// marker route, added after the fact, tells where "since" ends: the kernel
// queues notifications in order, so everything before it is complete.
func (w *watcher) changes(devIndex int) []string {
	w.l.t.Helper()
	marker := &netlink.Route{Dst: &net.IPNet{IP: net.IPv4(192, 0, 2, 1), Mask: net.CIDRMask(32, 32)},
		Protocol: markerProto, Type: unix.RTN_BLACKHOLE}
	w.l.do(w.ns, func() error { return netlink.RouteAdd(marker) })
	var seen []string
	for {
		msgs, _, err := w.sock.Receive()
		if err != nil {
			w.l.t.Fatalf("reading notifications: %v", err)
		}
		for _, m := range msgs {
			what, done := classify(m, devIndex)
			if done {
				w.l.do(w.ns, func() error { return netlink.RouteDel(marker) })
				w.drain()
				return seen
			}
			if what != "" {
				seen = append(seen, what)
			}
		}
	}
}

// drain reads the marker's own deletion notice.
func (w *watcher) drain() {
	for {
		msgs, _, err := w.sock.Receive()
		if err != nil {
			w.l.t.Fatalf("reading notifications: %v", err)
		}
		for _, m := range msgs {
			if m.Header.Type == unix.RTM_DELROUTE && nl.DeserializeRtMsg(m.Data).Protocol == markerProto {
				return
			}
		}
	}
}

func classify(m syscall.NetlinkMessage, devIndex int) (what string, marker bool) {
	typ := m.Header.Type
	switch typ {
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		rt := nl.DeserializeRtMsg(m.Data)
		if rt.Protocol == markerProto {
			return "", typ == unix.RTM_NEWROUTE
		}
		if rt.Protocol == routing.RouteProtocol {
			return fmt.Sprintf("%s %s/%d", msgName(typ), attrIP(m.Data[unix.SizeofRtMsg:], unix.RTA_DST), rt.Dst_len), false
		}
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		if devIndex != 0 && int(nl.DeserializeIfInfomsg(m.Data).Index) == devIndex {
			return msgName(typ) + " vxlan device", false
		}
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		ifa := nl.DeserializeIfAddrmsg(m.Data)
		ip := attrIP(m.Data[unix.SizeofIfAddrmsg:], unix.IFA_ADDRESS)
		if devIndex != 0 && int(ifa.Index) == devIndex && !ip.IsLinkLocalUnicast() {
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
	names := map[uint16]string{
		unix.RTM_NEWROUTE: "new route", unix.RTM_DELROUTE: "deleted route",
		unix.RTM_NEWLINK: "new link", unix.RTM_DELLINK: "deleted link",
		unix.RTM_NEWADDR: "new address", unix.RTM_DELADDR: "deleted address",
		unix.RTM_NEWNEIGH: "new neighbour/fdb", unix.RTM_DELNEIGH: "deleted neighbour/fdb",
	}
	return names[typ]
}

// noChanges asserts that nothing weft owns changed since the last look.
func (w *watcher) noChanges(devIndex int, when string) {
	w.l.t.Helper()
	if got := w.changes(devIndex); len(got) > 0 {
		w.l.t.Fatalf("%s changed the kernel:\n  %s", when, strings.Join(got, "\n  "))
	}
}
