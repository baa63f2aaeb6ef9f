package bgp_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/fsutil"
	"github.com/weftnet/weft/internal/nlutil"
	process "github.com/weftnet/weft/internal/proc"
	"github.com/weftnet/weft/routing/bgp"
)

// The load of BenchmarkConvergence: 100 nodes, two of them route
// reflectors, and a ToR router peering with the reflectors only, which
// later announces torPrefixes prefixes of torRange.
const (
	convergenceNodes = 100
	torPrefixes      = 900
	installRuns      = 30 // podCIDRs assigned (and unassigned again)
	deleteRuns       = 10 // nodes deleted (and added back)
)

var torRange = netip.MustParsePrefix("100.64.0.0/10")

// torPrefix is the ToR's n-th announced /24.
func torPrefix(n int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + n/256), byte(n % 256), 0}), 24)
}

// BenchmarkConvergence runs the simulated cluster: 100 nodes, each
// a real speaker (the routing/bgp controller an agent runs with only
// routing on) in a process and network namespace of its own, on one L2
// fabric; node-1 and node-2 are route reflectors (chosen by label), the
// others their clients. It measures
//
//   - install: a podCIDR newly assigned to a client until the route is in
//     the kernels of all 99 other nodes;
//   - delete: a client deleted from the API view until its podCIDR is gone
//     from all 99 others (the node is then added back: rejoin, until its
//     podCIDR is everywhere again and it has every other node's);
//
// as median, p99 and max over the runs, and the peak RSS (VmHWM) of a
// client's and a reflector's process with the nodes' 100 podCIDRs, and
// again after the ToR has announced 900 more prefixes (1,000 routes; the
// reflectors pass them on to the clients; tor-ms: until every node has
// installed them).
//
// The node processes read their API view when its file changes (inotify,
// as an agent's informer tells it); the benchmark reads the kernels with
// one netlink route dump per namespace still waiting, in sweeps (sweep-ms:
// their mean duration): a time is late by at most one sweep plus a 2 ms
// pause.
// One run is the whole experiment: run it with -benchtime=1x.
func BenchmarkConvergence(b *testing.B) {
	rr := map[string]string{"rr": "true"}
	tor := routerIP4(1)
	var torAnnounces []netip.Prefix
	w := newWorld(b, worldSpec{
		size:    convergenceNodes,
		routers: 1,
		labels:  map[int]map[string]string{1: rr, 2: rr},
		config: func(string) string {
			return fmt.Sprintf("asn: %d\nrouteReflectors: {nodeSelector: {rr: 'true'}}\n"+
				"peers:\n- {name: tor, address: %s, asn: %d, nodeSelector: {rr: 'true'}}\n"+
				"import: {prefixes: [%s]}\n", clusterASN, tor, routerASN, torRange)
		},
		podCIDRs: func(i int) []netip.Prefix { return []netip.Prefix{podCIDR4(i)} },
		router: func(int) bgp.Plan {
			p := bgp.Plan{ASN: routerASN, RouterID: tor, RestartTime: 120}
			for i := 1; i <= 2; i++ {
				p.Neighbors = append(p.Neighbors, bgp.Neighbor{Name: nodeName(i), Address: nodeIP4(i), ASN: clusterASN, Local: tor, External: true, IPv4: true, Passive: true})
			}
			for _, a := range torAnnounces {
				p.Announcements = append(p.Announcements, bgp.Announcement{Prefix: a, NextHop: tor, Kind: bgp.KindPodCIDR})
			}
			return p
		},
	})
	k := w.kernels()
	all := make([]int, 0, convergenceNodes)
	for i := 1; i <= convergenceNodes; i++ {
		all = append(all, i)
	}
	// The conditions the benchmark waits for: each says what a node's
	// routes lack, or "" when they are as wanted.
	hasPod := func(j int, p netip.Prefix) check {
		return func(i int, rs []netlink.Route, _ bool) string {
			if i == j || slices.ContainsFunc(rs, func(r netlink.Route) bool {
				return nlutil.RouteDst(r) == p && r.Gw.Equal(nodeIP4(j).AsSlice())
			}) {
				return ""
			}
			return fmt.Sprintf("no route to %s via %s", p, nodeName(j))
		}
	}
	lacks := func(p netip.Prefix) check {
		return func(_ int, rs []netlink.Route, _ bool) string {
			if slices.ContainsFunc(rs, func(r netlink.Route) bool { return nlutil.RouteDst(r) == p }) {
				return "still routes " + p.String()
			}
			return ""
		}
	}
	// exactly: the other nodes' podCIDRs and extra, nothing else.
	exactly := func(extra []netip.Prefix) check {
		want := map[netip.Prefix]int{} // the node whose podCIDR it is, or 0
		for j := 1; j <= convergenceNodes; j++ {
			if w.alive[j] {
				want[podCIDR4(j)] = j
			}
		}
		for _, p := range extra {
			want[p] = 0
		}
		return func(i int, rs []netlink.Route, detail bool) string {
			ok := len(rs) == len(want)-1
			var unwanted []string
			for _, r := range rs {
				dst := nlutil.RouteDst(r)
				if j, in := want[dst]; !in || j == i {
					ok = false
					unwanted = append(unwanted, dst.String())
				}
			}
			if ok {
				return ""
			}
			if !detail {
				return "not yet"
			}
			var missing []string
			for p, j := range want {
				if j != i && !slices.ContainsFunc(rs, func(r netlink.Route) bool { return nlutil.RouteDst(r) == p }) {
					missing = append(missing, p.String())
				}
			}
			slices.Sort(missing)
			return fmt.Sprintf("%d routes; %d missing %v; not wanted %v", len(rs), len(missing), missing[:min(len(missing), 5)], unwanted)
		}
	}
	// rewrite hands every node its new view: encoded first, then written
	// file after file (as the API server sends a watch event to every
	// agent), and returns when the first was written.
	rewrite := func() time.Time {
		data := map[int][]byte{}
		for i := 1; i <= convergenceNodes; i++ {
			d, err := json.Marshal(w.state(i))
			if err != nil {
				b.Fatal(err)
			}
			data[i] = d
		}
		t0 := time.Now()
		for i, d := range data {
			if err := fsutil.WriteFileAtomic(w.nodes[i].state, d, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		return t0
	}
	start := time.Now()
	k.until(b, all, 5*time.Minute, exactly(nil))
	b.Logf("%d nodes converged %s after their speakers started", convergenceNodes, time.Since(start).Round(time.Millisecond))
	// The runs measure a cluster at rest, not the tail of 100 nodes
	// starting at once (sessions, End-of-RIB syncs).
	b.Logf("nodes idle %s", w.idle(b, 60*time.Second))

	var install, del, rejoin []time.Duration
	b.ResetTimer()
	for range b.N {
		for n := range installRuns {
			j := 3 + (n*37)%(convergenceNodes-2) // a client
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 245, byte(n), 0}), 24)
			w.extra = map[int][]netip.Prefix{j: {p}}
			t0 := rewrite()
			install = append(install, k.until(b, all, 30*time.Second, hasPod(j, p)).Sub(t0))
			w.extra = nil
			rewrite()
			k.until(b, all, 30*time.Second, lacks(p))
		}
		for n := range deleteRuns {
			j := 3 + (n*53+11)%(convergenceNodes-2)
			others := slices.DeleteFunc(slices.Clone(all), func(i int) bool { return i == j })
			w.alive[j] = false
			t0 := rewrite()
			del = append(del, k.until(b, others, 30*time.Second, lacks(podCIDR4(j))).Sub(t0))
			w.alive[j] = true
			t0 = rewrite()
			rejoin = append(rejoin, k.until(b, others, 60*time.Second, hasPod(j, podCIDR4(j))).Sub(t0))
			k.until(b, []int{j}, 60*time.Second, exactly(nil))
		}
	}
	b.StopTimer()
	report := func(name string, ds []time.Duration) {
		b.ReportMetric(ms(percentile(ds, 50)), name+"-median-ms")
		b.ReportMetric(ms(percentile(ds, 99)), name+"-p99-ms")
		b.ReportMetric(ms(slices.Max(ds)), name+"-max-ms")
		b.Logf("%s: median %s, p99 %s, max %s over %d runs", name, percentile(ds, 50), percentile(ds, 99), slices.Max(ds), len(ds))
		inOrder := make([]string, len(ds))
		for i, d := range ds {
			inOrder[i] = d.Round(time.Millisecond).String()
		}
		b.Logf("%s, run by run: %s", name, strings.Join(inOrder, " "))
	}
	report("install", install)
	report("delete", del)
	b.ReportMetric(ms(percentile(rejoin, 50)), "rejoin-median-ms")
	b.Logf("rejoin: median %s; kernel reads: %d sweeps of %s on average", percentile(rejoin, 50), k.sweeps, k.meanSweep())
	client, reflector := w.nodes[convergenceNodes], w.nodes[1]
	b.ReportMetric(mib(peakRSS(b, client)), "rss-client-100-MiB")
	b.ReportMetric(mib(peakRSS(b, reflector)), "rss-reflector-100-MiB")
	b.Logf("peak RSS at 100 routes: client %.1f MiB, reflector %.1f MiB", mib(peakRSS(b, client)), mib(peakRSS(b, reflector)))

	for n := range torPrefixes {
		torAnnounces = append(torAnnounces, torPrefix(n))
	}
	t0 := time.Now()
	w.writeRouter(1)
	tor1000 := k.until(b, all, 5*time.Minute, exactly(torAnnounces)).Sub(t0)
	b.ReportMetric(mib(peakRSS(b, client)), "rss-client-1000-MiB")
	b.ReportMetric(mib(peakRSS(b, reflector)), "rss-reflector-1000-MiB")

	b.ReportMetric(ms(tor1000), "tor-ms")
	b.ReportMetric(ms(k.meanSweep()), "sweep-ms")
}

