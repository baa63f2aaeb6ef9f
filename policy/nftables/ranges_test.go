package nftables

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestSubtract holds subtract against address-by-address sets over a
// small space, on random disjoint sorted inputs.
func TestSubtract(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }
	random := func() ([]addrRange, map[int]bool) {
		in := map[int]bool{}
		var rs []addrRange
		for range r.IntN(6) {
			lo := r.IntN(60)
			hi := lo + r.IntN(8)
			rs = append(rs, addrRange{addr(lo), addr(hi)})
			for i := lo; i <= hi; i++ {
				in[i] = true
			}
		}
		return merge(rs), in
	}
	for range 2000 {
		a, inA := random()
		b, inB := random()
		got := map[int]bool{}
		out := subtract(a, b)
		for i, x := range out {
			if x.hi.Compare(x.lo) < 0 || (i > 0 && out[i-1].hi.Compare(x.lo) >= 0) {
				t.Fatalf("subtract(%v, %v) = %v: not disjoint and in order", a, b, out)
			}
			for v := int(x.lo.As4()[3]); v <= int(x.hi.As4()[3]); v++ {
				got[v] = true
			}
		}
		for v := range 70 {
			if got[v] != (inA[v] && !inB[v]) {
				t.Fatalf("subtract(%v, %v) = %v: wrong at %v", a, b, out, addr(v))
			}
		}
	}
}
