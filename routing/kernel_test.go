package routing_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/routing"
)

// underlayAddr is node j's address on the underlay v encapsulates or
// routes over for a podCIDR of the family of v6.
func (v variant) underlayAddr(j int, v6 bool) netip.Addr {
	if v.mode == routing.ModeVXLAN {
		v6 = v.ipv6Underlay
	}
	if v6 {
		return nodeIP6(j)
	}
	return nodeIP4(j)
}

// assertProgrammed checks, in the kernel of node i, what v needs to reach
// each of remotes: routes on both families, and for VXLAN the device with
// its MTU derived from the underlay, the neighbours and the FDB entries.
func (l *lab) assertProgrammed(v variant, i int, remotes ...int) nodeState {
	l.t.Helper()
	s := l.state(i)
	if v.mode == routing.ModeHostGW {
		if s.dev != nil {
			l.t.Fatalf("node-%d: vxlan device %s in host-gw mode", i, s.dev.Name)
		}
	} else {
		l.assertDevice(v, i, s.dev)
	}
	if len(s.routes) != 2*len(remotes) {
		l.t.Errorf("node-%d: %d weft routes, want %d: %v", i, len(s.routes), 2*len(remotes), s.routes)
	}
	for _, j := range remotes {
		for _, p := range []netip.Prefix{podCIDR4(j), podCIDR6(j)} {
			r := s.routeTo(p)
			if r == nil {
				l.t.Fatalf("node-%d: no weft route to %s in %v", i, p, s.routes)
			}
			via, onlink := v.underlayAddr(j, p.Addr().Is6()), false
			if v.mode == routing.ModeVXLAN {
				via, onlink = p.Addr(), true
				if r.LinkIndex != s.dev.Index {
					l.t.Errorf("node-%d: route to %s on link %d, not the vxlan device", i, p, r.LinkIndex)
				}
				if !s.hasNeigh(p.Addr(), routing.VTEPMAC(nodeName(j))) {
					l.t.Errorf("node-%d: no neighbour %s -> %s in %v", i, p.Addr(), routing.VTEPMAC(nodeName(j)), s.neighs)
				}
			}
			if !r.Gw.Equal(via.AsSlice()) || (r.Flags&int(netlink.FLAG_ONLINK) != 0) != onlink {
				l.t.Errorf("node-%d: route %s, want via %s onlink=%v", i, r, via, onlink)
			}
		}
		if v.mode == routing.ModeVXLAN && !s.hasFDB(routing.VTEPMAC(nodeName(j)), v.underlayAddr(j, false)) {
			l.t.Errorf("node-%d: no fdb %s dst %s in %v", i, routing.VTEPMAC(nodeName(j)), v.underlayAddr(j, false), s.fdb)
		}
	}
	if v.mode == routing.ModeVXLAN && (len(s.neighs) != 2*len(remotes) || len(s.fdb) != len(remotes)) {
		l.t.Errorf("node-%d: neighbours %v and fdb %v, want exactly those of nodes %v", i, s.neighs, s.fdb, remotes)
	}
	return s
}

func (l *lab) assertDevice(v variant, i int, dev *netlink.Vxlan) {
	l.t.Helper()
	if dev == nil {
		l.t.Fatalf("node-%d: no weft vxlan device", i)
	}
	mtu := underlayMTU - routing.OverheadIPv4
	if v.ipv6Underlay {
		mtu = underlayMTU - routing.OverheadIPv6
	}
	switch {
	case dev.Name != routing.DefaultDevice, dev.VxlanId != routing.DefaultVNI, dev.Port != routing.DefaultPort:
		l.t.Errorf("node-%d: device %s vni %d port %d", i, dev.Name, dev.VxlanId, dev.Port)
	case dev.MTU != mtu:
		l.t.Errorf("node-%d: device MTU %d, want underlay %d - overhead = %d", i, dev.MTU, underlayMTU, mtu)
	case dev.Learning:
		l.t.Errorf("node-%d: device learns", i)
	case !dev.SrcAddr.Equal(v.underlayAddr(i, false).AsSlice()):
		l.t.Errorf("node-%d: device local %s, want %s", i, dev.SrcAddr, v.underlayAddr(i, false))
	case dev.HardwareAddr.String() != routing.VTEPMAC(nodeName(i)).String():
		l.t.Errorf("node-%d: device MAC %s, want %s", i, dev.HardwareAddr, routing.VTEPMAC(nodeName(i)))
	case dev.Flags&net.FlagUp == 0:
		l.t.Errorf("node-%d: device down", i)
	}
}

