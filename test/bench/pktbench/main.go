// Command pktbench measures the packet rate of NodePort traffic from
// outside the node through weft-proxy (eBPF on tc as weft-ebpf, nftables
// as weft-nftables; DSR and XDP subjects when the binary has their flags)
// and upstream kube-proxy (iptables and nftables modes), against plain
// routing to the pods (the subject "route"), in one run, on
// the same API server state: a lab control plane (benchlab) holding two
// Nodes and a selector-less UDP NodePort Service, externalTrafficPolicy
// Cluster, whose EndpointSlice lists backends on the measured node and on
// another node.
//
// Topology, made for each subject on its own (its proxy's rules, hooks
// and pins stay in its namespaces), in namespaces of the bench's
// private network world (netnsutil.Isolate; world.go states the address
// plan): a generator namespace (the outside client) on a veth to the
// measured node's uplink; the node with a pod bridge and -local backend
// pods; a second node, routed host-gw (each node routes the other's pod
// CIDR via the other's address), with -remote backend pods; both nodes on
// the lab's underlay so that the proxy reaches the API server. The
// proxy runs alone on the measured node (a DSR subject runs it on both).
//
// Per subject, before any number:
//
//  1. the path works: every backend runs a UDP echo server, and datagrams
//     from the generator's namespace to the NodePort, from fresh sockets
//     (new flows), must get answers from every backend, local and remote,
//     with the NodePort as the answer's source (the proxy's reverse
//     translation); the proxy's readiness is this probe (-ready-timeout);
//  2. the echo servers stop and each backend drops what arrives at its
//     interface's tcx ingress (IPv4 only: ARP keeps the node's neighbour
//     entries), after the veth counted it in rx_packets: nothing answers,
//     no reply or ICMP error flows back through the node;
//  3. the packets counted are the generator's: a 300 ms generator run with
//     a packet socket on every backend's interface must capture, on every
//     backend, packets carrying the payload's magic and this run's nonce,
//     for the backend's address and target port, and at most 1 other IPv4
//     packet in 100 (such packets are printed);
//     the sources the backends saw are printed (the masquerade address
//     under SNAT); the backends' counters over an idle second are printed.
//
// Then -runs rounds over the subjects (set up and checked first, each on
// its own world, their proxies idle while another is measured; a round
// measures one subject after the other, so that a change of the machine's
// load falls on all of them alike), each a pair of generator runs of
// -duration: a baseline run,
// the same frames sent on another veth of the generator to a sink
// namespace that drops every IPv4 packet at its tcx ingress (so the
// baseline is the same whatever a subject attaches to the node's uplink,
// XDP included), and a forward run, to the node, whose proxy forwards them.
//
// The generator (gen.go) is this program in the generator's namespace: one
// thread writes pre-built frames (-pkt-size bytes, Ethernet header
// included, FCS not) of -flows flows (UDP source ports 10000 on) to a
// packet socket with PACKET_QDISC_BYPASS, in sendmmsg batches of -batch,
// as fast as it can, and reports the packets sent and the thread's CPU
// time (schedstat nanoseconds).
//
// Measured per run: offered packets (what the generator sent), arrived
// (the node uplink's rx_packets; the sink's in a baseline), forwarded (the
// sum of the backends' rx_packets), and the pipeline's CPU: the generator thread's run time
// plus the ksoftirqd threads' (all CPUs). On veth the receiver's
// processing runs on the sender's CPU: a frame written to the generator's
// veth is received by the node in the softirq that runs when the sending
// thread re-enables bottom halves, in that thread, and so is every hop
// after it (node -> bridge -> pod, node -> node2 -> pod), except what the
// kernel defers to ksoftirqd. So the pipeline's CPU is the sender's, the
// node's and the backends' together, and the node's part is separated by
// the baseline: node CPU per forwarded packet = (forward run's pipeline
// CPU - baseline CPU per packet × packets offered) / packets forwarded,
// and node Mpps per core = 1000 / that in ns. Ratios are against
// kube-proxy nftables (the upstream peer) and against weft-ebpf (weft's
// own tc path), per core and by the clock; each figure is the median over
// the pairs. The subject "route" runs no proxy: the generator sends the
// same number of flows to the pods' own addresses (flow i to pod i mod n,
// the target port), which the node routes without netfilter hooks; its
// node CPU per packet is what routing and the shared hops after the node
// cost, and each proxy's "node CPU above route" is that proxy's own cost
// per packet (NAT, conntrack, its programs), also given as a ratio to
// kube-proxy nftables' own cost.
//
// Limits: the node's CPU per packet includes the hops after it that every
// subject shares (the second node's forwarding and the pods' veths and
// drop), so the ratios understate the differences between the proxies'
// own costs; the baseline ends in the sink's veth receive and tcx hook,
// which the node's uplink pays too (so the node's figure starts after its
// tcx ingress hook has been entered, roughly). The pipeline runs on one CPU at a time, so the
// forwarded rate is that of one core shared by the sender and the node;
// the machine's other core runs the proxy and whatever else runs on the
// machine (printed: "other load"), and both are shared with other work,
// so rates by the clock are noisy; the CPU figures are less so (a
// thread's run time does not grow while it waits), though interrupts and
// softirq work of other traffic landing in the generator's thread count
// as the pipeline's. Counters are read before and after each run (50 ms
// after the generator stops). UDP only.
//
// Usage:
//
//	go run ./test/bench/pktbench [-duration 2s] [-runs 5] [-subjects ...] [-pkt-size 64] [-flows 1024] [-batch 64] [-local 2] [-remote 2]
//
// Run as root from the repository root, after `make build kube image`.
// Runtime on the 2-core machines with the defaults: about 2.5 minutes
// (the lab about 20 s, each subject's set-up and checks a few seconds,
// then 5 rounds of 4 s per subject).
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

