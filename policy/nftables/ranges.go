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
// ranges) boxes: each piece of a protocol's port axis gets the union of
// the peers of the spans covering it. An interval set of (address,
// protocol, port) then holds the union exactly, without overlapping
// elements.
func boxes(spans []portSpan) []box[[]addrRange] {
	return cutPorts(spans, func(s portSpan) (string, int, int) { return s.proto, s.from, s.to },
		func(covering []portSpan) []addrRange {
			var blocks []peerBlock
			for _, s := range covering {
				blocks = append(blocks, s.peers...)
			}
			return ranges(blocks)
		}, func(rs []addrRange) bool { return len(rs) == 0 }, slices.Equal)
}

// cutPorts splits the port axis of each protocol of spans at every span's
// ends, gives each piece value(the spans covering it, in order), leaves
// out the pieces whose value is empty, and joins neighbouring pieces with
// equal values.
func cutPorts[S, V any](spans []S, bounds func(S) (proto string, from, to int), value func([]S) V, empty func(V) bool, equal func(a, b V) bool) []box[V] {
	byProto := map[string][]S{}
	for _, s := range spans {
		proto, _, _ := bounds(s)
		byProto[proto] = append(byProto[proto], s)
	}
	var out []box[V]
	for _, proto := range sortedKeys(byProto) {
		ss := byProto[proto]
		var cuts []int // starts of pieces
		for _, s := range ss {
			_, from, to := bounds(s)
			cuts = append(cuts, from, to+1)
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		var prev *box[V]
		for i := 0; i+1 < len(cuts); i++ {
			from, to := cuts[i], cuts[i+1]-1
			var covering []S
			for _, s := range ss {
				if _, sf, st := bounds(s); sf <= from && to <= st {
					covering = append(covering, s)
				}
			}
			v := value(covering)
			if empty(v) {
				prev = nil
				continue
			}
			if prev != nil && prev.to+1 == from && equal(prev.v, v) {
				prev.to = to
				continue
			}
			out = append(out, box[V]{proto: proto, from: from, to: to, v: v})
			prev = &out[len(out)-1]
		}
	}
	return out
}

// box is a protocol, an inclusive port range and what the spans covering
// it give it (boxes: the address ranges allowed on it; tierBoxes: the
// address ranges each verdict owns).
type box[V any] struct {
	proto    string
	from, to int
	v        V
}

func (b box[V]) ports() string {
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

// tierBoxes cuts ordered spans into disjoint boxes where the first span
// covering a point decides: in each piece of a protocol's port axis
// every span takes the addresses no earlier span took. An interval set
// per verdict then holds its part exactly: the sets are disjoint, so the
// order in which a chain looks them up does not matter.
func tierBoxes(spans []tierSpan) []box[map[string][]addrRange] {
	return cutPorts(spans, func(s tierSpan) (string, int, int) { return s.proto, s.from, s.to }, firstClaims,
		func(c map[string][]addrRange) bool { return len(c) == 0 }, sameClaims)
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
