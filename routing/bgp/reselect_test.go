package bgp

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// TestIncrementalEqualsFull drives the controller's incremental path (paths
// sent and lost by peers applied to its copy of the RIB, the import policy
// changed: reselect only the prefixes these name) through random steps and
// checks after each that what it keeps installed is exactly what a full
// Select of the true RIB gives.
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
	// A peer's path: peers are the hops, and some announce another
	// next hop (a router passing on a route).
	randomChange := func() PathChange {
		p, peer := prefixes[rng.IntN(len(prefixes))], hops[rng.IntN(len(hops))]
		ch := PathChange{Prefix: p, Peer: peer}
		if rng.IntN(3) > 0 {
			ch.Path = &Candidate{Prefix: p, Peer: peer, NextHop: hops[rng.IntN(len(hops))], LocalPref: 100,
				ASPathLen: rng.IntN(2)}
		}
		return ch
	}
	// truth is the RIB as gobgp holds it: a path per prefix and peer.
	truth := map[netip.Prefix]map[netip.Addr]Candidate{}
	apply := func(ch PathChange) {
		if truth[ch.Prefix] == nil {
			truth[ch.Prefix] = map[netip.Addr]Candidate{}
		}
		if ch.Path == nil {
			delete(truth[ch.Prefix], ch.Peer)
		} else {
			truth[ch.Prefix][ch.Peer] = *ch.Path
		}
	}
	listing := func() []Candidate {
		var out []Candidate
		for _, byPeer := range truth {
			for _, c := range byPeer {
				out = append(out, c)
			}
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

	for range 60 {
		apply(randomChange())
	}
	// The controller's full sync: its copy from a listing.
	rib := map[netip.Prefix][]Candidate{}
	addPaths(rib, listing())
	policy := randomPolicy()
	installed := map[netip.Prefix][]netip.Addr{}
	for _, r := range Select(listing(), policy) {
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
				ch := randomChange()
				apply(ch)
				applyChange(rib, ch)
				dirty = append(dirty, ch.Prefix)
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

		want := Select(listing(), policy)
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

// TestNLRIPrefix: both families' unicast NLRI give their prefix without
// formatting, and another NLRI through its text.
func TestNLRIPrefix(t *testing.T) {
	for _, want := range []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")} {
		n, err := bgp.NewIPAddrPrefix(want)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := nlriPrefix(n); !ok || got != want {
			t.Errorf("nlriPrefix(%s) = %s, %v", want, got, ok)
		}
	}
	if _, ok := nlriPrefix(bgp.NewEVPNNLRI(bgp.EVPN_ROUTE_TYPE_ETHERNET_AUTO_DISCOVERY, nil)); ok {
		t.Error("an EVPN NLRI read as a prefix")
	}
}
