// Command proxybench measures weft-proxy (iptables mode, nftables mode as
// weft-nftables, eBPF mode as weft-ebpf) against upstream kube-proxy in
// iptables and in nftables mode, in one run, on the same API
// server state: a lab control plane (etcd, kube-apiserver,
// controller-manager) seeded with N selector-less ClusterIP Services, each
// with a hand-made EndpointSlice of -endpoints ready endpoints (every
// endpoint a unique address). Each proxy runs alone, one after the other,
// in a fresh network namespace of its own attached to the lab's underlay,
// and is measured for:
//
//   - from scratch: process start until /metrics counts its first sync
//     (kubeproxy_sync_proxy_rules_duration_seconds_count ≥ 1, polled every
//     100 ms), confirmed by the kernel: the ruleset dumped inside its
//     namespace must then hold one DNAT per endpoint and the ClusterIP of
//     every seeded Service, the last one included (completeState), and no
//     sync may have failed; else the time of the first dump that does,
//     after a successful sync, is taken and marked;
//   - one change: one endpoint of one EndpointSlice moved to a new address,
//     from the API write until /metrics counts a sync after which the ruleset
//     holds the new address (median of 5, on Services spread from the first
//     to the last seeded; a failed sync is an error), the proxy's own duration of that
//     sync (histogram _sum/_count deltas), and its own network programming
//     latency, from the trigger time the bench stamps on the slice as the
//     EndpointSlice controller would;
//   - peak memory: VmHWM of the proxy process after the changes;
//   - with -conn, the data path: the TCP connection rate from a pod to a
//     ClusterIP against the same pod dialled directly (conn.go);
//   - with -reset, the time from an endpoint's removal until its clients'
//     connections are reset (reset.go).
//
// Usage:
//
//	go run ./test/bench/proxybench [-services 1000,5000] [-endpoints 10] [-timeout 400s] [-proxies ...] [-conn] [-reset] [-baseline NAME@LABEL=DIR,...] [-seed-workers 64] [-seed-dynamic-ips]
//
// -baseline NAME@LABEL=DIR,... measures the weft proxy NAME again with
// DIR/weft-proxy (another build, e.g. the commit before a change) on the
// same state, in the same run, reported as NAME@LABEL.
//
// Run as root from the repository root, after `make build kube`. Everything
// happens in a private network and mount namespace (netnsutil.Isolate).
// -services are cumulative: each size adds Services to the previous one.
//
// Seeding goes through the API server, so the proxies' informers list and
// watch what a real cluster's would: -seed-workers creates at a time, over
// protobuf, with no client-side rate limit, before each size's
// measurements (no proxy runs while it seeds: each is started for its
// measurement and stopped after it, so its first sync is from scratch). The
// bench names each Service's ClusterIP from ServiceCIDRs of its own
// (10.97.0.0/16 on, 65,000 each, up to 195,000 Services): left to choose,
// kube-apiserver 1.36 allocates ClusterIPs one at a time under one lock
// (ipallocator.MetaAllocator.AllocateNextService), each allocation an
// IPAddress written to etcd (-seed-dynamic-ips does that, for
// comparison). A named address is allocated, its IPAddress written, in
// parallel. Progress lines every 30 s give the rate and the CPU cores the
// control plane took. Measured here (2026-11, 2 cores, another job
// running), 5,000 Services from an empty lab: 105 s (48/s) with JSON, 32
// workers and dynamic ClusterIPs; 42 s (119/s) as now, kube-apiserver
// then taking 1.1 cores, etcd 0.15, the controller-manager 0.25. The rate
// falls as Services add up (40/s at 14,000, 22-32/s at 20,000, the API
// server at 1.35-1.4 cores throughout): kube-apiserver 1.36 counts the
// allocated ClusterIPs after each allocation, listing every IPAddress
// (ipallocator.Allocator.createIPAddress: Used and Free for its metrics),
// so each Service costs it O(N) CPU and seeding O(N²). Seeding beyond
// about 20,000 Services through the API server takes longer than the
// measurements on these machines.
//
// Caps: each measurement stops at -timeout. A proxy that hits it is
// reported "> timeout" at that size, its changes skipped, and it is not run
// at the larger sizes ("†" in the table, with the size it hit the cap at),
// so kube-proxy runs beside weft up to the largest size it finishes within
// the cap.
//
// Runtime on the 2-core machines (2026-11): -services 1000 about 1 min;
// the default 1000,5000 about 12 min (weft and kube-proxy iptables each need
// 4-5 min to program 5000 Services from scratch); 10000 about 16 min
// (seeding 85 s; both iptables proxies hit the 400 s cap). A measurement that
// hits -timeout is reported as "> timeout", and its changes are skipped.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weftnet/weft/test/bench/benchlab"
)