// kernels reads the nodes' weft BGP routes, one netlink handle per node
// namespace kept open.
type kernels struct {
	h      map[int]*netlink.Handle
	sweeps int
	spent  time.Duration
}

func (w *world) kernels() *kernels {
	w.t.Helper()
	k := &kernels{h: map[int]*netlink.Handle{}}
	for i, p := range w.nodes {
		ns, err := netns.GetFromPath(p.ns)
		if err != nil {
			w.t.Fatal(err)
		}
		h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
		ns.Close()
		if err != nil {
			w.t.Fatalf("netlink in %s: %v", p.ns, err)
		}
		k.h[i] = h
	}
	w.t.Cleanup(func() {
		for _, h := range k.h {
			h.Close()
		}
	})
	return k
}

// check tells what node i's routes rs lack, or "" if nothing; with
// detail, it says which routes (for the failure message).
type check func(i int, rs []netlink.Route, detail bool) string

// until reads the kernels of nodes until cond holds for each (each read
// once per sweep until it does) and returns when the last one did.
func (k *kernels) until(b *testing.B, nodes []int, within time.Duration, cond check) time.Time {
	b.Helper()
	pending := slices.Clone(nodes)
	deadline := time.Now().Add(within)
	var last time.Time
	for len(pending) > 0 {
		t0 := time.Now()
		var still []int
		for _, i := range pending {
			if cond(i, k.routes(b, i), false) == "" {
				last = time.Now()
			} else {
				still = append(still, i)
			}
		}
		k.sweeps++
		k.spent += time.Since(t0)
		pending = still
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			var why []string
			for _, i := range pending {
				why = append(why, nodeName(i)+": "+cond(i, k.routes(b, i), true))
			}
			b.Fatalf("not there after %s on %d nodes:\n%s", within, len(pending), strings.Join(why, "\n"))
		}
		time.Sleep(2 * time.Millisecond)
	}
	return last
}

