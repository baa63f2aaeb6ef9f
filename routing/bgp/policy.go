package bgp

import (
	"cmp"
	"net/netip"
	"slices"
)

// ImportPolicy decides which learned paths a node installs.
type ImportPolicy struct {
	// NodeRoutes are the other nodes' podCIDRs with the node's address of
	// the family: such a prefix is installed only with that next hop.
	NodeRoutes map[netip.Prefix]netip.Addr
	// Prefixes are what may be installed from anywhere else.
	Prefixes []netip.Prefix
	// Refused are the cluster's own pod and service CIDRs: nothing inside
	// or around them is installed unless it is a node's podCIDR.
	Refused []netip.Prefix
}

// Accept reports whether a path to prefix via nextHop may be installed.
// A node's podCIDR is accepted only from that node (its next hop), so a
// deleted node's routes are dropped as soon as the node is gone from the
// API, whatever peers still announce. Anything else must not be a default
// route, must not overlap the cluster's pod or service CIDRs, and must lie
// inside the configured import prefixes.
func (p ImportPolicy) Accept(prefix netip.Prefix, nextHop netip.Addr) bool {
	if !prefix.IsValid() || !nextHop.IsValid() || prefix.Addr().Is4() != nextHop.Is4() {
		return false
	}
	if nh, ok := p.NodeRoutes[prefix]; ok {
		return nh == nextHop
	}
	if prefix.Bits() == 0 {
		return false
	}
	for _, r := range p.Refused {
		if r.Overlaps(prefix) {
			return false
		}
	}
	for _, a := range p.Prefixes {
		if a.Bits() <= prefix.Bits() && a.Contains(prefix.Addr()) {
			return true
		}
	}
	return false
}

// changes tells which prefixes n decides differently from p: those whose
// node route was added, removed or moved, or all when the import prefixes
// or the refused ranges changed.
func (p ImportPolicy) changes(n ImportPolicy) (prefixes []netip.Prefix, all bool) {
	if !slices.Equal(p.Prefixes, n.Prefixes) || !slices.Equal(p.Refused, n.Refused) {
		return nil, true
	}
	for dst, nh := range p.NodeRoutes {
		if cur, ok := n.NodeRoutes[dst]; !ok || cur != nh {
			prefixes = append(prefixes, dst)
		}
	}
	for dst := range n.NodeRoutes {
		if _, ok := p.NodeRoutes[dst]; !ok {
			prefixes = append(prefixes, dst)
		}
	}
	return prefixes, false
}

// Candidate is one path of the node's RIB.
type Candidate struct {
	Prefix    netip.Prefix
	NextHop   netip.Addr
	Local     bool       // originated by this node: never installed
	Peer      netip.Addr // the peer it came from
	LocalPref uint32
	ASPathLen int
	Origin    uint8
	MED       uint32
	// Communities the path carries (not used in selection).
	Communities []uint32
}

// Route is one route to install: ECMP when it has several next hops.
type Route struct {
	Dst      netip.Prefix
	NextHops []netip.Addr // sorted, distinct
}

// Select picks, for each prefix, the accepted paths that are best and
// equal (highest local preference, then shortest AS path, lowest origin,
// lowest MED) and returns one route per prefix with all their next hops:
// ECMP across equal peers. Paths the policy refuses take no part, so a
// refused best path never hides an acceptable one. The result is sorted by
// destination.
func Select(paths []Candidate, policy ImportPolicy) []Route {
	best := map[netip.Prefix][]Candidate{}
	for _, c := range paths {
		c.Prefix = c.Prefix.Masked()
		if c.Local || !policy.Accept(c.Prefix, c.NextHop) {
			continue
		}
		cur := best[c.Prefix]
		switch d := len(cur); {
		case d == 0:
			best[c.Prefix] = []Candidate{c}
		case better(c, cur[0]) > 0:
			best[c.Prefix] = []Candidate{c}
		case better(c, cur[0]) == 0:
			best[c.Prefix] = append(cur, c)
		}
	}
	routes := make([]Route, 0, len(best))
	for dst, cs := range best {
		r := Route{Dst: dst}
		for _, c := range cs {
			r.NextHops = append(r.NextHops, c.NextHop)
		}
		slices.SortFunc(r.NextHops, netip.Addr.Compare)
		r.NextHops = slices.Compact(r.NextHops)
		routes = append(routes, r)
	}
	slices.SortFunc(routes, func(a, b Route) int { return comparePrefix(a.Dst, b.Dst) })
	return routes
}

// better is > 0 when a is preferred to b, 0 when they are equal for ECMP.
func better(a, b Candidate) int {
	if c := cmp.Compare(a.LocalPref, b.LocalPref); c != 0 {
		return c
	}
	if c := cmp.Compare(b.ASPathLen, a.ASPathLen); c != 0 {
		return c
	}
	if c := cmp.Compare(b.Origin, a.Origin); c != 0 {
		return c
	}
	return cmp.Compare(b.MED, a.MED)
}
