package bgp

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// TestIncrementalEqualsFull drives the controller's incremental path (paths
// of a few prefixes changed, the import policy changed: reselect only what
// changes names) through random steps and checks after each that what it
// keeps installed is exactly what a full Select of the whole RIB gives.
func TestIncrementalEqualsFull(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := make([]netip.Prefix, 24)
	for i := range prefixes {
		prefixes[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i % 3), byte(i), 0}), 24)
	}
	hops := []netip.Addr{
		netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"),
		netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.4"),
	}
	randomPaths := func(p netip.Prefix) []Candidate {
		var out []Candidate
		for range rng.IntN(4) {
			out = append(out, Candidate{Prefix: p, NextHop: hops[rng.IntN(len(hops))], LocalPref: 100,
				ASPathLen: rng.IntN(2), Local: rng.IntN(8) == 0})
		}
		return out
	}
	randomPolicy := func() ImportPolicy {
		pol := ImportPolicy{NodeRoutes: map[netip.Prefix]netip.Addr{}}
		for _, p := range prefixes {
			if rng.IntN(3) == 0 {
				pol.NodeRoutes[p] = hops[rng.IntN(len(hops))]
			}
		}
		for i := range 3 {
			if rng.IntN(2) == 0 {
				pol.Prefixes = append(pol.Prefixes, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16))
			}
		}
		if rng.IntN(3) == 0 {
			pol.Refused = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
		}
		return pol
	}
	// A policy change that only moves node routes (the common case: a
	// Node added, deleted or given a podCIDR) keeps the prefix lists.
	moveNodeRoutes := func(pol ImportPolicy) ImportPolicy {
		n := ImportPolicy{NodeRoutes: map[netip.Prefix]netip.Addr{}, Prefixes: pol.Prefixes, Refused: pol.Refused}
		for p, nh := range pol.NodeRoutes {
			if rng.IntN(4) > 0 {
				n.NodeRoutes[p] = nh
			}
		}
		p := prefixes[rng.IntN(len(prefixes))]
		n.NodeRoutes[p] = hops[rng.IntN(len(hops))]
		return n
	}

	rib := map[netip.Prefix][]Candidate{}
	for _, p := range prefixes {
		addPaths(rib, randomPaths(p))
	}
	policy := randomPolicy()
	installed := map[netip.Prefix][]netip.Addr{}
	var all []Candidate
	for _, cs := range rib {
		all = append(all, cs...)
	}
	for _, r := range Select(all, policy) {
		installed[r.Dst] = r.NextHops
	}
	for step := range 2000 {
		var dirty []netip.Prefix
		next := policy
		switch rng.IntN(4) {
		case 0:
			next = randomPolicy()
		case 1:
			next = moveNodeRoutes(policy)
		default:
			for range 1 + rng.IntN(3) {
				p := prefixes[rng.IntN(len(prefixes))]
				delete(rib, p)
				addPaths(rib, randomPaths(p))
				dirty = append(dirty, p)
			}
		}
		check, everything := policy.changes(next)
		check = append(check, dirty...)
		if everything {
			for p := range rib {
				check = append(check, p)
			}
			for p := range installed {
				check = append(check, p)
			}
		}
		before := map[netip.Prefix][]netip.Addr{}
		for p, nh := range installed {
			before[p] = nh
		}
		set, del := reselect(rib, installed, check, next)
		policy = next

		all = all[:0]
		for _, cs := range rib {
			all = append(all, cs...)
		}
		want := Select(all, policy)
		if len(want) != len(installed) {
			t.Fatalf("step %d: %d routes installed, a full select gives %d", step, len(installed), len(want))
		}
		for _, r := range want {
			if !slices.Equal(installed[r.Dst], r.NextHops) {
				t.Fatalf("step %d: %s installed via %v, a full select gives %v", step, r.Dst, installed[r.Dst], r.NextHops)
			}
		}
		// What reselect returned is exactly the difference.
		for _, r := range set {
			if slices.Equal(before[r.Dst], r.NextHops) {
				t.Fatalf("step %d: %s rewritten unchanged", step, r.Dst)
			}
			delete(before, r.Dst)
		}
		for _, p := range del {
			if _, ok := before[p]; !ok {
				t.Fatalf("step %d: %s deleted but was not installed", step, p)
			}
			delete(before, p)
		}
		for p, nh := range before {
			if !slices.Equal(installed[p], nh) {
				t.Fatalf("step %d: %s changed without being written", step, p)
			}
		}
	}
}
