package ebpf

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

func maglevBackends(n int) []netip.AddrPort {
	out := make([]netip.AddrPort, n)
	for i := range out {
		out[i] = netip.MustParseAddrPort(fmt.Sprintf("10.244.%d.%d:8080", i/200, i%200+2))
	}
	return out
}

// owners maps each table entry to its backend.
func owners(bs []netip.AddrPort, table []int) []netip.AddrPort {
	out := make([]netip.AddrPort, len(table))
	for i, b := range table {
		out[i] = bs[b]
	}
	return out
}

// TestMaglevRemap: removing or adding one backend moves at most 1 % of
// the entries held by the other backends, for 1 to 65 backends; every
// backend gets its share (within a few percent) and the table does not
// depend on the backends' order.
func TestMaglevRemap(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 7, 10, 16, 25, 64} {
		bs := maglevBackends(n + 1)
		before, after := bs[:n], bs[:n+1]
		m := maglevSize(n + 1)
		t1, t2 := owners(before, maglevTable(before, m)), owners(after, maglevTable(after, m))
		added := bs[n]
		moved := 0
		for i := range t1 {
			if t1[i] != t2[i] && t2[i] != added {
				moved++
			}
		}
		if frac := float64(moved) / float64(m); frac > 0.01 {
			t.Errorf("%d -> %d backends (table %d): %.2f %% of the others' entries moved, want <= 1 %%", n, n+1, m, 100*frac)
		}
		// Removal is the same change the other way round.
		count := map[netip.AddrPort]int{}
		for _, o := range t2 {
			count[o]++
		}
		for _, b := range after {
			if share := float64(count[b]) * float64(n+1) / float64(m); share < 0.9 || share > 1.1 {
				t.Errorf("%d backends: %s holds %d of %d entries", n+1, b, count[b], m)
			}
		}
		rev := slices.Clone(after)
		slices.Reverse(rev)
		if got := owners(rev, maglevTable(rev, m)); !slices.Equal(got, t2) {
			t.Errorf("%d backends: the table depends on their order", n+1)
		}
	}
}

func TestMaglevSize(t *testing.T) {
	for n, want := range map[int]uint32{1: 1021, 2: 2039, 3: 4093, 4: 4093, 10: 16381, 32: 32749, 33: 65521, 1000: 65521} {
		if got := maglevSize(n); got != want {
			t.Errorf("maglevSize(%d) = %d, want %d", n, got, want)
		}
	}
}
