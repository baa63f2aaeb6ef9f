// Command dnsbench measures weft-dns against CoreDNS (kubernetes plugin,
// cache 30) in one run, on the same API server state: a lab control plane
// seeded with -services ClusterIP Services. Each server runs alone, one after
// the other, inside the lab node's network namespace (its weft-agent paused),
// pinned to one CPU (taskset -c -server-cpu), and is loaded by dnsperf pinned
// to the other CPU (-client-cpu) with -c 4 over a query file of every
// Service's A record in random order. Per server it reports:
//
//   - throughput: dnsperf's queries per second and average latency over
//     -duration after a warm-up pass (which also fills CoreDNS's cache);
//   - p99 latency: from a second dnsperf run of -duration with -v, whose
//     per-query latencies are collected here (dnsperf 2.10 prints no
//     percentiles); that run's load is what dnsperf can send while printing;
//   - memory: VmRSS after the load, and VmHWM.
//
// Usage:
//
//	go run ./test/bench/dnsbench [-services 10000] [-duration 20s] [-servers weft,coredns]
//
// Run as root from the repository root, after `make build kube` and
// hack/build-coredns.sh (make bench does both). Everything happens in a
// private network and mount namespace (netnsutil.Isolate).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/weftnet/weft/test/bench/benchlab"
)

type options struct {
	services             int
	duration, warmup     time.Duration
	clients              int
	serverCPU, clientCPU string
	bin                  string
	servers              []string
}

func main() {
	var o options
	var servers string
	flag.IntVar(&o.services, "services", 10000, "number of Services")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "length of each measured dnsperf run")
	flag.DurationVar(&o.warmup, "warmup", 5*time.Second, "length of the warm-up run")
	flag.IntVar(&o.clients, "clients", 4, "dnsperf -c")
	flag.StringVar(&o.serverCPU, "server-cpu", "1", "CPU list (taskset -c) for the DNS server under test")
	flag.StringVar(&o.clientCPU, "client-cpu", "0", "CPU list (taskset -c) for dnsperf")
	flag.StringVar(&servers, "servers", "weft,coredns", "which servers to measure")
	flag.StringVar(&o.bin, "bin", "bin", "directory with weft-dns, coredns, kube-apiserver, kube-controller-manager, weftctl, weft-agent")
	flag.Parse()
	o.servers = strings.Split(servers, ",")

	benchlab.Main("dnsbench", func(ctx context.Context) (err error) {
		if o.bin, err = filepath.Abs(o.bin); err != nil {
			return err
		}
		return run(ctx, o)
	})
}

func run(ctx context.Context, o options) error {
	if _, err := os.Stat("/usr/bin/dnsperf"); err != nil {
		return fmt.Errorf("dnsperf missing (run `make deps`): %w", err)
	}
	begin := time.Now()
	l, err := benchlab.Up(ctx, "dnsbench", o.bin, "weft-dns", "coredns")
	defer func() {
		if err := l.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "dnsbench: lab down:", err)
		}
	}()
	if err != nil {
		return err
	}
	dir, client := l.Dir, l.Client
	fmt.Printf("dnsbench: lab and logs in %s\n", dir)
	t := time.Now()
	if err := seed(ctx, client, o.services); err != nil {
		return err
	}
	fmt.Printf("\n== %d Services: seeded in %.1fs (%d workers)\n", o.services, time.Since(t).Seconds(), benchlab.Workers)
	queries := filepath.Join(dir, "queries.txt")
	if err := writeQueries(queries, o.services); err != nil {
		return err
	}
	e := &env{o: o, dir: dir, kc: l.Kubeconfig, ns: l.Node.NSPath(), queries: queries}
	res := map[string]result{}
	for _, s := range subjects() {
		if !slices.Contains(o.servers, s.name) {
			continue
		}
		r := e.measure(ctx, s)
		res[s.name] = r
		if r.err != nil {
			fmt.Printf("   %-8s error: %v\n", s.name, r.err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	report(o, res)
	fmt.Printf("\ndnsbench: total %.0fs\n", time.Since(begin).Seconds())
	return nil
}
