package bgp_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/weftnet/weft/routing/bgp"
)

// BenchmarkPropagation measures, in a three-node mesh of real speakers in
// namespaces, the time from a podCIDR appearing on node-3 (in the API view
// its agents read) to the route being in the kernels of both other nodes,
// and from its removal to the route being gone from both. The node agents
// read their input when its file changes (as a real agent is told by its
// informer), and the benchmark polls the kernels every 10 ms: the numbers
// include up to 10 ms of polling.
func BenchmarkPropagation(b *testing.B) {
	w := newWorld(b, worldSpec{config: func(string) string { return "" }})
	for i := 1; i <= 3; i++ {
		w.wantRoutes(i, nodeRoutes(nodesBut(i)...)...)
	}
	var install, withdraw []time.Duration
	has := func(p netip.Prefix) bool {
		for _, i := range []int{1, 2} {
			if !slices.ContainsFunc(w.routes(w.nodes[i].ns), func(r bgp.Route) bool { return r.Dst == p }) {
				return false
			}
		}
		return true
	}
	gone := func(p netip.Prefix) bool {
		for _, i := range []int{1, 2} {
			if slices.ContainsFunc(w.routes(w.nodes[i].ns), func(r bgp.Route) bool { return r.Dst == p }) {
				return false
			}
		}
		return true
	}
	b.ResetTimer()
	for n := range b.N {
		p := netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", 100+n%100))
		w.extra = map[int][]netip.Prefix{3: {p}}
		start := time.Now()
		for i := 1; i <= 3; i++ {
			w.writeNode(i)
		}
		if !waitFor(30*time.Second, func() bool { return has(p) }) {
			b.Fatalf("%s not installed on node-1 and node-2", p)
		}
		install = append(install, time.Since(start))
		w.extra = nil
		start = time.Now()
		for i := 1; i <= 3; i++ {
			w.writeNode(i)
		}
		if !waitFor(30*time.Second, func() bool { return gone(p) }) {
			b.Fatalf("%s not withdrawn from node-1 and node-2", p)
		}
		withdraw = append(withdraw, time.Since(start))
	}
	b.StopTimer()
	b.ReportMetric(float64(percentile(install, 50).Milliseconds()), "install-median-ms")
	b.ReportMetric(float64(slices.Max(install).Milliseconds()), "install-max-ms")
	b.ReportMetric(float64(percentile(withdraw, 50).Milliseconds()), "withdraw-median-ms")
	b.ReportMetric(float64(slices.Max(withdraw).Milliseconds()), "withdraw-max-ms")
}

func nodesBut(i int) []int {
	var out []int
	for j := 1; j <= 3; j++ {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}
