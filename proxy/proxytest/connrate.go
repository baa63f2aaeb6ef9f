package proxytest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/model"
)

// ConnRateIP is the ClusterIP of the connection-rate benchmark's real
// Service (port 80 on its server pod): in SvcCIDR, and no BenchObjects
// Service's (their last octets run from 1 to 250).
const ConnRateIP = "10.96.0.254"

// ConnRateBackend is one backend under BenchConnRate.
type ConnRateBackend struct {
	Mode string
	// Prepare, if set, adds to c the environment of the backend of one
	// size (eBPF: its own cgroup and pin path).
	Prepare func(b *testing.B, c *proxy.Config)
	// Enter, if set, makes the process's next connections go through the
	// backend built with c (eBPF: the process joins c's cgroup).
	Enter func(b *testing.B, c proxy.Config)
	// Programmed returns an error unless the TCP frontends of svc (its
	// ClusterIP, every port) are in the kernel of the backend built with
	// c, with eps as their endpoints. It runs in the node's namespace.
	Programmed func(c proxy.Config, svc *corev1.Service, eps *discoveryv1.EndpointSlice) error
}

// connRateNode is one size of the benchmark: a node namespace with its
// server pod and a backend programmed with n BenchObjects Services and the
// real one.
type connRateNode struct {
	n    int
	ns   string // the node's namespace path
	pod  string // the server pod's name (its answer to '?')
	cfg  proxy.Config
	took time.Duration // the first sync
}

