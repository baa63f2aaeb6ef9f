// Command proxybench measures weft-proxy (iptables mode, nftables mode as
// weft-nftables, eBPF mode as weft-ebpf) against upstream kube-proxy in
// iptables and in nftables mode, in one run, on the same API
// server state: a lab control plane (etcd, kube-apiserver,
// controller-manager) seeded with N selector-less ClusterIP Services, each
// with a hand-made EndpointSlice of -endpoints ready endpoints. Each proxy
// runs alone, one after the other, in a fresh network namespace of its own
// attached to the lab's underlay, and is measured for:
//
//   - from scratch: process start until /metrics counts its first sync
//     (kubeproxy_sync_proxy_rules_duration_seconds_count ≥ 1, polled every
//     100 ms), confirmed by the kernel: the ruleset dumped inside its
//     namespace must then hold one DNAT per endpoint and service 0's ClusterIP;
//   - one change: one endpoint of one EndpointSlice moved to a new address,
//     from the API write until /metrics counts a sync after which the ruleset
//     holds the new address (median of 5), the proxy's own duration of that
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
//	go run ./test/bench/proxybench [-services 1000,5000] [-endpoints 10] [-timeout 400s] [-proxies ...] [-conn] [-reset] [-baseline NAME@LABEL=DIR,...]
//
// -baseline NAME@LABEL=DIR,... measures the weft proxy NAME again with
// DIR/weft-proxy (another build, e.g. the commit before a change) on the
// same state, in the same run, reported as NAME@LABEL.
//
// Run as root from the repository root, after `make build kube`. Everything
// happens in a private network and mount namespace (netnsutil.Isolate).
// -services are cumulative: each size adds Services to the previous one.
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
		return run(ctx, binDir, ns, subs, *perSvc, *timeout, *conn, *reset)
	})
}

func run(ctx context.Context, binDir string, sizes []int, subs []subject, perSvc int, timeout time.Duration, conn, reset bool) error {
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
	if err := ensureNode(ctx, client, nodeName, nodeIP); err != nil {
		return err
	}
	printMethod(perSvc)
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
	for _, size := range sizes {
		t := time.Now()
		if err := seed(ctx, client, seeded, size, perSvc); err != nil {
			return err
		}
		seedTime := time.Since(t)
		seeded = size
		svc0, err := clusterIP(ctx, client, 0)
		if err != nil {
			return err
		}
		fmt.Printf("\n== %d Services × %d endpoints: seeded %d Services + EndpointSlices in %.1fs (%d workers, QPS 500)\n",
			size, perSvc, size-seededBefore(sizes, size), seedTime.Seconds(), benchlab.Workers)
		res := map[string]result{}
		for _, s := range subs {
			t := time.Now()
			r := e.measure(ctx, s, size, perSvc, svc0)
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

func seededBefore(sizes []int, size int) int {
	prev := 0
	for _, s := range sizes {
		if s < size {
			prev = s
		}
	}
	return prev
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
