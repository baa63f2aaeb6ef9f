package routing

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/nlutil"
)

// syncRoutes makes weft's routes in the main table exactly want. A route
// that matches is left alone; one that differs is replaced in place (one
// RTM_NEWROUTE with NLM_F_REPLACE, no gap); a missing one is added without
// NLM_F_REPLACE, so a route another owner holds for the same destination
// is reported, never taken over; weft's routes that are not wanted go.
// links caches device indexes by name; -1 marks a device that could not
// be set up, whose routes are left as they are.
func (s *session) syncRoutes(want []Route, links map[string]int) []error {
	have, err := nlutil.Dump("weft routes", func() ([]netlink.Route, error) {
		return s.h.RouteListFiltered(netlink.FAMILY_ALL,
			&netlink.Route{Protocol: s.proto, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return []error{err}
	}
	byDst := map[netip.Prefix][]netlink.Route{}
	for _, k := range have {
		dst := nlutil.RouteDst(k)
		byDst[dst] = append(byDst[dst], k)
	}
	var errs []error
	for _, w := range want {
		cur := byDst[w.Dst]
		nr, err := s.toNetlink(w, links)
		if err != nil {
			// Keep what is there: a route we cannot express now is no
			// reason to cut the traffic of the one in place.
			delete(byDst, w.Dst)
			errs = append(errs, fmt.Errorf("%s: %w", w, err))
			continue
		}
		i := primary(cur)
		switch {
		case i >= 0 && sameRoute(cur[i], nr):
		case i >= 0:
			err = s.replace(nr, w)
		default:
			err = s.h.RouteAdd(&nr)
			if errors.Is(err, unix.EEXIST) {
				err = fmt.Errorf("the destination has a route weft does not own: %w", err)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", w, err))
		}
		if i >= 0 {
			cur = append(cur[:i:i], cur[i+1:]...)
		}
		byDst[w.Dst] = cur
	}
	for _, stale := range byDst {
		for _, k := range stale {
			if err := s.h.RouteDel(&k); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("deleting stale %s: %w", describe(k), err))
			}
		}
	}
	return errs
}

// replace replaces a route in place. IPv6 refuses an onlink gateway that
// the current routes resolve through another device, which is the case
// when a route moves onto the VXLAN device (host-gw to vxlan): its gateway
// lies in the very prefix the old route sends elsewhere. A /128 route
// pinning the gateway to the device makes the replace acceptable and is
// removed right after; it is weft's, so a crash in between leaves nothing
// the next Apply does not delete.
func (s *session) replace(nr netlink.Route, w Route) error {
	err := s.h.RouteReplace(&nr)
	if !errors.Is(err, unix.EINVAL) || !w.OnLink || !w.Via.Is6() || nr.LinkIndex == 0 {
		return err
	}
	pin := netlink.Route{
		Dst:       &net.IPNet{IP: w.Via.AsSlice(), Mask: net.CIDRMask(128, 128)},
		LinkIndex: nr.LinkIndex, Protocol: s.proto, Table: unix.RT_TABLE_MAIN, Scope: netlink.SCOPE_LINK,
	}
	if perr := s.h.RouteAdd(&pin); perr != nil {
		return fmt.Errorf("%w (pinning the gateway to the device: %w)", err, perr)
	}
	err = s.h.RouteReplace(&nr)
	return errors.Join(err, wrap("removing the gateway pin", s.h.RouteDel(&pin)))
}

// toNetlink renders w, resolving its device (cached in links).
func (s *session) toNetlink(w Route, links map[string]int) (netlink.Route, error) {
	if !w.Dst.IsValid() || !w.Via.IsValid() || w.Dst.Addr().Is4() != w.Via.Is4() {
		return netlink.Route{}, fmt.Errorf("destination and gateway must be addresses of one family: %w", ErrInvalid)
	}
	nr := netlink.Route{
		Dst:      &net.IPNet{IP: w.Dst.Addr().AsSlice(), Mask: net.CIDRMask(w.Dst.Bits(), w.Dst.Addr().BitLen())},
		Gw:       w.Via.AsSlice(),
		Protocol: s.proto,
		Table:    unix.RT_TABLE_MAIN,
	}
	if w.OnLink {
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	if w.Dev != "" {
		index, ok := links[w.Dev]
		if index < 0 {
			return nr, fmt.Errorf("device %s is not usable", w.Dev)
		}
		if !ok {
			l, err := s.h.LinkByName(w.Dev)
			if err != nil {
				return nr, fmt.Errorf("device %s: %w", w.Dev, err)
			}
			index = l.Attrs().Index
			links[w.Dev] = index
		}
		nr.LinkIndex = index
	}
	return nr, nil
}

// primary is the index of the route among rs that a route to the same
// destination from weft would replace: the kernel's default metric.
func primary(rs []netlink.Route) int {
	for i, r := range rs {
		if r.Priority == 0 || r.Family == unix.AF_INET6 && r.Priority == 1024 {
			return i
		}
	}
	return -1
}

// sameRoute reports whether the kernel's route k already is w.
func sameRoute(k, w netlink.Route) bool {
	return k.Gw.Equal(w.Gw) &&
		(w.LinkIndex == 0 || k.LinkIndex == w.LinkIndex) &&
		k.Flags&int(netlink.FLAG_ONLINK) == w.Flags&int(netlink.FLAG_ONLINK) &&
		k.Type == unix.RTN_UNICAST && k.Scope == netlink.SCOPE_UNIVERSE && k.Tos == 0 &&
		len(k.MultiPath) == 0 && k.Src == nil && k.Encap == nil && k.Via == nil
}

func describe(r netlink.Route) string {
	s := fmt.Sprintf("route %s", nlutil.RouteDst(r))
	if r.Gw != nil {
		s += fmt.Sprintf(" via %s", r.Gw)
	}
	return s + fmt.Sprintf(" (link %d, metric %d)", r.LinkIndex, r.Priority)
}
