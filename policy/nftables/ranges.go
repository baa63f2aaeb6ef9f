package nftables

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/weftnet/weft/policy"
)

// addrRange is an inclusive range of addresses of one family.
type addrRange struct{ lo, hi netip.Addr }

func (r addrRange) String() string {
	if r.lo == r.hi {
		return r.lo.String()
	}
	return r.lo.String() + "-" + r.hi.String()
}

// peerBlock is one part of a union of peers: the addresses in one of nets
// and in none of except (a pod set is its addresses as host prefixes).
type peerBlock struct{ nets, except []netip.Prefix }

// blockOf is the part of an address set in the family of v6.
func blockOf(v6 bool, s policy.AddrSet) peerBlock {
	var b peerBlock
	if s.Kind == policy.SetAddrs {
		for _, a := range s.Addrs {
			if a.Is6() == v6 {
				b.nets = append(b.nets, netip.PrefixFrom(a, a.BitLen()))
			}
		}
		return b
	}
	for _, n := range s.Nets {
		if n.Addr().Is6() == v6 {
			b.nets = append(b.nets, n.Masked())
		}
	}
	for _, e := range s.Except {
		if e.Addr().Is6() == v6 {
			b.except = append(b.except, e.Masked())
		}
	}
	return b
}

// allOf is the family's whole address space as a block.
func allOf(v6 bool) peerBlock {
	if v6 {
		return peerBlock{nets: []netip.Prefix{netip.PrefixFrom(netip.IPv6Unspecified(), 0)}}
	}
	return peerBlock{nets: []netip.Prefix{netip.PrefixFrom(netip.IPv4Unspecified(), 0)}}
}

// prefixRange is the range of addresses p holds.
func prefixRange(p netip.Prefix) addrRange {
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
	return addrRange{p.Addr(), hi}
}