// routes dumps node i's weft BGP routes (IPv4, main table).
func (k *kernels) routes(b *testing.B, i int) []netlink.Route {
	b.Helper()
	rs, err := nlutil.Dump("bgp routes", func() ([]netlink.Route, error) {
		return k.h[i].RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: bgp.RouteProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		b.Fatalf("%s: %v", nodeName(i), err)
	}
	return rs
}

func (k *kernels) meanSweep() time.Duration { return k.spent / time.Duration(max(k.sweeps, 1)) }

// idle waits until the node processes together use less than a third of
// a core (over a second; at rest their timers alone take about a tenth),
// at most within, and says how long that took and what they used.
func (w *world) idle(b *testing.B, within time.Duration) string {
	b.Helper()
	cpu := func() (used time.Duration) {
		for _, p := range w.nodes {
			d, err := process.CPU(p.cmd.Process.Pid)
			if err != nil {
				b.Fatal(err)
			}
			used += d
		}
		return used
	}
	start := time.Now()
	var used float64 // cores, over the last second
	for last := cpu(); time.Since(start) < within; {
		time.Sleep(time.Second)
		now := cpu()
		used, last = (now - last).Seconds(), now
		if used < 1.0/3 {
			break
		}
	}
	return fmt.Sprintf("%s later (%.2f of a core)", time.Since(start).Round(time.Millisecond), used)
}

// peakRSS is the process's VmHWM in bytes.
func peakRSS(b *testing.B, p *proc) float64 {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb * 1024
		}
	}
	b.Fatalf("no VmHWM in /proc/%d/status", p.cmd.Process.Pid)
	return 0
}

func mib(bytes float64) float64 { return math.Round(bytes/(1<<20)*10) / 10 }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// percentile is the nearest-rank q-th percentile.
func percentile(ds []time.Duration, q int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(float64(q)/100*float64(len(s))))-1)]
}
