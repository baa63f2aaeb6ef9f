package ebpf_test

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/proxytest"
)

// BenchmarkSync: programming n Services (two ports, ten endpoints each)
// into empty maps, and one endpoint change delivered by the tracker as in
// the proxier (its snapshot, the incremental render, the map writes).
// WEFT_EBPF_SERVICES=n runs n Services instead of 1000 and 10000 (100000:
// issue 27's cluster).
func BenchmarkSync(b *testing.B) {
	if !netnsutil.Isolated() {
		b.Skip("needs root (BPF maps in a private namespace)")
	}
	cfg := ebpf.Config{NodeName: "bench-node"}
	sizes := []int{1000, 10000}
	if v := os.Getenv("WEFT_EBPF_SERVICES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("WEFT_EBPF_SERVICES=%q: want a number of Services", v)
		}
		sizes = []int{n}
	}
	for _, n := range sizes {
		svcs, sl := proxytest.BenchObjects(n)
		tr := proxytest.BenchTracker(svcs, sl)
		st, _ := tr.Snapshot()
		b.Run(fmt.Sprintf("services=%d/from-scratch", n), func(b *testing.B) {
			cpu := proxytest.StartCPU(b)
			defer cpu.Report(b, "")
			for b.Loop() {
				b.StopTimer()
				w := ebpf.NewMapWriter(b)
				b.StartTimer()
				if err := w.Apply(ebpf.Render(cfg, st), nil, true); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("services=%d/one-endpoint-change", n), func(b *testing.B) {
			w, r := ebpf.NewMapWriter(b), ebpf.NewRenderer(cfg)
			want, _ := r.Update(st)
			if err := w.Apply(want, nil, true); err != nil {
				b.Fatal(err)
			}
			// The garbage of the setup (a first sync of the cluster) is
			// collected before: its collection is not the change's.
			runtime.GC()
			i := 0
			cpu := proxytest.StartCPU(b)
			defer cpu.Report(b, "")
			for b.Loop() {
				proxytest.MoveEndpoint(tr, sl, i)
				i++
				cur, _ := tr.Snapshot()
				want, dirty := r.Update(cur)
				if err := w.Apply(want, dirty, false); err != nil {
					b.Fatal(err)
				}
				if w.Stats().Frontends != 2 { // the Service's two ports
					b.Fatalf("one change wrote %+v", w.Stats())
				}
			}
		})
	}
}
