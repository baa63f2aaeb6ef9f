package agent

import (
	"slices"
	"testing"
	"time"

	"github.com/weftnet/weft/topology"
)

// churnInterval is 100 pod starts and stops per minute.
const churnInterval = 600 * time.Millisecond

// BenchmarkTopologyExporter measures the exporter's cost on the API
// server and its reaction time (`make bench`: -benchtime=1x; it takes
// about 40 s of wall time): API writes per minute at 100 pod starts and
// stops per minute, below the podCIDR's capacity and at its edge (where
// every start fills the node and every stop frees it, the worst case),
// writes for a burst of 20 changes within 60 ms, and the time from an
// address freed in the IPAM state to the node untainted in the API
// (a fake API server: a real one adds its own write latency).
func BenchmarkTopologyExporter(b *testing.B) {
	for range b.N {
		bed := newExporterBed(b)
		churn := func(base int, d time.Duration, lift *[]time.Duration) (writes int64, events int) {
			start := bed.exp.Writes()
			for end := time.Now().Add(d); time.Now().Before(end); events += 2 {
				bed.attach(b, base)
				time.Sleep(churnInterval)
				freed := time.Now()
				bed.detach(b, base)
				if lift != nil {
					for topology.Tainted(bed.node(b)) {
						time.Sleep(time.Millisecond)
					}
					*lift = append(*lift, time.Since(freed))
				}
				time.Sleep(max(0, churnInterval-time.Since(freed)))
			}
			return bed.exp.Writes() - start, events
		}
		perMinute := func(w int64, events int) float64 {
			return float64(w) / (float64(events) * churnInterval.Seconds() / 60)
		}
		// Below capacity: 2 pods stay, a third comes and goes.
		bed.attach(b, 100)
		bed.attach(b, 101)
		time.Sleep(time.Second)
		w, n := churn(0, 15*time.Second, nil)
		b.ReportMetric(perMinute(w, n), "writes/min-below-capacity")

		// At the edge: 4 pods stay, a fifth fills the node and leaves.
		bed.attach(b, 102)
		bed.attach(b, 103)
		time.Sleep(time.Second)
		var lift []time.Duration
		w, n = churn(1, 15*time.Second, &lift)
		b.ReportMetric(perMinute(w, n), "writes/min-at-capacity")
		slices.Sort(lift)
		b.ReportMetric(float64(lift[len(lift)/2].Microseconds())/1000, "ms-free-to-untainted-p50")
		b.ReportMetric(float64(lift[len(lift)-1].Microseconds())/1000, "ms-free-to-untainted-max")

		// A burst: 20 changes in about 60 ms are coalesced.
		time.Sleep(time.Second)
		start := bed.exp.Writes()
		for range 10 {
			bed.attach(b, 1)
			time.Sleep(3 * time.Millisecond)
			bed.detach(b, 1)
			time.Sleep(3 * time.Millisecond)
		}
		time.Sleep(2 * time.Second)
		b.ReportMetric(float64(bed.exp.Writes()-start), "writes-per-burst-of-20")
	}
}