// merge sorts ranges and joins overlapping and adjacent ones: the result
// is disjoint and in order.
func merge(rs []addrRange) []addrRange {
	slices.SortFunc(rs, func(a, b addrRange) int { return a.lo.Compare(b.lo) })
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if next := last.hi.Next(); r.lo.Compare(last.hi) <= 0 || (next.IsValid() && r.lo == next) {
				if r.hi.Compare(last.hi) > 0 {
					last.hi = r.hi
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// subtract is rs minus cut, both disjoint and in order (merge's output),
// in one sweep of both.
func subtract(rs, cut []addrRange) []addrRange {
	var out []addrRange
	j := 0
	for _, r := range rs {
		for j < len(cut) && cut[j].hi.Compare(r.lo) < 0 {
			j++ // cuts wholly below r (and below every later range)
		}
		lo, whole := r.lo, true
		for k := j; k < len(cut) && cut[k].lo.Compare(r.hi) <= 0; k++ {
			if cut[k].lo.Compare(lo) > 0 {
				out = append(out, addrRange{lo, cut[k].lo.Prev()})
			}
			if cut[k].hi.Compare(r.hi) >= 0 {
				whole = false
				break
			}
			lo = cut[k].hi.Next()
		}
		if whole {
			out = append(out, addrRange{lo, r.hi})
		}
	}
	return out
}

// ranges is a union of peer blocks as disjoint address ranges in order:
// exact for any blocks (an exception of one block never hides another
// block's addresses), and fit for an interval set, which holds no
// overlapping elements.
func ranges(blocks []peerBlock) []addrRange {
	var all []addrRange
	for _, b := range blocks {
		var in, out []addrRange
		for _, n := range b.nets {
			in = append(in, prefixRange(n))
		}
		for _, e := range b.except {
			out = append(out, prefixRange(e))
		}
		all = append(all, subtract(merge(in), merge(out))...)
	}
	return merge(all)
}

// portSpan is an inclusive port range of one protocol allowed to a union
// of peers.
type portSpan struct {
	proto    string
	from, to int
	peers    []peerBlock
}

// boxes cuts port spans into disjoint (protocol, port range, address
// ranges) boxes: the port axis of each protocol is split at every span's
// ends, each piece gets the union of the peers of the spans covering it,
// and neighbouring pieces with the same addresses are joined. An interval
// set of (address, protocol, port) then holds the union exactly, without
// overlapping elements.
func boxes(spans []portSpan) []box {
	byProto := map[string][]portSpan{}
	for _, s := range spans {
		byProto[s.proto] = append(byProto[s.proto], s)
	}
	var out []box
	for _, proto := range sortedKeys(byProto) {
		ss := byProto[proto]
		var cuts []int // starts of pieces
		for _, s := range ss {
			cuts = append(cuts, s.from, s.to+1)
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		var prev *box
		for i := 0; i+1 < len(cuts); i++ {
			from, to := cuts[i], cuts[i+1]-1
			var blocks []peerBlock
			for _, s := range ss {
				if s.from <= from && to <= s.to {
					blocks = append(blocks, s.peers...)
				}
			}
			rs := ranges(blocks)
			if len(rs) == 0 {
				prev = nil
				continue
			}
			if prev != nil && prev.to+1 == from && slices.Equal(prev.addrs, rs) {
				prev.to = to
				continue
			}
			out = append(out, box{proto: proto, from: from, to: to, addrs: rs})
			prev = &out[len(out)-1]
		}
	}
	return out
}

// box is a protocol, an inclusive port range and the address ranges
// allowed on it.
type box struct {
	proto    string
	from, to int
	addrs    []addrRange
}

func (b box) ports() string {
	if b.from == b.to {
		return fmt.Sprint(b.from)
	}
	return fmt.Sprintf("%d-%d", b.from, b.to)
}

// tierSpan is one ClusterNetworkPolicy rule's port range of one protocol
// (every protocol's whole range for a rule without ports), its action's
// verdict, and its peers as address ranges; spans come in the rules'
// precedence order.
type tierSpan struct {
	proto    string
	from, to int
	verdict  string
	addrs    []addrRange
}

// tierBox is a protocol, an inclusive port range and, per verdict, the
// address ranges whose first matching rule has that verdict.
type tierBox struct {
	proto     string
	from, to  int
	byVerdict map[string][]addrRange
}

func (b tierBox) ports() string { return box{from: b.from, to: b.to}.ports() }

// tierBoxes cuts ordered spans into disjoint boxes where the first span
// covering a point decides: the port axis of each protocol is split at
// every span's ends, and in each piece every span takes the addresses no
// earlier span took. Neighbouring pieces with the same claims are joined.
// An interval set per verdict then holds its part exactly: the sets are
// disjoint, so the order in which a chain looks them up does not matter.
func tierBoxes(spans []tierSpan) []tierBox {
	byProto := map[string][]tierSpan{}
	for _, s := range spans {
		byProto[s.proto] = append(byProto[s.proto], s)
	}
	var out []tierBox
	for _, proto := range sortedKeys(byProto) {
		ss := byProto[proto]
		var cuts []int
		for _, s := range ss {
			cuts = append(cuts, s.from, s.to+1)
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		var prev *tierBox
		for i := 0; i+1 < len(cuts); i++ {
			from, to := cuts[i], cuts[i+1]-1
			var covering []tierSpan
			for _, s := range ss {
				if s.from <= from && to <= s.to {
					covering = append(covering, s)
				}
			}
			claims := firstClaims(covering)
			if len(claims) == 0 {
				prev = nil
				continue
			}
			if prev != nil && prev.to+1 == from && sameClaims(prev.byVerdict, claims) {
				prev.to = to
				continue
			}
			out = append(out, tierBox{proto: proto, from: from, to: to, byVerdict: claims})
			prev = &out[len(out)-1]
		}
	}
	return out
}

// firstClaims gives each span, in order, the addresses no earlier span
// took, gathered by verdict.
func firstClaims(spans []tierSpan) map[string][]addrRange {
	claims := map[string][]addrRange{}
	var taken []addrRange
	for _, s := range spans {
		if mine := subtract(s.addrs, taken); len(mine) > 0 {
			claims[s.verdict] = merge(append(claims[s.verdict], mine...))
		}
		taken = merge(append(slices.Clone(taken), s.addrs...))
	}
	return claims
}

func sameClaims(a, b map[string][]addrRange) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
