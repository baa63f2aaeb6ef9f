package tierbox

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestSubtract holds Subtract against address-by-address sets over a
// small space, on random disjoint sorted inputs.
func TestSubtract(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }
	random := func() ([]Range, map[int]bool) {
		in := map[int]bool{}
		var rs []Range
		for range r.IntN(6) {
			lo := r.IntN(60)
			hi := lo + r.IntN(8)
			rs = append(rs, Range{addr(lo), addr(hi)})
			for i := lo; i <= hi; i++ {
				in[i] = true
			}
		}
		return Merge(rs), in
	}
	for range 2000 {
		a, inA := random()
		b, inB := random()
		got := map[int]bool{}
		out := Subtract(a, b)
		for i, x := range out {
			if x.Hi.Compare(x.Lo) < 0 || (i > 0 && out[i-1].Hi.Compare(x.Lo) >= 0) {
				t.Fatalf("Subtract(%v, %v) = %v: not disjoint and in order", a, b, out)
			}
			for v := int(x.Lo.As4()[3]); v <= int(x.Hi.As4()[3]); v++ {
				got[v] = true
			}
		}
		for v := range 70 {
			if got[v] != (inA[v] && !inB[v]) {
				t.Fatalf("Subtract(%v, %v) = %v: wrong at %v", a, b, out, addr(v))
			}
		}
	}
}

// TestRangesExact holds the address ranges of 300 random unions of peer
// blocks (prefixes with exceptions, overlapping) against a direct
// evaluation, address by address over a small space.
func TestRangesExact(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	prefix := func() netip.Prefix {
		bits := 24 + r.IntN(9)
		a := netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(256))})
		return netip.PrefixFrom(a, bits).Masked()
	}
	for range 300 {
		var blocks []Block
		for range 1 + r.IntN(4) {
			var b Block
			for range 1 + r.IntN(2) {
				b.Nets = append(b.Nets, prefix())
			}
			for range r.IntN(3) {
				b.Except = append(b.Except, prefix())
			}
			blocks = append(blocks, b)
		}
		rs := Ranges(blocks)
		for i := 1; i < len(rs); i++ {
			if rs[i].Lo.Compare(rs[i-1].Hi.Next()) <= 0 {
				t.Fatalf("ranges %v overlap or touch", rs)
			}
		}
		for n := range 256 {
			a := netip.AddrFrom4([4]byte{10, 0, 0, byte(n)})
			want := false
			for _, b := range blocks {
				if containsAny(b.Nets, a) && !containsAny(b.Except, a) {
					want = true
				}
			}
			got := false
			for _, x := range rs {
				if x.Lo.Compare(a) <= 0 && a.Compare(x.Hi) <= 0 {
					got = true
				}
			}
			if got != want {
				t.Fatalf("%v: %s in ranges %v = %v, want %v", blocks, a, rs, got, want)
			}
		}
	}
}

func containsAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// TestPrefixes: a range written as prefixes holds exactly its addresses,
// in order, with no prefix that two neighbours could replace; IPv4 over a
// small space address by address, and the whole spaces of both families.
func TestPrefixes(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}) }
	for range 2000 {
		lo := r.IntN(1024)
		hi := lo + r.IntN(1024-lo)
		ps := Prefixes(Range{addr(lo), addr(hi)})
		next := addr(lo)
		for i, p := range ps {
			pr := PrefixRange(p)
			if p.Masked() != p || pr.Lo != next {
				t.Fatalf("Prefixes(%v-%v) = %v: %v is not where the previous one ended", addr(lo), addr(hi), ps, p)
			}
			if i > 0 && ps[i-1].Bits() == p.Bits() && ps[i-1].Masked() == netip.PrefixFrom(ps[i-1].Addr(), p.Bits()-1).Masked() &&
				netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked() == netip.PrefixFrom(ps[i-1].Addr(), p.Bits()-1).Masked() {
				t.Fatalf("Prefixes(%v-%v) = %v: %v and %v make one prefix", addr(lo), addr(hi), ps, ps[i-1], p)
			}
			next = pr.Hi.Next()
		}
		if next != addr(hi).Next() {
			t.Fatalf("Prefixes(%v-%v) = %v: ends before %v", addr(lo), addr(hi), ps, next)
		}
	}
	for _, all := range []Block{AllOf(false), AllOf(true)} {
		if got := Prefixes(PrefixRange(all.Nets[0])); len(got) != 1 || got[0] != all.Nets[0] {
			t.Fatalf("Prefixes(%v) = %v", all.Nets[0], got)
		}
	}
	r6 := Range{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::1:0")}
	want := "[fd00::1/128 fd00::2/127 fd00::4/126 fd00::8/125 fd00::10/124 fd00::20/123 fd00::40/122 fd00::80/121 fd00::100/120 fd00::200/119 fd00::400/118 fd00::800/117 fd00::1000/116 fd00::2000/115 fd00::4000/114 fd00::8000/113 fd00::1:0/128]"
	if got := Prefixes(r6); fmtPrefixes(got) != want {
		t.Fatalf("Prefixes(%v) = %v, want %v", r6, fmtPrefixes(got), want)
	}
}

func fmtPrefixes(ps []netip.Prefix) string {
	s := "["
	for i, p := range ps {
		if i > 0 {
			s += " "
		}
		s += p.String()
	}
	return s + "]"
}
