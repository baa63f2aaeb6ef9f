package routing_test

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/nlutil"
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
		s.routes, err = nlutil.Dump("routes", func() ([]netlink.Route, error) {
			return netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: routing.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		})
		if err != nil {
			return err
		}
		links, err := nlutil.Dump("links", netlink.LinkList)
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
		ns, err := nlutil.Dump("neighbours", func() ([]netlink.Neigh, error) { return netlink.NeighList(index, f) })
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
