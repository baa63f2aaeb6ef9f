// Command cnibench measures CNI ADD+DEL latency of weft against the
// reference bridge + host-local plugins, driven through libcni as a runtime
// drives them, with the same conflist shape, in one run, inside a private
// network namespace. It prints medians, p99s and the weft/reference ratios,
// then where weft's time goes (its own trace, see cni.TraceEnv).
//
// Both plugins get the same treatment: each pair runs in a fresh pod
// namespace made before the clock starts and deleted after the block, and
// the next block starts only once the block's bridge holds no port any more,
// so that the kernel's deferred work for one plugin (veth pairs it destroys
// after DEL, with a deleted namespace or otherwise) never lands on the
// other's clock. The time that takes is printed too ("settle").
//
// Then it prints what each command costs in CPU time and page faults
// (-cost: rusage, which hardly moves with the machine's load).
//
//	go run ./test/bench/cnibench -plugins bin/cni [-n 200] [-parallel 40] [-rounds 5] [-cost 30] [-kernel 20] [-latency=false]
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/nlutil"
	"github.com/weftnet/weft/test/bench/benchlab"
)

// Both plugins serve the same pod range on a bridge of their own.
const (
	benchCIDR = "10.244.0.0/16"
	benchMTU  = 1450
)

type subject struct {
	name   string
	bridge string
	list   *libcni.NetworkConfigList
}

func main() {
	plugins := flag.String("plugins", "", "CNI bin dir with weft, bridge and host-local (default: $WEFT_CNI_PATH or bin/cni)")
	n := flag.Int("n", 200, "sequential ADD+DEL pairs per plugin")
	parallel := flag.Int("parallel", 40, "concurrent ADD+DEL pairs per round")
	rounds := flag.Int("rounds", 5, "parallel rounds per plugin")
	kernel := flag.Int("kernel", 20, "rounds of the kernel cost probe (0 skips it)")
	costs := flag.Int("cost", 30, "ADD+DEL pairs per plugin measured by rusage (0 skips them)")
	latency := flag.Bool("latency", true, "measure latency through libcni and print weft's traced breakdown")
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
		if !*latency {
			return commandCosts(bin, subjects, *costs)
		}
		fmt.Printf("CNI ADD+DEL latency, %d sequential pairs and %d rounds of %d in parallel per plugin\n\n", *n, *rounds, *parallel)
		b := &bench{rt: rt, settled: map[string][]time.Duration{}}
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
		report(subjects, results, b.settled)
		if err := breakdown(bin, work, subjects[0], *parallel); err != nil {
			return err
		}
		if *costs > 0 {
			if err := commandCosts(bin, subjects, *costs); err != nil {
				return err
			}
		}
		if *kernel == 0 {
			return nil
		}
		return kernelCosts(bin, *kernel)
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
	return []subject{{"weft", "bweft", weft}, {"bridge+host-local", "bref", ref}}, nil
}

// sample is one ADD+DEL pair's latency, and its two halves.
type sample struct{ pair, add, del time.Duration }