// BenchConnRate measures the rate of new TCP connections from the node to
// a ClusterIP (ConnRateIP:80, one endpoint: a server pod), the backend
// holding n other Services (BenchObjects: two ports, ten endpoints each),
// for each n of WEFT_CONNRATE_SERVICES (default 1000,100000). Each size
// has its own node namespace, server pod and backend, programmed once;
// before any timing the real Service must answer from the size's pod
// through the ClusterIP and the last bench Service be in the kernel.
// One op is a round: WEFT_CONNRATE_CONNS connections (default 20) to
// each size in turn, the order reversed every other round: short rounds,
// so that the bursts of load of a shared machine fall on every size
// alike. It reports the rate at each size over all rounds (conn/s-N) and,
// for every size after the first, the ratio of its rate to the first
// size's over all rounds (x-N) and the quartiles of the ratio of one round
// (x-N-p25, x-N-median, x-N-p75). A connection is OneConn's. Run it for a
// time (-benchtime 20s) or a number of rounds (-benchtime 100x).
func BenchConnRate(b *testing.B, be ConnRateBackend) {
	if !netnsutil.Isolated() {
		b.Skip("needs root (private network namespaces)")
	}
	sizes := envInts(b, "WEFT_CONNRATE_SERVICES", []int{1000, 100000})
	conns := envInts(b, "WEFT_CONNRATE_CONNS", []int{20})[0]
	nodes := make([]*connRateNode, len(sizes))
	for i, n := range sizes {
		nodes[i] = newConnRateNode(b, be, i, n)
		b.Logf("%s: %d Services + 1 programmed in %v", be.Mode, n, nodes[i].took.Round(time.Millisecond))
	}
	addr := ConnRateIP + ":80"
	dur := make([]time.Duration, len(nodes))
	ratios := make([][]float64, len(nodes))
	round := 0
	// Each measure runs in its node's namespace (the goroutine's thread
	// there for the batch) and, for eBPF, with the process in its cgroup.
	measure := func(nd *connRateNode) time.Duration {
		if be.Enter != nil {
			be.Enter(b, nd.cfg)
		}
		var d time.Duration
		err := netnsutil.Do(nd.ns, func() error {
			OneConn(b, addr) // warm
			t0 := time.Now()
			for range conns {
				OneConn(b, addr)
			}
			d = time.Since(t0)
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	for b.Loop() {
		order := slices.Clone(nodes)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		took := map[*connRateNode]time.Duration{}
		for _, nd := range order {
			took[nd] = measure(nd)
		}
		for i, nd := range nodes {
			dur[i] += took[nd]
			ratios[i] = append(ratios[i], took[nodes[0]].Seconds()/took[nd].Seconds())
		}
		round++
	}
	for i, nd := range nodes {
		rate := float64(conns*round) / dur[i].Seconds()
		b.ReportMetric(rate, fmt.Sprintf("conn/s-%d", nd.n))
		if i == 0 {
			continue
		}
		b.ReportMetric(dur[0].Seconds()/dur[i].Seconds(), fmt.Sprintf("x-%d", nd.n))
		r := slices.Sorted(slices.Values(ratios[i]))
		q := func(f float64) float64 { return r[int(f*float64(len(r)-1)+0.5)] }
		b.ReportMetric(q(0.25), fmt.Sprintf("x-%d-p25", nd.n))
		b.ReportMetric(q(0.5), fmt.Sprintf("x-%d-median", nd.n))
		b.ReportMetric(q(0.75), fmt.Sprintf("x-%d-p75", nd.n))
		b.Logf("%s: %d Services %.0f conn/s, %d Services %.0f conn/s; ratio %.3f, by round (%d rounds of %d connections each) min %.3f p25 %.3f median %.3f p75 %.3f max %.3f",
			be.Mode, nodes[0].n, float64(conns*round)/dur[0].Seconds(), nd.n, rate, dur[0].Seconds()/dur[i].Seconds(), round, conns,
			r[0], q(0.25), q(0.5), q(0.75), r[len(r)-1])
	}
}

// newConnRateNode makes size i: its node namespace (an uplink holding
// NodeIP, a veth to nowhere; the veth to its server pod), the backend
// programmed with n bench Services and the real one, checked.
func newConnRateNode(b *testing.B, be ConnRateBackend, i, n int) *connRateNode {
	b.Helper()
	nd := &connRateNode{n: n, pod: fmt.Sprintf("connrate-pod-%d", i)}
	node := fmt.Sprintf("connrate-node-%d", i)
	var err error
	if nd.ns, err = netnsutil.NewNamed(node); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = netnsutil.Delete(node) })
	for _, args := range [][]string{
		{"-n", node, "link", "add", Uplink, "type", "veth", "peer", "name", Uplink + "p"},
		{"-n", node, "addr", "add", NodeIP + "/24", "dev", Uplink},
		{"-n", node, "link", "set", Uplink, "up"},
		{"-n", node, "link", "set", Uplink + "p", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			b.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	server := BenchPod(b, node, nd.pod, "crpod0")
	// Every ClusterIP routed (BenchObjects' go past SvcCIDR): a backend's
	// check may connect to any of them.
	if out, err := exec.Command("ip", "-n", node, "route", "add", "default", "dev", "crpod0").CombinedOutput(); err != nil {
		b.Fatalf("ip route: %v: %s", err, out)
	}
	svcs, sl := BenchObjects(n)
	real := Service("connrate", ConnRateIP, nil)
	realEPs := Slice("connrate", Endpoint{IP: server.Addr().String(), Node: NodeName})
	st, errs := model.Build(append(svcs, real), append(sl, realEPs))
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	nd.cfg = proxy.Config{Mode: be.Mode, NodeName: NodeName, NodeIPs: []netip.Addr{netip.MustParseAddr(NodeIP)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(Cluster)},
		// No pin directory of the machine's (Build cleans up other modes).
		BPFPinPath: filepath.Join(b.TempDir(), "bpf")}
	if be.Prepare != nil {
		be.Prepare(b, &nd.cfg)
	}
	var backend proxy.Backend
	err = netnsutil.Do(nd.ns, func() error {
		var err error
		if _, backend, err = proxy.Build(nd.cfg); err != nil {
			return err
		}
		t0 := time.Now()
		if err := backend.Sync(st, true); err != nil {
			return err
		}
		nd.took = time.Since(t0)
		return nil
	})
	if backend != nil {
		b.Cleanup(func() { _ = netnsutil.Do(nd.ns, backend.Cleanup) })
	}
	if err != nil {
		b.Fatalf("%s with %d Services: %v", be.Mode, n, err)
	}
	// Before any timing: the last bench Service is in the kernel, the
	// real one answers from this size's pod through its ClusterIP.
	if be.Enter != nil {
		be.Enter(b, nd.cfg)
	}
	err = netnsutil.Do(nd.ns, func() error {
		if err := be.Programmed(nd.cfg, svcs[n-1], sl[n-1]); err != nil {
			return fmt.Errorf("the last bench Service %s (%s): %w", svcs[n-1].Name, svcs[n-1].Spec.ClusterIP, err)
		}
		who, err := WhoAnswers(ConnRateIP+":80", 2*time.Second)
		if err == nil && who != nd.pod {
			err = fmt.Errorf("%s answered, want %s", who, nd.pod)
		}
		if err != nil {
			return fmt.Errorf("the real Service %s:80: %w", ConnRateIP, err)
		}
		return nil
	})
	if err != nil {
		b.Fatalf("%s with %d Services: %v", be.Mode, n, err)
	}
	return nd
}

// envInts reads a comma-separated list of positive numbers from the
// environment variable name; def when it is empty.
func envInts(b *testing.B, name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("%s=%q: want positive numbers, comma-separated", name, v)
		}
		out = append(out, n)
	}
	return out
}
