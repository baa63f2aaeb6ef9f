package ipam_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/weftnet/weft/ipam"
)

func mustPool(t *testing.T, sets ...ipam.RangeSet) *ipam.Pool {
	t.Helper()
	p, err := ipam.NewPool(sets)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func key(id string) ipam.Key { return ipam.Key{ContainerID: id, IfName: "eth0"} }

// alloc allocates for id and returns the addresses (without prefix length).
func alloc(t *testing.T, p *ipam.Pool, st *ipam.State, id string) []netip.Addr {
	t.Helper()
	leases, err := p.Allocate(st, key(id))
	if err != nil {
		t.Fatalf("Allocate(%s): %v", id, err)
	}
	out := make([]netip.Addr, len(leases))
	for i, l := range leases {
		out[i] = l.Address.Addr()
	}
	return out
}

func encode(t *testing.T, st *ipam.State) []byte {
	t.Helper()
	b, err := ipam.MarshalState(st)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fill allocates until the pool is exhausted and returns what it got.
func fill(t *testing.T, p *ipam.Pool, st *ipam.State) []string {
	t.Helper()
	var got []string
	for n := 0; ; n++ {
		leases, err := p.Allocate(st, key(fmt.Sprint("fill", n)))
		if errors.Is(err, ipam.ErrExhausted) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, leases[0].Address.Addr().String())
		if n > 1000 {
			t.Fatal("pool never exhausted")
		}
	}
}

func TestAllocateSkipsReserved(t *testing.T) {
	tests := []struct {
		name string
		r    ipam.Range
		want []string
	}{
		{"v4 /29 defaults", sub("10.244.1.0/29"),
			[]string{"10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.5", "10.244.1.6"}},
		{"v4 whole subnet in range, gateway mid-range", rng("10.0.0.0/29", "10.0.0.0", "10.0.0.7", "10.0.0.3"),
			[]string{"10.0.0.1", "10.0.0.2", "10.0.0.4", "10.0.0.5", "10.0.0.6"}},
		{"v6 /125 from network address", rng("fd00::/125", "fd00::", "", ""),
			[]string{"fd00::2", "fd00::3", "fd00::4", "fd00::5", "fd00::6", "fd00::7"}},
		{"v4 /30", sub("192.168.0.0/30"), []string{"192.168.0.2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPool(t, ipam.RangeSet{tt.r})
			st := ipam.NewState()
			if got := fill(t, p, st); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("allocated %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAllocateExhausted(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{sub("10.244.1.0/29")}, ipam.RangeSet{sub("fd00::/64")})
	st := ipam.NewState()
	for i := range 5 {
		alloc(t, p, st, fmt.Sprint("c", i))
	}
	if got := p.Free(st); got[0] != 0 {
		t.Errorf("Free = %v, want 0 in set 0", got)
	}
	before := encode(t, st)
	leases, err := p.Allocate(st, key("one-too-many"))
	if !errors.Is(err, ipam.ErrExhausted) {
		t.Fatalf("Allocate = %v, %v; want ErrExhausted", leases, err)
	}
	if want := "ipam.ranges[0] (10.244.1.0/29): no free address"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
	if after := encode(t, st); !bytes.Equal(before, after) {
		t.Errorf("state changed by failed Allocate:\n%s\nwant\n%s", after, before)
	}
}

func TestRotation(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{sub("10.244.1.0/29")})
	st := ipam.NewState()
	a := alloc(t, p, st, "a")[0]
	if !p.Release(st, key("a")) {
		t.Fatal("Release(a) = false")
	}
	if b := alloc(t, p, st, "b")[0]; b == a {
		t.Errorf("released %s was reused at once", a)
	}

	// Take .4 to .6 (.2 is still free), then free .4: the search from .6
	// wraps past the end to .2 before coming back to .4.
	for _, id := range []string{"c", "d", "e"} {
		alloc(t, p, st, id)
	}
	p.Release(st, key("c")) // 10.244.1.4
	if got := alloc(t, p, st, "g")[0]; got != addr("10.244.1.2") {
		t.Errorf("after wrap got %s, want 10.244.1.2", got)
	}
	if got := alloc(t, p, st, "h")[0]; got != addr("10.244.1.4") {
		t.Errorf("got %s, want 10.244.1.4", got)
	}
}

func TestWrapAroundRanges(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{
		rng("10.0.0.0/24", "10.0.0.10", "10.0.0.11", ""),
		rng("10.0.1.0/24", "10.0.1.20", "10.0.1.21", ""),
		rng("10.0.2.0/24", "10.0.2.30", "10.0.2.30", ""),
	})
	st := ipam.NewState()
	var got []string
	for _, id := range []string{"k1", "k2", "k3", "k4", "k5"} {
		got = append(got, alloc(t, p, st, id)[0].String())
	}
	want := []string{"10.0.0.10", "10.0.0.11", "10.0.1.20", "10.0.1.21", "10.0.2.30"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("allocated %v, want %v", got, want)
	}
	p.Release(st, key("k1"))
	p.Release(st, key("k3"))
	if got := alloc(t, p, st, "k6")[0]; got != addr("10.0.0.10") {
		t.Errorf("wrap from last range: got %s, want 10.0.0.10", got)
	}
	if got := alloc(t, p, st, "k7")[0]; got != addr("10.0.1.20") {
		t.Errorf("next range: got %s, want 10.0.1.20", got)
	}
	if _, err := p.Allocate(st, key("k8")); !errors.Is(err, ipam.ErrExhausted) {
		t.Errorf("full set: err = %v, want ErrExhausted", err)
	}
}

func TestDualStack(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{sub("10.244.1.0/24")}, ipam.RangeSet{sub("fd00:10:244:1::/64")})
	st := ipam.NewState()
	leases, err := p.Allocate(st, key("pod"))
	if err != nil {
		t.Fatal(err)
	}
	want := []ipam.Lease{
		{Address: pfx("10.244.1.2/24"), Gateway: addr("10.244.1.1")},
		{Address: pfx("fd00:10:244:1::2/64"), Gateway: addr("fd00:10:244:1::1")},
	}
	if !reflect.DeepEqual(leases, want) {
		t.Errorf("leases = %v, want %v", leases, want)
	}
	if got, ok := p.Lookup(st, key("pod")); !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("Lookup = %v, %v; want %v, true", got, ok, want)
	}

	// v4 exhausted, v6 not: all-or-nothing.
	small := mustPool(t, ipam.RangeSet{sub("10.0.0.0/30")}, ipam.RangeSet{sub("fd00::/64")})
	st = ipam.NewState()
	alloc(t, small, st, "first")
	before := encode(t, st)
	if _, err := small.Allocate(st, key("second")); !errors.Is(err, ipam.ErrExhausted) {
		t.Fatalf("err = %v, want ErrExhausted", err)
	}
	if !bytes.Equal(before, encode(t, st)) {
		t.Error("failed dual-stack Allocate changed the state")
	}
}

func TestAllocateIdempotent(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{sub("10.244.1.0/24")}, ipam.RangeSet{sub("fd00::/64")})
	st := ipam.NewState()
	first := alloc(t, p, st, "pod")
	alloc(t, p, st, "other")
	before := encode(t, st)
	again := alloc(t, p, st, "pod")
	if !reflect.DeepEqual(first, again) {
		t.Errorf("repeated Allocate = %v, want %v", again, first)
	}
	if !bytes.Equal(before, encode(t, st)) {
		t.Error("repeated Allocate changed the state")
	}
}

