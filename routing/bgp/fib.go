package bgp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/nlutil"
)

// RouteProtocol marks the routes BGP installs (`ip route show proto 0x58`):
// distinct from host-gw's and VXLAN's (routing.RouteProtocol, 0x57), so
// neither mode's reconciler touches the other's routes, and from the
// kernel's RTPROT_BGP (186), which BIRD or FRR on the node may use.
const RouteProtocol = 0x58

// FIB installs routes in the main table of the calling thread's network
// namespace under RouteProtocol, and only touches routes of that protocol.
type FIB struct {
	Proto netlink.RouteProtocol // RouteProtocol if zero
}

func (f FIB) proto() netlink.RouteProtocol {
	if f.Proto == 0 {
		return RouteProtocol
	}
	return f.Proto
}

// Sync makes the owned routes match want (next hops not on a link of the
// node resolved to the gateway towards them): it adds what is missing,
// replaces in place what differs (no gap), leaves what matches untouched
// and, when prune is set, deletes owned routes to other destinations. An
// agent starting up syncs without prune until its peers have sent their
// routes, so the routes a previous run installed keep forwarding. Every
// failure is returned, joined, naming the route.
func (f FIB) Sync(want []Route, prune bool) error {
	h, err := openNetlink()
	if err != nil {
		return err
	}
	defer h.Close()
	have, err := f.list(h)
	if err != nil {
		return err
	}
	var errs []error
	gws := gateways{}
	for _, w := range want {
		cur := have[w.Dst]
		delete(have, w.Dst)
		errs = append(errs, f.replace(h, gws, w, cur))
	}
	if prune {
		for dst, k := range have {
			for i := range k.routes {
				if err := h.RouteDel(&k.routes[i]); err != nil && !errors.Is(err, unix.ESRCH) {
					errs = append(errs, fmt.Errorf("deleting stale route %s: %w", dst, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Update replaces the routes set and deletes the owned routes to del,
// without reading the kernel's table: the controller calls it with what
// changed since its last Sync, which is what keeps a change on a node with
// a thousand routes as cheap as on a node with ten. Every failure is
// returned, joined, naming the route.
func (f FIB) Update(set []Route, del []netip.Prefix) error {
	if len(set) == 0 && len(del) == 0 {
		return nil
	}
	h, err := openNetlink()
	if err != nil {
		return err
	}
	defer h.Close()
	var errs []error
	gws := gateways{}
	for _, w := range set {
		errs = append(errs, f.replace(h, gws, w, nil))
	}
	for _, dst := range del {
		// The protocol is part of the match: only weft's BGP route goes.
		nr := f.toNetlink(Route{Dst: dst})
		if err := h.RouteDel(&nr); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("deleting route %s: %w", dst, err))
		}
	}
	return errors.Join(errs...)
}

// replace writes route w, its next hops resolved to gateways, unless cur
// (what the kernel holds for its destination, if known) already matches.
func (f FIB) replace(h *netlink.Handle, gws gateways, w Route, cur *kernelRoute) error {
	hops, err := gws.resolve(h, w.NextHops)
	if err == nil {
		if cur != nil && slices.Equal(cur.hops, hops) {
			return nil
		}
		w.NextHops = hops
		nr := f.toNetlink(w)
		err = h.RouteReplace(&nr)
	}
	if err != nil {
		return fmt.Errorf("route %s via %v: %w", w.Dst, w.NextHops, err)
	}
	return nil
}

func openNetlink() (*netlink.Handle, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	return h, nil
}

// Cleanup deletes every owned route (weft-agent --cleanup).
func (f FIB) Cleanup() error { return f.Sync(nil, true) }

// List returns the owned routes as Routes (for tests and status).
func (f FIB) List() ([]Route, error) {
	h, err := openNetlink()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	have, err := f.list(h)
	if err != nil {
		return nil, err
	}
	out := make([]Route, 0, len(have))
	for dst, k := range have {
		out = append(out, Route{Dst: dst, NextHops: k.hops})
	}
	slices.SortFunc(out, func(a, b Route) int { return comparePrefix(a.Dst, b.Dst) })
	return out, nil
}

// kernelRoute is what the kernel holds for one destination: one multipath
// route, or (IPv6 on some kernels) one route per next hop.
type kernelRoute struct {
	routes []netlink.Route
	hops   []netip.Addr // sorted
}

func (f FIB) list(h *netlink.Handle) (map[netip.Prefix]*kernelRoute, error) {
	rs, err := nlutil.Dump("bgp routes", func() ([]netlink.Route, error) {
		return h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: f.proto(), Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return nil, err
	}
	out := map[netip.Prefix]*kernelRoute{}
	for _, r := range rs {
		dst := nlutil.RouteDst(r)
		k := out[dst]
		if k == nil {
			k = &kernelRoute{}
			out[dst] = k
		}
		k.routes = append(k.routes, r)
		if len(r.MultiPath) > 0 {
			for _, nh := range r.MultiPath {
				k.hops = appendAddr(k.hops, nh.Gw)
			}
		} else {
			k.hops = appendAddr(k.hops, r.Gw)
		}
	}
	for _, k := range out {
		slices.SortFunc(k.hops, netip.Addr.Compare)
		// A route that is not a plain unicast route through gateways
		// (say, changed by hand) never equals a wanted one.
		for _, r := range k.routes {
			if r.Type != unix.RTN_UNICAST || r.Encap != nil || r.Src != nil {
				k.hops = nil
			}
		}
	}
	return out, nil
}

func appendAddr(list []netip.Addr, ip net.IP) []netip.Addr {
	if a, ok := netip.AddrFromSlice(ip); ok {
		return append(list, a.Unmap())
	}
	return list
}

func (f FIB) toNetlink(w Route) netlink.Route {
	nr := netlink.Route{
		Dst:      &net.IPNet{IP: w.Dst.Addr().AsSlice(), Mask: net.CIDRMask(w.Dst.Bits(), w.Dst.Addr().BitLen())},
		Protocol: f.proto(),
		Table:    unix.RT_TABLE_MAIN,
	}
	switch len(w.NextHops) {
	case 0: // a deletion: matched on destination, protocol and table
	case 1:
		nr.Gw = w.NextHops[0].AsSlice()
	default:
		for _, nh := range w.NextHops {
			nr.MultiPath = append(nr.MultiPath, &netlink.NexthopInfo{Gw: nh.AsSlice()})
		}
	}
	return nr
}

// gateways remembers, for one Sync, the gateway each next hop resolved
// to: a thousand routes share a few next hops (the nodes, a ToR), and each
// lookup is a netlink round trip.
type gateways map[netip.Addr]netip.Addr

// resolve turns next hops that are not on a link of the node into the
// gateways the kernel reaches them through: a node in another rack is
// announced with its own address as next hop (iBGP keeps it), which the
// kernel refuses as a gateway unless it is on-link; the route then goes
// via the router towards it, as a routing daemon's recursive next hops do.
// The result is sorted and distinct.
func (gws gateways) resolve(h *netlink.Handle, hops []netip.Addr) ([]netip.Addr, error) {
	var out []netip.Addr
	var errs []error
	for _, nh := range hops {
		if gw, ok := gws[nh]; ok {
			out = append(out, gw)
			continue
		}
		rs, err := h.RouteGet(nh.AsSlice())
		if err != nil || len(rs) == 0 {
			errs = append(errs, fmt.Errorf("next hop %s is unreachable: %w", nh, err))
			continue
		}
		gw := nh
		if a, ok := netip.AddrFromSlice(rs[0].Gw); ok && rs[0].Gw != nil {
			gw = a.Unmap()
		}
		gws[nh] = gw
		out = append(out, gw)
	}
	if len(out) == 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), nil
}