func main() {
	switch os.Getenv(roleEnv) {
	case "gen":
		os.Exit(genMain())
	case "echo":
		os.Exit(echoMain())
	}
	var o options
	flag.DurationVar(&o.duration, "duration", 2*time.Second, "length of each generator run")
	flag.IntVar(&o.runs, "runs", 5, "rounds: pairs of runs (baseline, forward) per subject")
	flag.IntVar(&o.pktSize, "pkt-size", 64, fmt.Sprintf("frame size in bytes, Ethernet header included, FCS not (%d..%d)", minFrame, maxFrame))
	flag.IntVar(&o.flows, "flows", 1024, "UDP flows (source ports) the generator cycles over")
	flag.IntVar(&o.batch, "batch", 64, "packets per sendmmsg call")
	flag.IntVar(&o.local, "local", 2, "backends on the measured node")
	flag.IntVar(&o.remote, "remote", 2, "backends on the other node")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 90*time.Second, "how long a proxy may take until every backend answers through the NodePort")
	subjects := flag.String("subjects", defaultSubjects, "subjects to measure, in order (a subject whose flags the binary lacks is reported as not in this build); the menu: "+menu())
	bin := flag.String("bin", "bin", "directory with weft-proxy, kube-proxy and the lab's binaries")
	flag.Parse()

	benchlab.Main("pktbench", func(ctx context.Context) error {
		if o.pktSize < minFrame || o.pktSize > maxFrame || o.runs < 1 || o.duration <= 0 || o.flows < 1 || o.flows > 50000 || o.batch < 1 || o.local < 1 || o.remote < 1 || o.local > 200 || o.remote > 200 {
			return fmt.Errorf("bad flags: -pkt-size %d..%d, -runs, -duration, -batch, -local, -remote at least 1, -flows 1..50000", minFrame, maxFrame)
		}
		var subs []subject
		for _, name := range strings.Split(*subjects, ",") {
			i := slices.IndexFunc(allSubjects(), func(s subject) bool { return s.name == strings.TrimSpace(name) })
			if i < 0 {
				return fmt.Errorf("-subjects: no subject %q (the menu: %s)", name, menu())
			}
			subs = append(subs, allSubjects()[i])
		}
		binDir, err := filepath.Abs(*bin)
		if err != nil {
			return err
		}
		return bench(ctx, binDir, o, subs)
	})
}

func menu() string {
	var names []string
	for _, s := range allSubjects() {
		names = append(names, s.name)
	}
	return strings.Join(names, ",")
}