type bench struct {
	rt      *cnitest.Runtime
	seq     int
	err     error
	settled map[string][]time.Duration // per plugin, per block
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
		if err := b.settle(s); err != nil && b.err == nil {
			b.err = err
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

func report(subjects []subject, results map[string]map[string][]sample, settled map[string][]time.Duration) {
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
	fmt.Println()
	fmt.Println("settle: after a block's last DEL, until its bridge holds no port (untimed above)")
	for _, s := range subjects {
		d := settled[s.name]
		slices.Sort(d)
		fmt.Printf("%-20s blocks %3d  median %10s  max %10s\n", s.name, len(d), round(d[len(d)/2]), round(d[len(d)-1]))
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

// settle waits until s's bridge holds no port.
func (b *bench) settle(s subject) error {
	start := time.Now()
	for {
		br, err := netlink.LinkByName(s.bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", s.bridge, err)
		}
		links, err := nlutil.Dump("links", netlink.LinkList)
		if err != nil {
			return err
		}
		ports := 0
		for _, l := range links {
			if l.Attrs().MasterIndex == br.Attrs().Index {
				ports++
			}
		}
		if ports == 0 {
			b.settled[s.name] = append(b.settled[s.name], time.Since(start))
			return nil
		}
		if time.Since(start) > time.Minute {
			return fmt.Errorf("%s: %d ports still on %s a minute after the block", s.name, ports, s.bridge)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// breakdown runs weft again with its trace on: 40 sequential pairs and one
// parallel round, and prints the median of each phase, the plugin's own
// total, and the rest of the wall time (the shim and its exchange with the
// resident server, or, for a command it executed, exec, the Go runtime's
// start, exit).
func breakdown(bin, work string, weft subject, parallel int) error {
	floor, err := execFloor(filepath.Join(bin, "weft"))
	if err != nil {
		return err
	}
	os.Setenv(cni.TraceEnv, "1")
	defer os.Unsetenv(cni.TraceEnv)
	fmt.Printf("\nweft, traced (%s): medians in ms; exec = wall - plugin total (the shim's start, exit and exchange with the resident server; a command the shim executed: exec, Go runtime start, exit); VERSION alone (the shim executing weft-plugin) takes %s\n", cni.TraceEnv, round(floor))
	for _, mode := range []struct {
		name         string
		count, width int
	}{{"sequential", 40, 1}, {"parallel", parallel, parallel}} {
		var log lockedBuffer
		b := &bench{rt: cnitest.NewRuntimeStderr(bin, filepath.Join(work, "cache-trace-"+mode.name), &log), seq: 1 << 20, settled: map[string][]time.Duration{}}
		samples := b.run(weft, mode.count, mode.width)
		if b.err != nil {
			return b.err
		}
		traces := parseTraces(log.String())
		for _, cmd := range []string{"ADD", "DEL"} {
			field := add
			if cmd == "DEL" {
				field = del
			}
			wall := quantile(samples, field, 0.5)
			phases := traces[cmd]
			total := medianOf(phases["total"])
			fmt.Printf("%-10s %s wall %6.2f  exec %6.2f  plugin %6.2f:", mode.name, cmd, msOf(wall), msOf(wall)-total, total)
			for _, name := range phaseOrder[cmd] {
				fmt.Printf(" %s %.2f", name, medianOf(phases[name]))
			}
			fmt.Println()
		}
	}
	return nil
}

// phaseOrder lists the phases cni traces, in the order they run.
var phaseOrder = map[string][]string{
	"ADD": {"init", "parse", "netns", "store", "netlink", "result"},
	"DEL": {"init", "parse", "netlink", "reap-start", "store", "reap-wait"},
}

// execFloor is the median wall time of `weft` answering VERSION.
func execFloor(plugin string) (time.Duration, error) {
	var d []time.Duration
	for range 30 {
		cmd := exec.Command(plugin)
		cmd.Env = append(os.Environ(), "CNI_COMMAND=VERSION")
		cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("weft VERSION: %w: %s", err, out)
		}
		d = append(d, time.Since(start))
	}
	slices.Sort(d)
	return d[len(d)/2], nil
}

// parseTraces reads cni trace lines into command -> phase -> milliseconds.
func parseTraces(text string) map[string]map[string][]float64 {
	out := map[string]map[string][]float64{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != cni.TracePrefix {
			continue
		}
		if out[f[1]] == nil {
			out[f[1]] = map[string][]float64{}
		}
		for _, kv := range f[2:] {
			name, val, ok := strings.Cut(kv, "=")
			v, err := strconv.ParseFloat(strings.TrimSuffix(val, "ms"), 64)
			if ok && err == nil {
				out[f[1]][name] = append(out[f[1]][name], v)
			}
		}
	}
	return out
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// lockedBuffer collects the stderr of concurrent plugin runs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
