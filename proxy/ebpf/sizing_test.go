package ebpf

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weftnet/weft/proxy/model"
)

// TestCTMaxFor: a quarter percent of the node's memory in flows, a power
// of two, within bounds.
func TestCTMaxFor(t *testing.T) {
	for _, tc := range []struct {
		mem  uint64
		want int
	}{
		{0, 1 << 16}, {2 << 30, 1 << 16}, {23 << 30, 1 << 18}, {64 << 30, 1 << 19}, {1 << 50, MaxCTMax},
	} {
		if got := CTMaxFor(tc.mem); got != tc.want {
			t.Errorf("CTMaxFor(%d GiB) = %d, want %d", tc.mem>>30, got, tc.want)
		}
	}
}

// TestBadCTMax: a size outside the bounds fails at start, naming the flag.
func TestBadCTMax(t *testing.T) {
	for _, n := range []int{-1, MinCTMax - 1, MaxCTMax + 1} {
		if _, err := New(Config{CTMax: n}); err == nil || !strings.Contains(err.Error(), "--bpf-ct-max") {
			t.Errorf("CTMax %d: %v, want an error naming --bpf-ct-max", n, err)
		}
	}
}

// TestLBMaxFor: one entry of the services map per 4 KiB of the node's
// memory, a power of two within the default bounds.
func TestLBMaxFor(t *testing.T) {
	for _, tc := range []struct {
		mem  uint64
		want int
	}{
		{0, 1 << 19}, {256 << 20, 1 << 19}, {1 << 30, 1 << 19}, {4 << 30, 1 << 20}, {12 << 30, 1 << 21}, {16 << 30, 1 << 22}, {23 << 30, 1 << 22}, {1 << 50, 1 << 22},
	} {
		if got := LBMaxFor(tc.mem); got != tc.want {
			t.Errorf("LBMaxFor(%d MiB) = %d, want %d", tc.mem>>20, got, tc.want)
		}
	}
}

// TestLBCapacities: the services map gets --bpf-lb-map-max, the backends
// and affinity members maps half of it, the source ranges half and the
// Maglev map a 64th, both at least 65,536.
func TestLBCapacities(t *testing.T) {
	for n, want := range map[int]map[string]int{
		1 << 22:  {"weft_services": 1 << 22, "weft_backends": 1 << 21, "weft_affinity_members": 1 << 21, "weft_src_ranges": 1 << 21, "weft_maglev": 1 << 16},
		MinLBMax: {"weft_services": 1 << 10, "weft_backends": 1 << 9, "weft_affinity_members": 1 << 9, "weft_src_ranges": 1 << 16, "weft_maglev": 1 << 16},
		MaxLBMax: {"weft_services": 1 << 26, "weft_backends": 1 << 25, "weft_affinity_members": 1 << 25, "weft_src_ranges": 1 << 25, "weft_maglev": 1 << 20},
	} {
		if got := LBCapacities(n); !maps.Equal(got, want) {
			t.Errorf("LBCapacities(%d) = %v, want %v", n, got, want)
		}
	}
}

// TestBadLBMax: a capacity outside the bounds fails at start, naming the
// flag.
func TestBadLBMax(t *testing.T) {
	for _, n := range []int{-1, MinLBMax - 1, MaxLBMax + 1} {
		if _, err := New(Config{LBMax: n}); err == nil || !strings.Contains(err.Error(), "--bpf-lb-map-max") {
			t.Errorf("LBMax %d: %v, want an error naming --bpf-lb-map-max", n, err)
		}
	}
}

