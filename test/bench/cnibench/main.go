// Command cnibench measures CNI ADD+DEL latency of weft against the
// reference bridge + host-local plugins, driven through libcni as a runtime
// drives them, with the same conflist shape, in one run, inside a private
// network namespace. It prints medians, p99s and the weft/reference ratios.
//
//	go run ./test/bench/cnibench -plugins bin/cni [-n 200] [-parallel 40] [-rounds 5]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/test/bench/benchlab"
)

// Both plugins serve the same pod range on a bridge of their own.
const (
	benchCIDR = "10.244.0.0/16"
	benchMTU  = 1450
)

type subject struct {
	name string
	list *libcni.NetworkConfigList
}

func main() {
	plugins := flag.String("plugins", "", "CNI bin dir with weft, bridge and host-local (default: $WEFT_CNI_PATH or bin/cni)")
	n := flag.Int("n", 200, "sequential ADD+DEL pairs per plugin")
	parallel := flag.Int("parallel", 40, "concurrent ADD+DEL pairs per round")
	rounds := flag.Int("rounds", 5, "parallel rounds per plugin")
	flag.Parse()

	benchlab.Main("cnibench", func(context.Context) error {
		if *plugins != "" {
			os.Setenv(cnitest.PathEnv, *plugins)
		}
		bin, err := cnitest.BinDir()
		if err != nil {
			return err
		}
		work, err := os.MkdirTemp("", "cnibench")
		if err != nil {
			return err
		}
		defer os.RemoveAll(work)
		rt := cnitest.NewRuntime(bin, filepath.Join(work, "cache"))

		subjects, err := subjects(work)
		if err != nil {
			return err
		}
		fmt.Printf("CNI ADD+DEL latency, %d sequential pairs and %d rounds of %d in parallel per plugin\n\n", *n, *rounds, *parallel)
		b := &bench{rt: rt}
		results := map[string]map[string][]sample{}
		for _, s := range subjects {
			results[s.name] = map[string][]sample{}
			b.run(s, 5, 1) // warm-up: page cache, bridge creation
		}
		// Interleave in blocks so that machine noise hits both alike.
		const block = 20
		for done := 0; done < *n; done += block {
			for _, s := range subjects {
				results[s.name]["sequential"] = append(results[s.name]["sequential"], b.run(s, min(block, *n-done), 1)...)
			}
		}
		for r := 0; r < *rounds; r++ {
			for _, s := range subjects {
				results[s.name]["parallel"] = append(results[s.name]["parallel"], b.run(s, *parallel, *parallel)...)
			}
		}
		if b.err != nil {
			return b.err
		}
		report(subjects, results)
		return nil
	})
}

func subjects(work string) ([]subject, error) {
	ranges := [][]map[string]any{{{"subnet": benchCIDR}}}
	weft, err := cnitest.Conflist("1.1.0", "bench-weft", map[string]any{
		"type": "weft", "bridge": "bweft", "mtu": benchMTU,
		"ipam": map[string]any{"ranges": ranges, "dataDir": filepath.Join(work, "weft")},
	})
	if err != nil {
		return nil, err
	}
	ref, err := cnitest.Conflist("1.1.0", "bench-ref", map[string]any{
		"type": "bridge", "bridge": "bref", "mtu": benchMTU, "isGateway": true, "hairpinMode": true,
		"ipam": map[string]any{"type": "host-local", "ranges": ranges, "dataDir": filepath.Join(work, "host-local")},
	})
	if err != nil {
		return nil, err
	}
	return []subject{{"weft", weft}, {"bridge+host-local", ref}}, nil
}

// sample is one ADD+DEL pair's latency, and its two halves.
type sample struct{ pair, add, del time.Duration }

type bench struct {
	rt  *cnitest.Runtime
	seq int
	err error
}

// run times count ADD+DEL pairs, width at a time, each in a fresh pod
// namespace made before the clock starts.
func (b *bench) run(s subject, count, width int) []sample {
	var out []sample
	for left := count; left > 0 && b.err == nil; left -= width {
		w := min(width, left)
		pods := make([]cnitest.Attachment, w)
		for i := range pods {
			b.seq++
			name := fmt.Sprintf("bench%d", b.seq)
			path, err := netnsutil.NewNamed(name)
			if err != nil {
				b.err = err
				return out
			}
			pods[i] = cnitest.Attachment{ContainerID: name, NetNS: path, IfName: "eth0"}
		}
		lat := make([]sample, w)
		errs := make([]error, w)
		var wg sync.WaitGroup
		for i := range pods {
			wg.Go(func() {
				start := time.Now()
				ctx := context.Background()
				if _, err := b.rt.Add(ctx, s.list, pods[i]); err != nil {
					errs[i] = fmt.Errorf("%s ADD: %w", s.name, err)
					return
				}
				mid := time.Now()
				if err := b.rt.Del(ctx, s.list, pods[i]); err != nil {
					errs[i] = fmt.Errorf("%s DEL: %w", s.name, err)
					return
				}
				end := time.Now()
				lat[i] = sample{pair: end.Sub(start), add: mid.Sub(start), del: end.Sub(mid)}
			})
		}
		wg.Wait()
		for _, p := range pods {
			_ = netnsutil.Delete(p.ContainerID)
		}
		for _, err := range errs {
			if err != nil && b.err == nil {
				b.err = err
			}
		}
		out = append(out, lat...)
	}
	return out
}

func report(subjects []subject, results map[string]map[string][]sample) {
	fmt.Printf("%-12s %-20s %8s %10s %10s %12s %12s\n", "mode", "plugin", "samples", "median", "p99", "ADD median", "DEL median")
	for _, mode := range []string{"sequential", "parallel"} {
		for _, s := range subjects {
			d := results[s.name][mode]
			fmt.Printf("%-12s %-20s %8d %10s %10s %12s %12s\n", mode, s.name, len(d),
				round(quantile(d, pair, 0.5)), round(quantile(d, pair, 0.99)),
				round(quantile(d, add, 0.5)), round(quantile(d, del, 0.5)))
		}
	}
	fmt.Println()
	fmt.Println("ratio weft / bridge+host-local, ADD+DEL pair (lower is better; targets: median <= 0.30, p99 <= 0.50)")
	for _, mode := range []string{"sequential", "parallel"} {
		w, r := results["weft"][mode], results["bridge+host-local"][mode]
		med := float64(quantile(w, pair, 0.5)) / float64(quantile(r, pair, 0.5))
		p99 := float64(quantile(w, pair, 0.99)) / float64(quantile(r, pair, 0.99))
		fmt.Printf("%-12s median %.2fx %-8s p99 %.2fx %s\n", mode, med, verdict(med, 0.30), p99, verdict(p99, 0.50))
	}
}

func pair(s sample) time.Duration { return s.pair }
func add(s sample) time.Duration  { return s.add }
func del(s sample) time.Duration  { return s.del }

func verdict(ratio, target float64) string {
	if ratio <= target {
		return "(met)"
	}
	return "(missed)"
}

func quantile(d []sample, field func(sample) time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := make([]time.Duration, len(d))
	for i := range d {
		s[i] = field(d[i])
	}
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func round(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
