package routing_test

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/routing"
)

// foreign is state in node-1 that weft does not own: another protocol's
// route, another VXLAN device with a permanent FDB and neighbour entry, and
// a permanent neighbour on the underlay link.
type foreign struct {
	route      netlink.Route
	dev        string
	fdbMAC     net.HardwareAddr
	neighIP    net.IP
	underlayIP net.IP
}

func (l *lab) addForeign() foreign {
	l.t.Helper()
	f := foreign{
		route: netlink.Route{Dst: &net.IPNet{IP: net.IPv4(198, 51, 100, 0), Mask: net.CIDRMask(24, 32)},
			Gw: net.IPv4(172, 18, 0, 99), Protocol: unix.RTPROT_STATIC},
		dev: "other.vxlan", fdbMAC: mac("02:00:00:00:00:42"),
		neighIP: net.IPv4(192, 168, 42, 1), underlayIP: net.IPv4(172, 18, 0, 98),
	}
	l.do(l.node(1).ns, func() error {
		if err := netlink.RouteAdd(&f.route); err != nil {
			return err
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = f.dev
		vx := &netlink.Vxlan{LinkAttrs: attrs, VxlanId: 42, Port: 4789, Learning: true}
		if err := netlink.LinkAdd(vx); err != nil {
			return err
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, n := range []*netlink.Neigh{
			{LinkIndex: vx.Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: unix.NUD_PERMANENT, HardwareAddr: f.fdbMAC, IP: net.IPv4(172, 18, 0, 99)},
			{LinkIndex: vx.Index, State: unix.NUD_PERMANENT, HardwareAddr: f.fdbMAC, IP: f.neighIP},
			{LinkIndex: eth0.Attrs().Index, State: unix.NUD_PERMANENT, HardwareAddr: f.fdbMAC, IP: f.underlayIP},
		} {
			if err := netlink.NeighAdd(n); err != nil {
				return err
			}
		}
		return nil
	})
	return f
}

// assertForeign checks that all of f is still in node-1, unchanged.
func (l *lab) assertForeign(f foreign, when string) {
	l.t.Helper()
	l.do(l.node(1).ns, func() error {
		rs, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Dst: f.route.Dst}, netlink.RT_FILTER_DST)
		if err != nil || len(rs) != 1 || rs[0].Protocol != unix.RTPROT_STATIC || !rs[0].Gw.Equal(f.route.Gw) {
			l.t.Errorf("%s: foreign route %s is %v (%v)", when, f.route.Dst, rs, err)
		}
		dev, err := netlink.LinkByName(f.dev)
		if err != nil {
			l.t.Fatalf("%s: foreign vxlan device: %v", when, err)
		}
		eth0, _ := netlink.LinkByName("eth0")
		for _, c := range []struct {
			index, family int
			ip            net.IP
		}{{dev.Attrs().Index, unix.AF_BRIDGE, net.IPv4(172, 18, 0, 99)}, {dev.Attrs().Index, unix.AF_INET, f.neighIP}, {eth0.Attrs().Index, unix.AF_INET, f.underlayIP}} {
			ns, _ := permanent(c.index, c.family)
			found := false
			for _, n := range ns {
				found = found || n.IP.Equal(c.ip) && n.HardwareAddr.String() == f.fdbMAC.String()
			}
			if !found {
				l.t.Errorf("%s: foreign entry %s -> %s (family %d) gone: %v", when, f.fdbMAC, c.ip, c.family, ns)
			}
		}
		return nil
	})
}

// TestForeignStateSurvives: Apply and Cleanup leave others' routes,
// devices, FDB and neighbour entries alone; Cleanup removes all of weft's
// and nothing else, and is idempotent.
func TestForeignStateSurvives(t *testing.T) {
	eachVariant(t, func(t *testing.T, v variant) {
		l := newLab(t, 3)
		l.serve()
		f := l.addForeign()
		l.applyAll(v)
		l.assertForeign(f, "after Apply")
		l.mustReach(1, 2, 3)
		for range 2 {
			for _, nd := range l.nodes {
				l.do(nd.ns, nd.rec.Cleanup)
				if s := l.state(nd.i); len(s.routes) > 0 || s.dev != nil {
					t.Fatalf("node-%d after Cleanup: routes %v, device %v", nd.i, s.routes, s.dev)
				}
			}
			l.assertForeign(f, "after Cleanup")
		}
		l.mustNotReach(1, 2)
	})
}