func main() {
	switch spec := os.Getenv(connEnv); spec {
	case "":
	case "server":
		os.Exit(connServerMain())
	case "reset-server":
		os.Exit(resetServerMain())
	default:
		if strings.HasPrefix(spec, "reset-client;") {
			os.Exit(resetClientMain(spec))
		}
		os.Exit(connClientMain(spec))
	}
	sizes := flag.String("services", "1000,5000", "comma-separated numbers of Services to measure at (cumulative)")
	perSvc := flag.Int("endpoints", 10, "ready endpoints per Service")
	timeout := flag.Duration("timeout", 400*time.Second, "cap on each measurement (from scratch, and each change)")
	proxies := flag.String("proxies", "weft,weft-nftables,weft-ebpf,kp-iptables,kp-nftables", "which proxies to measure")
	conn := flag.Bool("conn", false, "also measure the TCP connection rate from a pod to a ClusterIP and to the pod directly")
	reset := flag.Bool("reset", false, "also measure the time from an endpoint's removal to the reset of its clients' connections")
	bin := flag.String("bin", "bin", "directory with weft-proxy, kube-proxy, kube-apiserver, kube-controller-manager, weftctl, weft-agent")
	seedWorkers := flag.Int("seed-workers", 64, "Services seeded at a time")
	dynamicIPs := flag.Bool("seed-dynamic-ips", false, "let the API server choose the ClusterIPs (one at a time: slow; at most about 60,000 Services), as the bench did before")
	baseline := flag.String("baseline", "", "other builds of weft-proxy, comma-separated NAME@LABEL=DIR: the weft proxy NAME (one of -proxies) is measured with DIR/weft-proxy too, as NAME@LABEL, in the same run")
	flag.Parse()

	benchlab.Main("proxybench", func(ctx context.Context) error {
		var ns []int
		for _, s := range strings.Split(*sizes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 {
				return fmt.Errorf("-services: bad size %q", s)
			}
			ns = append(ns, n)
		}
		slices.Sort(ns)
		binDir, err := filepath.Abs(*bin)
		if err != nil {
			return err
		}
		var subs []subject
		for _, s := range subjects() {
			if slices.Contains(strings.Split(*proxies, ","), s.name) {
				subs = append(subs, s)
			}
		}
		if *baseline != "" {
			for _, b := range strings.Split(*baseline, ",") {
				name, dir, ok := strings.Cut(b, "=")
				of, _, labelled := strings.Cut(name, "@")
				i := slices.IndexFunc(subs, func(s subject) bool { return s.name == of })
				if !ok || !labelled || i < 0 || !strings.HasPrefix(of, "weft") {
					return fmt.Errorf("-baseline: %q is not NAME@LABEL=DIR with NAME a weft proxy of -proxies", b)
				}
				dir, err := filepath.Abs(dir)
				if err != nil {
					return err
				}
				subs = slices.Insert(subs, i+1, withBinary(subs[i], name, filepath.Join(dir, "weft-proxy")))
				columns = slices.Insert(columns, slices.Index(columns, of)+1, name)
			}
		}
		return run(ctx, binDir, ns, subs, *perSvc, *seedWorkers, *dynamicIPs, *timeout, *conn, *reset)
	})
}

func run(ctx context.Context, binDir string, sizes []int, subs []subject, perSvc, workers int, dynamicIPs bool, timeout time.Duration, conn, reset bool) error {
	logDir, err := os.MkdirTemp("", "proxybench-logs")
	if err != nil {
		return err
	}
	begin := time.Now()
	l, err := benchlab.Up(ctx, "proxybench", binDir, "weft-proxy", "kube-proxy")
	defer func() {
		if err := l.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "proxybench: lab down:", err)
		}
	}()
	if err != nil {
		return err
	}
	fmt.Printf("proxybench: lab in %s, proxy logs in %s\n", l.Dir, logDir)
	client, kc := l.Client, l.Kubeconfig
	if err := benchlab.EnsureNode(ctx, client, nodeName, nodeIP); err != nil {
		return err
	}
	seedClient, err := l.SeedClient()
	if err != nil {
		return err
	}
	sd := &seeder{c: seedClient, workers: workers, labDir: l.Dir, dynamic: dynamicIPs}
	printMethod(perSvc, workers, timeout)
	if conn {
		printConnMethod()
	}
	if reset {
		printResetMethod()
	}
	e := &env{client: client, bin: binDir, kc: kc, logDir: logDir, timeout: timeout}
	defer func() {
		if e.ebpf != nil {
			e.ebpf.close()
		}
	}()
	if conn || reset {
		if err := e.ensureEBPFEnv(); err != nil {
			return err
		}
	}
	if conn {
		if e.connVIP, err = seedTarget(ctx, client, connSvc, connPort, connServer); err != nil {
			return err
		}
	}
	if reset {
		if e.resetVIP, err = seedTarget(ctx, client, resetSvc, resetPort, resetServer); err != nil {
			return err
		}
	}
	seeded := 0
	cappedAt := map[string]int{} // the size at which a proxy hit the cap
	for _, size := range sizes {
		fmt.Printf("\n== %d Services × %d endpoints: seeding %d more, no proxy running\n", size, perSvc, size-seeded)
		st, err := sd.seed(ctx, seeded, size, perSvc)
		if err != nil {
			return err
		}
		seeded = size
		e.vips = sd.vips
		how := "ClusterIPs named by the bench"
		if dynamicIPs {
			how = "ClusterIPs chosen by the API server"
		}
		fmt.Printf("   seeded %s (%d workers, protobuf, %s)\n", st, workers, how)
		res := map[string]result{}
		for _, s := range subs {
			if n, ok := cappedAt[s.name]; ok {
				res[s.name] = result{skippedAt: n}
				fmt.Printf("   %-12s not run: it hit the %v cap at %d Services\n", s.name, timeout, n)
				continue
			}
			t := time.Now()
			r := e.measure(ctx, s, size, perSvc)
			if r.timedOut {
				cappedAt[s.name] = size
			}
			res[s.name] = r
			status := "ok"
			switch {
			case r.timedOut:
				status = "timed out (see below)"
			case r.err != nil:
				status = "error (see below)"
			}
			fmt.Printf("   %-12s measured in %5.1fs: %s\n", s.name, time.Since(t).Seconds(), status)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		report(size, perSvc, timeout, res)
	}
	fmt.Printf("\nproxybench: total %.0fs\n", time.Since(begin).Seconds())
	return nil
}

// withBinary is s run from the weft-proxy binary prog, named name.
func withBinary(s subject, name, prog string) subject {
	b := s
	b.name = name
	b.args = func(bin, kc string) []string {
		args := s.args(bin, kc)
		args[0] = prog
		return args
	}
	return b
}