// TestTraffic: pods on different nodes cannot talk before Apply and can
// after it, over both families, and see each other's own addresses.
func TestTraffic(t *testing.T) {
	eachVariant(t, func(t *testing.T, v variant) {
		l := newLab(t, 3)
		l.serve()
		l.mustNotReach(1, 2, 3)
		l.applyAll(v)
		l.assertProgrammed(v, 1, 2, 3)
		l.assertProgrammed(v, 2, 1, 3)
		l.mustReach(1, 2, 3)
		l.mustReach(3, 1, 2)
	})
}

// TestReapplyChangesNothing: applying the same state again, from the same
// or from a new Reconciler (an agent restart), sends the kernel no change
// at all; a repair after drift does (the watcher sees changes).
func TestReapplyChangesNothing(t *testing.T) {
	eachVariant(t, func(t *testing.T, v variant) {
		l := newLab(t, 3)
		l.applyAll(v)
		s := l.state(1)
		w := l.watch(1)
		l.applyAll(v)
		w.noChanges("re-applying the same state")
		l.node(1).rec = routing.NewReconciler()
		l.apply(v, 1, l.members())
		w.noChanges("applying the same state from a new Reconciler")

		r := s.routeTo(podCIDR4(2))
		l.do(l.node(1).ns, func() error { return netlink.RouteDel(r) })
		l.apply(v, 1, l.members())
		if got := w.changes(); len(got) != 2 {
			t.Fatalf("deleting a route by hand and re-applying: notifications %q, want the deletion and the repair", got)
		}
	})
}

// TestLongLivedConnection: established connections keep working across a
// re-Apply and across an agent restart (new Reconciler on every node).
func TestLongLivedConnection(t *testing.T) {
	eachVariant(t, func(t *testing.T, v variant) {
		l := newLab(t, 3)
		l.serve()
		l.applyAll(v)
		conns := map[bool]*conn{}
		for _, v6 := range []bool{false, true} {
			c, err := l.dial(1, 2, v6, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			conns[v6] = c
			l.mustSay(c, 1, 2, v6, "when opened")
		}
		l.applyAll(v)
		for v6, c := range conns {
			l.mustSay(c, 1, 2, v6, "after a re-Apply")
		}
		for _, nd := range l.nodes {
			nd.rec = routing.NewReconciler()
		}
		l.applyAll(v)
		for v6, c := range conns {
			l.mustSay(c, 1, 2, v6, "after an agent restart")
		}
	})
}

// TestNodeRemoved: a node leaving the cluster loses its route (and, for
// VXLAN, its neighbour and FDB entries) on the others; the rest stays.
func TestNodeRemoved(t *testing.T) {
	eachVariant(t, func(t *testing.T, v variant) {
		l := newLab(t, 3)
		l.serve()
		l.applyAll(v)
		l.mustReach(1, 3)
		for _, i := range []int{1, 2} {
			l.apply(v, i, l.members(3))
		}
		for _, i := range []int{1, 2} {
			s := l.assertProgrammed(v, i, 3-i) // exactly each other's entries
			if s.routeTo(podCIDR4(3)) != nil || s.routeTo(podCIDR6(3)) != nil ||
				s.hasNeigh(podCIDR4(3).Addr(), routing.VTEPMAC(nodeName(3))) ||
				s.hasFDB(routing.VTEPMAC(nodeName(3)), v.underlayAddr(3, false)) {
				t.Fatalf("node-%d still has node-3's entries: %+v", i, s)
			}
		}
		l.mustNotReach(1, 3)
		l.mustReach(1, 2)
	})
}

// TestModeSwitch: vxlan -> host-gw deletes the device (and so its routes,
// neighbours and FDB), host-gw -> vxlan brings it back; pods keep talking
// and an established connection survives both switches.
func TestModeSwitch(t *testing.T) {
	vxlan, hostgw := variants[1], variants[0]
	l := newLab(t, 3)
	l.serve()
	l.applyAll(vxlan)
	c, err := l.dial(1, 2, false, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []variant{hostgw, vxlan, hostgw} {
		l.applyAll(step)
		for _, nd := range l.nodes {
			var others []int
			for _, o := range l.nodes {
				if o != nd {
					others = append(others, o.i)
				}
			}
			l.assertProgrammed(step, nd.i, others...)
		}
		l.mustReach(1, 2, 3)
		l.mustSay(c, 1, 2, false, "after switching to "+step.name)
	}
}