// TestForeignRouteNotTakenOver: a destination weft wants but another owner
// routes is reported, naming the route, and left alone; the other nodes'
// routes are programmed regardless.
func TestForeignRouteNotTakenOver(t *testing.T) {
	eachVariant(t, func(t *testing.T, v variant) {
		l := newLab(t, 3)
		l.serve()
		theirs := &netlink.Route{Dst: &net.IPNet{IP: podCIDR4(3).Addr().AsSlice(), Mask: net.CIDRMask(24, 32)},
			Gw: net.IPv4(172, 18, 0, 99), Protocol: unix.RTPROT_STATIC}
		l.do(l.node(1).ns, func() error { return netlink.RouteAdd(theirs) })
		d, _ := routing.Compute(v.config(1), l.members())
		var err error
		l.do(l.node(1).ns, func() error { err = routing.NewReconciler().Apply(d); return nil })
		if !errors.Is(err, unix.EEXIST) || !strings.Contains(err.Error(), "route "+podCIDR4(3).String()) {
			t.Fatalf("Apply with a foreign route on %s: %v", podCIDR4(3), err)
		}
		l.do(l.node(1).ns, func() error {
			rs, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Dst: theirs.Dst}, netlink.RT_FILTER_DST)
			if err != nil || len(rs) != 1 || rs[0].Protocol != unix.RTPROT_STATIC || !rs[0].Gw.Equal(theirs.Gw) {
				t.Errorf("the foreign route was touched: %v (%v)", rs, err)
			}
			return nil
		})
		for _, i := range []int{2, 3} {
			l.apply(v, i, l.members())
		}
		l.mustReach(1, 2) // node-2's routes went in despite node-3's failure
	})
}

// TestDriftRepair: whatever of weft's state is changed by hand, Apply puts
// back, fixing the device in place (same ifindex).
func TestDriftRepair(t *testing.T) {
	eachVariant(t, func(t *testing.T, v variant) {
		l := newLab(t, 3)
		l.serve()
		l.applyAll(v)
		before := l.state(1)
		l.do(l.node(1).ns, func() error {
			errs := []error{netlink.RouteDel(before.routeTo(podCIDR4(2))), netlink.RouteDel(before.routeTo(podCIDR6(2)))}
			if dev := before.dev; dev != nil {
				for _, n := range append(before.neighs[:1:1], before.fdb[0]) {
					errs = append(errs, netlink.NeighDel(&n))
				}
				a := &netlink.Addr{IPNet: &net.IPNet{IP: host(podCIDR4(1), 0).AsSlice(), Mask: net.CIDRMask(32, 32)}}
				errs = append(errs, netlink.AddrDel(dev, a), netlink.LinkSetMTU(dev, 1280),
					netlink.LinkSetHardwareAddr(dev, mac("02:00:00:00:00:99")), routing.SetLearning(dev.Index, true),
					netlink.LinkSetDown(dev))
			}
			return errors.Join(errs...)
		})
		// (Setting the device down also made the kernel drop its routes.)
		if s := l.state(1); s.routeTo(podCIDR4(2)) != nil || s.routeTo(podCIDR6(2)) != nil {
			t.Fatalf("drift not in place: %v", s.routes)
		} else if d := s.dev; d != nil && (!d.Learning || d.MTU != 1280 || d.Flags&net.FlagUp != 0) {
			t.Fatalf("device drift not in place: learning %v, mtu %d, flags %v", d.Learning, d.MTU, d.Flags)
		}
		l.mustNotReach(1, 2)
		l.apply(v, 1, l.members())
		after := l.assertProgrammed(v, 1, 2, 3)
		if v.mode == routing.ModeVXLAN {
			if after.dev.Index != before.dev.Index {
				t.Errorf("device recreated (index %d -> %d), want it fixed in place", before.dev.Index, after.dev.Index)
			}
			l.do(l.node(1).ns, func() error {
				addrs, err := netlink.AddrList(after.dev, unix.AF_INET)
				if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != netip.PrefixFrom(podCIDR4(1).Addr(), 32).String() {
					t.Errorf("device addresses %v (%v), want %s/32", addrs, err, podCIDR4(1).Addr())
				}
				return nil
			})
		}
		l.mustReach(1, 2, 3)
	})
}
