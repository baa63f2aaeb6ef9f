package ipvs

import (
	"fmt"
	"testing"
	"time"

	"github.com/weftnet/weft/proxy/model"
)

// BenchmarkEndpointChange is a sync after one endpoint of one of N
// Services came or went: the whole render and the diff against the
// applied table (through a fake kernel). It reports the IPVS netlink
// requests of a change, which must not grow with N.
func BenchmarkEndpointChange(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			base := services(n)
			states := []model.State{withEndpoints(base, "s1", model.TCP, 8080, "10.244.1.2", "10.244.1.3", "10.244.1.4"), base}
			k := &countingKernel{Kernel: newFake()}
			p := &ipvsPlan{k: k, applied: map[VSKey]*appliedVS{}, terminating: map[destKey]time.Time{}}
			cfg := testConfig()
			sync := func(st model.State) {
				k.ops, p.now = 0, time.Now()
				if err := p.apply(Render(cfg, st).Servers); err != nil {
					b.Fatal(err)
				}
				// No grace: a removed real server goes in the same sync.
				if err := p.reap(); err != nil {
					b.Fatal(err)
				}
			}
			sync(base)
			ops := 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sync(states[i%2])
				ops = max(ops, k.ops)
			}
			b.ReportMetric(float64(ops), "netlink-ops/change")
		})
	}
}
