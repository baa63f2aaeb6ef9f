package tierbox

import (
	"net/netip"
	"slices"

	"github.com/weftnet/weft/policy"
)

// Range is an inclusive range of addresses of one family.
type Range struct{ Lo, Hi netip.Addr }

func (r Range) String() string {
	if r.Lo == r.Hi {
		return r.Lo.String()
	}
	return r.Lo.String() + "-" + r.Hi.String()
}

// Block is one part of a union of peers: the addresses in one of Nets
// and in none of Except (a pod set is its addresses as host prefixes).
type Block struct{ Nets, Except []netip.Prefix }

// BlockOf is the part of an address set in the family of v6.
func BlockOf(v6 bool, s policy.AddrSet) Block {
	var b Block
	if s.Kind == policy.SetAddrs {
		for _, a := range s.Addrs {
			if a.Is6() == v6 {
				b.Nets = append(b.Nets, netip.PrefixFrom(a, a.BitLen()))
			}
		}
		return b
	}
	for _, n := range s.Nets {
		if n.Addr().Is6() == v6 {
			b.Nets = append(b.Nets, n.Masked())
		}
	}
	for _, e := range s.Except {
		if e.Addr().Is6() == v6 {
			b.Except = append(b.Except, e.Masked())
		}
	}
	return b
}

// AllOf is the family's whole address space as a block.
func AllOf(v6 bool) Block {
	if v6 {
		return Block{Nets: []netip.Prefix{netip.PrefixFrom(netip.IPv6Unspecified(), 0)}}
	}
	return Block{Nets: []netip.Prefix{netip.PrefixFrom(netip.IPv4Unspecified(), 0)}}
}

// PrefixRange is the range of addresses p holds.
func PrefixRange(p netip.Prefix) Range {
	p = p.Masked()
	b := p.Addr().As16()
	off := 0
	if p.Addr().Is4() {
		off = 96
	}
	for i := p.Bits() + off; i < 128; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	hi := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		hi = hi.Unmap()
	}
	return Range{p.Addr(), hi}
}

// Merge sorts ranges and joins overlapping and adjacent ones: the result
// is disjoint and in order.
func Merge(rs []Range) []Range {
	slices.SortFunc(rs, func(a, b Range) int { return a.Lo.Compare(b.Lo) })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if next := last.Hi.Next(); r.Lo.Compare(last.Hi) <= 0 || (next.IsValid() && r.Lo == next) {
				if r.Hi.Compare(last.Hi) > 0 {
					last.Hi = r.Hi
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// Subtract is rs minus cut, both disjoint and in order (Merge's output),
// in one sweep of both.
func Subtract(rs, cut []Range) []Range {
	var out []Range
	j := 0
	for _, r := range rs {
		for j < len(cut) && cut[j].Hi.Compare(r.Lo) < 0 {
			j++ // cuts wholly below r (and below every later range)
		}
		lo, whole := r.Lo, true
		for k := j; k < len(cut) && cut[k].Lo.Compare(r.Hi) <= 0; k++ {
			if cut[k].Lo.Compare(lo) > 0 {
				out = append(out, Range{lo, cut[k].Lo.Prev()})
			}
			if cut[k].Hi.Compare(r.Hi) >= 0 {
				whole = false
				break
			}
			lo = cut[k].Hi.Next()
		}
		if whole {
			out = append(out, Range{lo, r.Hi})
		}
	}
	return out
}

// Ranges is a union of peer blocks as disjoint address ranges in order:
// exact for any blocks (an exception of one block never hides another
// block's addresses), and fit for an interval set, which holds no
// overlapping elements.
func Ranges(blocks []Block) []Range {
	var all []Range
	for _, b := range blocks {
		var in, out []Range
		for _, n := range b.Nets {
			in = append(in, PrefixRange(n))
		}
		for _, e := range b.Except {
			out = append(out, PrefixRange(e))
		}
		all = append(all, Subtract(Merge(in), Merge(out))...)
	}
	return Merge(all)
}

// Prefixes writes a range as the fewest prefixes that hold exactly its
// addresses, in order (at most two per prefix length).
func Prefixes(r Range) []netip.Prefix {
	var out []netip.Prefix
	lo := r.Lo
	for {
		// The widest prefix starting at lo that ends at or before r.Hi.
		bits := lo.BitLen()
		for bits > 0 {
			p := netip.PrefixFrom(lo, bits-1)
			if p.Masked().Addr() != lo || PrefixRange(p).Hi.Compare(r.Hi) > 0 {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(lo, bits)
		out = append(out, p)
		hi := PrefixRange(p).Hi
		if hi.Compare(r.Hi) >= 0 {
			return out
		}
		lo = hi.Next()
	}
}
