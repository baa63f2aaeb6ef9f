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
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
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

	if !netnsutil.Isolated() {
		forwardSignals()
	}
	code, reexeced, err := netnsutil.Isolate()
	if err != nil {
		fatal(err)
	}
	if reexeced {
		os.Exit(code)
	}
	if o.bin, err = filepath.Abs(o.bin); err != nil {
		fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fatal(err)
	}
}

func run(ctx context.Context, o options) error {
	for _, b := range []string{"weft-dns", "coredns", "kube-apiserver", "kube-controller-manager", "weftctl", "weft-agent"} {
		if _, err := os.Stat(filepath.Join(o.bin, b)); err != nil {
			return fmt.Errorf("%w (run `make build kube` and hack/build-coredns.sh first)", err)
		}
	}
	if _, err := os.Stat("/usr/bin/dnsperf"); err != nil {
		return fmt.Errorf("dnsperf missing (run `make deps`): %w", err)
	}
	dir, err := os.MkdirTemp("", "dnsbench")
	if err != nil {
		return err
	}
	begin := time.Now()
	fmt.Printf("dnsbench: lab and logs in %s\n", dir)
	defer func() {
		if pid, ok := lab.PID(dir, "node1-agent"); ok {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		if err := lab.Down(dir); err != nil {
			fmt.Fprintln(os.Stderr, "dnsbench: lab down:", err)
		}
	}()
	if err := lab.Up(ctx, lab.Options{Nodes: 1, Routing: "hostgw", Dir: dir, BinDir: o.bin, APIPort: lab.APIServerPort, Out: os.Stdout}); err != nil {
		return err
	}
	// weft-agent's proxy would program every Service and take CPU from the
	// server measured: pause it.
	if pid, ok := lab.PID(dir, "node1-agent"); ok {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	kc := filepath.Join(dir, "bench.kubeconfig")
	admin, err := os.ReadFile(lab.AdminKubeconfig(dir))
	if err != nil {
		return err
	}
	inLab := fmt.Sprintf("https://%s:%d", lab.ControlIP, lab.APIServerPort)
	if err := os.WriteFile(kc, []byte(strings.Replace(string(admin), fmt.Sprintf("https://127.0.0.1:%d", lab.APIServerPort), inLab, 1)), 0o600); err != nil {
		return err
	}
	cfg, err := lab.RESTConfig(lab.AdminKubeconfig(dir))
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	t := time.Now()
	if err := seed(ctx, client, o.services); err != nil {
		return err
	}
	fmt.Printf("\n== %d Services: seeded in %.1fs (%d workers)\n", o.services, time.Since(t).Seconds(), seedWorkers)
	queries := filepath.Join(dir, "queries.txt")
	if err := writeQueries(queries, o.services); err != nil {
		return err
	}
	var node lab.Member
	st, err := lab.Load(dir)
	if err != nil {
		return err
	}
	for _, m := range st.Members {
		if m.Name == "node1" {
			node = m
		}
	}
	e := &env{o: o, dir: dir, kc: kc, ns: node.NSPath(), queries: queries}
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

// forwardSignals runs in the parent of Isolate: it survives SIGINT/SIGTERM
// and passes them on to the isolated child, which then removes the lab.
func forwardSignals() {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		for sig := range ch {
			tasks, _ := filepath.Glob("/proc/self/task/*/children")
			for _, t := range tasks {
				b, _ := os.ReadFile(t)
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = syscall.Kill(pid, sig.(syscall.Signal))
					}
				}
			}
		}
	}()
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "dnsbench:", err)
	os.Exit(1)
}
