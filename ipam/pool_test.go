package ipam_test

import (
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"testing"

	"github.com/weftnet/weft/ipam"
)

func TestFree(t *testing.T) {
	p := mustPool(t,
		ipam.RangeSet{sub("10.244.1.0/24"), sub("10.244.2.0/29")},
		ipam.RangeSet{sub("fd00:1::/64")},
		ipam.RangeSet{sub("fd00:2::/48")},
		ipam.RangeSet{sub("2001:db8::/32")},
	)
	st := ipam.NewState()
	want := []uint64{253 + 5, 1<<64 - 2, math.MaxUint64, math.MaxUint64}
	if got := p.Free(st); !reflect.DeepEqual(got, want) {
		t.Errorf("Free = %v, want %v", got, want)
	}
	for i := range 3 {
		alloc(t, p, st, fmt.Sprint("c", i))
	}
	// An allocation outside the pool (stale config) counts nowhere.
	st.Allocations = append(st.Allocations, ipam.Allocation{Key: key("stale"), Addresses: []netip.Addr{addr("192.0.2.9")}})
	want = []uint64{253 + 5 - 3, 1<<64 - 2 - 3, math.MaxUint64, math.MaxUint64}
	if got := p.Free(st); !reflect.DeepEqual(got, want) {
		t.Errorf("Free = %v, want %v", got, want)
	}
}

func TestConfigChangeReallocates(t *testing.T) {
	old := mustPool(t, ipam.RangeSet{sub("10.0.0.0/24")})
	st := ipam.NewState()
	alloc(t, old, st, "pod")
	v4 := alloc(t, old, st, "pod2")[0]

	moved := mustPool(t, ipam.RangeSet{sub("10.1.0.0/24")})
	if _, ok := moved.Lookup(st, key("pod")); ok {
		t.Error("Lookup accepted an address outside the pool")
	}
	if got := alloc(t, moved, st, "pod")[0]; got != addr("10.1.0.2") {
		t.Errorf("re-allocated %s, want 10.1.0.2", got)
	}
	if n := len(st.Keys()); n != 2 {
		t.Errorf("%d keys, want 2", n)
	}

	// Adding an IPv6 set keeps the still-valid IPv4 address.
	dual := mustPool(t, ipam.RangeSet{sub("10.0.0.0/24")}, ipam.RangeSet{sub("fd00::/64")})
	if _, ok := dual.Lookup(st, key("pod2")); ok {
		t.Error("Lookup accepted an allocation missing a range set")
	}
	got := alloc(t, dual, st, "pod2")
	if want := []netip.Addr{v4, addr("fd00::2")}; !reflect.DeepEqual(got, want) {
		t.Errorf("dual-stack re-allocation = %v, want %v", got, want)
	}
	// A stale rotation position (old set 0 was IPv4, now IPv6) restarts the
	// set from its first address.
	v6first := mustPool(t, ipam.RangeSet{sub("fd01::/64")})
	if got := alloc(t, v6first, st, "pod3")[0]; got != addr("fd01::2") {
		t.Errorf("got %s, want fd01::2", got)
	}
}

func TestAllocateLargeV6(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{sub("fd00::/64")})
	st := ipam.NewState()
	seen := make(map[netip.Addr]bool)
	for i := range 500 {
		a := alloc(t, p, st, fmt.Sprint("c", i))[0]
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
	}
}
