package tierbox

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/weftnet/weft/policy"
)

// PortSpan is an inclusive port range of one protocol allowed to a union
// of peers.
type PortSpan struct {
	Proto    string
	From, To int
	Peers    []Block
}

// Boxes cuts port spans into disjoint (protocol, port range, address
// ranges) boxes: each piece of a protocol's port axis gets the union of
// the peers of the spans covering it. An interval set of (address,
// protocol, port) then holds the union exactly, without overlapping
// elements.
func Boxes(spans []PortSpan) []Box[[]Range] {
	return CutPorts(spans, func(s PortSpan) (string, int, int) { return s.Proto, s.From, s.To },
		func(covering []PortSpan) []Range {
			var blocks []Block
			for _, s := range covering {
				blocks = append(blocks, s.Peers...)
			}
			return Ranges(blocks)
		}, func(rs []Range) bool { return len(rs) == 0 }, slices.Equal)
}

// CutPorts splits the port axis of each protocol of spans at every span's
// ends, gives each piece value(the spans covering it, in order), leaves
// out the pieces whose value is empty, and joins neighbouring pieces with
// equal values. Protocols come in name order, pieces in port order.
func CutPorts[S, V any](spans []S, bounds func(S) (proto string, from, to int), value func([]S) V, empty func(V) bool, equal func(a, b V) bool) []Box[V] {
	byProto := map[string][]S{}
	for _, s := range spans {
		proto, _, _ := bounds(s)
		byProto[proto] = append(byProto[proto], s)
	}
	protos := make([]string, 0, len(byProto))
	for p := range byProto {
		protos = append(protos, p)
	}
	sort.Strings(protos)
	var out []Box[V]
	for _, proto := range protos {
		ss := byProto[proto]
		var cuts []int // starts of pieces
		for _, s := range ss {
			_, from, to := bounds(s)
			cuts = append(cuts, from, to+1)
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		var prev *Box[V]
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
			if prev != nil && prev.To+1 == from && equal(prev.V, v) {
				prev.To = to
				continue
			}
			out = append(out, Box[V]{Proto: proto, From: from, To: to, V: v})
			prev = &out[len(out)-1]
		}
	}
	return out
}

// Box is a protocol, an inclusive port range and what the spans covering
// it give it (Boxes: the address ranges allowed on it; TierBoxes: the
// address ranges each verdict owns).
type Box[V any] struct {
	Proto    string
	From, To int
	V        V
}

// Ports is the box's port range as "80" or "80-90".
func (b Box[V]) Ports() string {
	if b.From == b.To {
		return fmt.Sprint(b.From)
	}
	return fmt.Sprintf("%d-%d", b.From, b.To)
}

// TierSpan is one ClusterNetworkPolicy rule's port range of one protocol
// (every protocol's whole range for a rule without ports), its action's
// verdict, and its peers as address ranges; spans come in the rules'
// precedence order. Rule is the rule's index in its tier.
type TierSpan struct {
	Proto    string
	From, To int
	Verdict  string
	Addrs    []Range
	Rule     int
}

// PortProtocols are the protocols whose destination port tier spans key
// on; the others only rules without ports match.
var PortProtocols = []string{"tcp", "udp", "sctp"}

// TierSpans turns a tier's rules, in precedence order, into the spans of
// the family of v6: ports are spans of their protocol's ports (every port
// for a protocol without one); a rule without ports is a span of every
// port of each of PortProtocols and one of other (the other protocols,
// Proto and ports unset).
func TierSpans(v6 bool, rules []policy.TierRule, addrSets map[string]policy.AddrSet) (spans, other []TierSpan) {
	for i, r := range rules {
		var blocks []Block
		if r.AllPeers {
			blocks = []Block{AllOf(v6)}
		}
		for _, id := range r.Peers {
			blocks = append(blocks, BlockOf(v6, addrSets[id]))
		}
		addrs := Ranges(blocks)
		if len(r.Ports) == 0 {
			for _, proto := range PortProtocols {
				spans = append(spans, TierSpan{Proto: proto, From: 0, To: 65535, Verdict: string(r.Action), Addrs: addrs, Rule: i})
			}
			other = append(other, TierSpan{Verdict: string(r.Action), Addrs: addrs, Rule: i})
			continue
		}
		for _, p := range r.Ports {
			from, to := int(p.From), int(p.To)
			if p.From == 0 {
				from, to = 0, 65535
			}
			spans = append(spans, TierSpan{Proto: strings.ToLower(string(p.Protocol)), From: from, To: to, Verdict: string(r.Action), Addrs: addrs, Rule: i})
		}
	}
	return spans, other
}

// TierBoxes cuts ordered spans into disjoint boxes where the first span
// covering a point decides: in each piece of a protocol's port axis
// every span takes the addresses no earlier span took. A set per verdict
// then holds its part exactly: the sets are disjoint, so the order in
// which a chain looks them up does not matter.
func TierBoxes(spans []TierSpan) []Box[map[string][]Range] {
	return CutPorts(spans, func(s TierSpan) (string, int, int) { return s.Proto, s.From, s.To }, FirstClaims,
		func(c map[string][]Range) bool { return len(c) == 0 }, SameClaims)
}

// FirstClaims gives each span, in order, the addresses no earlier span
// took, gathered by verdict.
func FirstClaims(spans []TierSpan) map[string][]Range {
	claims := map[string][]Range{}
	var taken []Range
	for _, s := range spans {
		if mine := Subtract(s.Addrs, taken); len(mine) > 0 {
			claims[s.Verdict] = Merge(append(claims[s.Verdict], mine...))
		}
		taken = Merge(append(slices.Clone(taken), s.Addrs...))
	}
	return claims
}

// SameClaims reports whether two claims give every verdict the same
// ranges.
func SameClaims(a, b map[string][]Range) bool {
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