func bench(ctx context.Context, binDir string, o options, subs []subject) error {
	begin := time.Now()
	logDir, err := os.MkdirTemp("", "pktbench-logs")
	if err != nil {
		return err
	}
	l, err := benchlab.Up(ctx, "pktbench", binDir, "weft-proxy", "kube-proxy")
	defer func() {
		if err := l.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "pktbench: lab down:", err)
		}
	}()
	if err != nil {
		return err
	}
	fmt.Printf("pktbench: lab in %s, proxy logs in %s\n", l.Dir, logDir)
	if err := seed(ctx, l.Client, plan(o.local, o.remote)); err != nil {
		return err
	}
	drop, err := dropProgram()
	if err != nil {
		return fmt.Errorf("loading the drop program: %w", err)
	}
	defer drop.Close()
	e := &env{bin: binDir, kc: l.Kubeconfig, logDir: logDir, opts: o, drop: drop, nonce: newNonce()}
	defer func() {
		if e.ebpf != nil {
			e.ebpf.close()
		}
	}()
	printMethod(o)
	// Every subject is set up and checked first, each on its own world,
	// its proxy idle meanwhile; then the pairs of runs go round the
	// subjects, one at a time, so that a change in the machine's load
	// falls on all of them alike.
	results := make([]result, len(subs))
	sessions := make([]*session, len(subs))
	defer func() {
		for _, ss := range sessions {
			if ss != nil {
				ss.close()
			}
		}
	}()
	for i, s := range subs {
		t := time.Now()
		sessions[i] = e.prepare(ctx, s, &results[i])
		r := results[i]
		status := "ready"
		switch {
		case r.notRun != "":
			status = "not run: " + r.notRun
		case r.err != nil:
			status = "error: " + r.err.Error()
		}
		fmt.Printf("\n== %s (%.0fs): %s\n", s.name, time.Since(t).Seconds(), status)
		describe(os.Stdout, r)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	for round := range o.runs {
		fmt.Printf("\n== round %d of %d\n", round+1, o.runs)
		for i, ss := range sessions {
			if ss == nil {
				continue
			}
			pr, err := e.pair(ss)
			if err != nil {
				results[i].err = fmt.Errorf("round %d: %w", round+1, err)
				ss.close()
				sessions[i] = nil
			} else {
				results[i].pairs = append(results[i].pairs, pr)
			}
			describeRun(os.Stdout, results[i], len(results[i].pairs)-1)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	fmt.Printf("\n== NodePort UDP, %d-byte frames, %d flows, %d local + %d remote backends, %d × %v per subject (medians)\n", o.pktSize, o.flows, o.local, o.remote, o.runs, o.duration)
	report(os.Stdout, results)
	fmt.Printf("\npktbench: total %.0fs\n", time.Since(begin).Seconds())
	return nil
}

func printMethod(o options) {
	fmt.Printf(`
pktbench: UDP to a NodePort (eTP Cluster) from a generator namespace through
the measured node to %d local and %d remote backends (host-gw), each subject on
fresh namespaces after a probe (every backend answers through the NodePort) and
a sample check (the backends capture the generator's packets, nonce and all).
Per pair of runs of %v: a baseline (the same frames to a sink namespace that
drops them at its veth's ingress), then a forward run (to the node).
forwarded = the backends' rx_packets (counted before their drop program);
CPU = the generator thread's run time + ksoftirqd's: on veth the node's (and
the backends') receive processing runs in the sender's softirq, on its CPU.
node CPU / fwd pkt = (run CPU - baseline CPU/pkt x offered) / forwarded; it
includes the hops after the node that every subject shares (node2's forwarding,
bridges, the pods' veths), so ratios understate the proxies' own differences.
Mpps per core = 1000 / that ns. "route" runs no proxy (packets to the pods'
own addresses, routed): "node CPU above route" is a proxy's own cost per
packet, and its ratio to kube-proxy nftables' own. 2 cores shared with other work: rates by the
clock are noisy ("other load" is the rest of the machine's work, in cores);
CPU per packet less so (run time does not grow while a thread waits), but
other work's interrupts landing in the generator's thread count as its own.
`, o.local, o.remote, o.duration)
}