// TestHundredThousandServices: the default capacities of a node of 16 GiB
// hold 100,000 Services of 10 endpoints each (one port, ClientIP
// affinity): as the first sync writes them into empty maps (11 entries of
// the services map a Service), as a restart's full sync compares them (no
// rewrite), and as a sync that changes every list writes each into the
// other half of its slot space (21 entries a Service until the grace
// period after it).
func TestHundredThousandServices(t *testing.T) {
	const services, endpoints = 100_000, 10
	caps := LBCapacities(LBMaxFor(16 << 30))
	want := make(map[FrontendKey]Frontend, services)
	for i := range services {
		k := FrontendKey{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Protocol: model.TCP}
		if i >= 1<<16 {
			k.Addr = netip.AddrFrom4([4]byte{10, 97, byte(i >> 8), byte(i)})
		}
		f := Frontend{AffinitySeconds: 10800, Backends: make([]netip.AddrPort, endpoints)}
		for j := range endpoints {
			e := i*endpoints + j
			f.Backends[j] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(e >> 16), byte(e >> 8), byte(e)}), 8080)
		}
		want[k] = f
	}
	keys := slices.SortedFunc(maps.Keys(want), compareKeys)
	w := newWriter(writerMaps{})
	fits := func(step string, need map[string]int, services int) {
		t.Helper()
		for name, n := range need {
			if n > caps[name] {
				t.Errorf("%s: %s needs %d entries, holds %d", step, name, n, caps[name])
			}
		}
		exact := map[string]int{"weft_services": services, "weft_backends": 1_000_000, "weft_affinity_members": 1_000_000,
			"weft_src_ranges": 0, "weft_maglev": 0}
		if !maps.Equal(need, exact) {
			t.Errorf("%s: needs %v, want %v", step, need, exact)
		}
	}
	// plan gives the new backends an index, which apply forgets when it
	// writes nothing.
	plan := func() applyPlan {
		p := w.plan(want, keys)
		w.dropPending()
		return p
	}
	fits("first sync", plan().need, services*(1+endpoints))
	// The maps as the first sync leaves them: each frontend's list in the
	// first half of its slots.
	for _, k := range keys {
		f := want[k]
		ids := make([]uint32, len(f.Backends))
		for i, ap := range f.Backends {
			ids[i] = w.index(keyOf(ap))
			w.added(ids[i], w.nextBackend+1)
		}
		w.nextFront++
		st := &frontendState{id: w.nextFront, affinity: uint32(f.AffinitySeconds), backends: ids, used: [2]uint16{endpoints, 0}}
		w.fronts[k] = st
		w.ref(nil, ids)
		w.tally.add(k, st, 1)
	}
	// A restart reads that back: its full sync compares, rewrites nothing.
	fits("a full sync after a restart", plan().need, services*(1+endpoints))
	// Every list in another order: every frontend rewritten.
	for k, f := range want {
		f.Backends = slices.Clone(f.Backends)
		slices.Reverse(f.Backends)
		want[k] = f
	}
	fits("every list changed", plan().need, services*(1+2*endpoints))
}

// TestPlanRemovalsFirst: apply removes before it adds, so a Service
// replaced by another in one sync needs room for one of them, and a
// backend the new one names again is kept, not counted twice.
func TestPlanRemovalsFirst(t *testing.T) {
	w := newWriter(writerMaps{})
	a := FrontendKey{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: model.TCP}
	b := FrontendKey{Addr: netip.MustParseAddr("10.96.0.2"), Port: 80, Protocol: model.TCP}
	be := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(i)}), 80)
	}
	var ids []uint32
	for i := 1; i <= 3; i++ {
		x := w.index(keyOf(be(i)))
		w.added(x, uint32(i))
		ids = append(ids, x)
	}
	w.nextBackend = 3
	st := &frontendState{id: 1, backends: ids, used: [2]uint16{3, 3}}
	w.fronts[a] = st
	w.ref(nil, ids)
	w.tally.add(a, st, 1)
	want := map[FrontendKey]Frontend{b: {Backends: []netip.AddrPort{be(3), be(4)}}}
	p := w.plan(want, []FrontendKey{a, b})
	if got := (map[string]int{"weft_services": 3, "weft_backends": 2}); p.need["weft_services"] != got["weft_services"] || p.need["weft_backends"] != got["weft_backends"] {
		t.Errorf("a's 7 entries and 3 backends replaced by b's 3 and 2 (one of them a's): needs %v, want %v", p.need, got)
	}
	if freed := w.ids(p.freed); !slices.Equal(freed, []uint32{1, 2}) {
		t.Errorf("freed before the additions: %v, want a's backends b does not name (1, 2)", freed)
	}
}

// TestCapacityError: the error names the map, what it needs and holds,
// and the flag that sets it.
func TestCapacityError(t *testing.T) {
	err := error(&CapacityError{Map: "weft_backends", Needed: 1_200_000, Capacity: 1 << 20, LBMax: 1 << 21})
	for _, want := range []string{"weft_backends", "1200000", "1048576", "half of --bpf-lb-map-max 2097152", "raise --bpf-lb-map-max"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}
