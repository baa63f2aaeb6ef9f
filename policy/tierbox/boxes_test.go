package tierbox

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// TestBoxesDisjoint: overlapping port ranges of several rules become
// disjoint boxes that allow exactly the union.
func TestBoxesDisjoint(t *testing.T) {
	p := func(s string) Block { return Block{Nets: []netip.Prefix{netip.MustParsePrefix(s)}} }
	got := Boxes([]PortSpan{
		{Proto: "tcp", From: 80, To: 90, Peers: []Block{p("10.0.0.0/24")}},
		{Proto: "tcp", From: 85, To: 85, Peers: []Block{p("10.0.1.0/24")}},
		{Proto: "tcp", From: 86, To: 100, Peers: []Block{p("10.0.0.0/24")}},
		{Proto: "udp", From: 0, To: 65535, Peers: []Block{p("0.0.0.0/0")}},
	})
	var lines []string
	for _, b := range got {
		for _, a := range b.V {
			lines = append(lines, a.String()+" . "+b.Proto+" . "+b.Ports())
		}
	}
	want := []string{
		"10.0.0.0-10.0.0.255 . tcp . 80-84",
		"10.0.0.0-10.0.1.255 . tcp . 85",
		"10.0.0.0-10.0.0.255 . tcp . 86-100",
		"0.0.0.0-255.255.255.255 . udp . 0-65535",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("boxes:\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// TestTierBoxesFirstMatch holds the partition of 500 random ordered tiers
// (overlapping addresses and ports, every verdict) against first-match
// evaluated span by span, at every point of a small space: the boxes are
// disjoint, in order, and give each point the verdict of the first span
// covering it, or none.
func TestTierBoxesFirstMatch(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }
	verdicts := []string{"Accept", "Deny", "Pass"}
	protos := []string{"tcp", "udp"}
	for range 500 {
		var spans []TierSpan
		for i := range 1 + r.IntN(8) {
			var rs []Range
			for range r.IntN(3) {
				lo := r.IntN(40)
				rs = append(rs, Range{addr(lo), addr(lo + r.IntN(10))})
			}
			from := r.IntN(20)
			to := from + r.IntN(10)
			if r.IntN(4) == 0 {
				from, to = 0, 65535
			}
			spans = append(spans, TierSpan{Proto: protos[r.IntN(2)], From: from, To: to, Verdict: verdicts[r.IntN(3)], Addrs: Merge(rs), Rule: i})
		}
		boxes := TierBoxes(spans)
		for i, b := range boxes {
			if b.From > b.To || (i > 0 && boxes[i-1].Proto == b.Proto && boxes[i-1].To >= b.From) {
				t.Fatalf("%v: boxes %v not disjoint and in order", spans, boxes)
			}
		}
		for _, proto := range protos {
			for _, port := range []int{0, 1, 5, 9, 10, 15, 19, 20, 25, 29, 30, 31, 65535} {
				for a := range 52 {
					want := ""
					for _, s := range spans {
						if s.Proto == proto && s.From <= port && port <= s.To && inRanges(s.Addrs, addr(a)) {
							want = s.Verdict
							break
						}
					}
					got := ""
					for _, b := range boxes {
						if b.Proto != proto || port < b.From || port > b.To {
							continue
						}
						for v, rs := range b.V {
							if inRanges(rs, addr(a)) {
								if got != "" {
									t.Fatalf("%v: %s %d %v claimed by %s and %s", spans, proto, port, addr(a), got, v)
								}
								got = v
							}
						}
					}
					if got != want {
						t.Fatalf("%v: %s %d %v: boxes say %q, first match %q", spans, proto, port, addr(a), got, want)
					}
				}
			}
		}
	}
}

func inRanges(rs []Range, a netip.Addr) bool {
	for _, r := range rs {
		if r.Lo.Compare(a) <= 0 && a.Compare(r.Hi) <= 0 {
			return true
		}
	}
	return false
}