func TestReleaseThenAllocate(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{sub("10.244.1.0/24")})
	st := ipam.NewState()
	first := alloc(t, p, st, "pod")
	if !p.Release(st, key("pod")) {
		t.Fatal("Release = false, want true")
	}
	if p.Release(st, key("pod")) {
		t.Error("second Release = true, want false")
	}
	if _, ok := p.Lookup(st, key("pod")); ok {
		t.Error("Lookup after Release found an allocation")
	}
	if len(st.Keys()) != 0 {
		t.Errorf("Keys = %v, want none", st.Keys())
	}
	second := alloc(t, p, st, "pod")
	if reflect.DeepEqual(first, second) {
		t.Errorf("re-ADD after DEL got the released address %v again", first)
	}
}

func TestKeysAndValidation(t *testing.T) {
	p := mustPool(t, ipam.RangeSet{sub("10.0.0.0/24")})
	st := &ipam.State{} // a zero State works too
	for _, k := range []ipam.Key{{"b", "eth0"}, {"a", "eth1"}, {"a", "eth0"}} {
		if _, err := p.Allocate(st, k); err != nil {
			t.Fatal(err)
		}
	}
	want := []ipam.Key{{"a", "eth0"}, {"a", "eth1"}, {"b", "eth0"}}
	if got := st.Keys(); !reflect.DeepEqual(got, want) {
		t.Errorf("Keys = %v, want %v", got, want)
	}
	if st.Version != ipam.StateVersion {
		t.Errorf("Version = %d, want %d", st.Version, ipam.StateVersion)
	}
	for _, k := range []ipam.Key{{"", "eth0"}, {"x", ""}} {
		if _, err := p.Allocate(st, k); err == nil {
			t.Errorf("Allocate(%v) succeeded", k)
		}
	}
}
