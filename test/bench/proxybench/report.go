package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

func median(ds []time.Duration) (time.Duration, bool) {
	if len(ds) == 0 {
		return 0, false
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], true
}

// metric is one row's value for one proxy: ok false when there is none, and
// capped when the measurement hit -timeout (v is then the cap).
type metric struct {
	v       float64
	ok      bool
	capped  bool
	late    bool
	skipped bool // not run: capped at a smaller size already
}

// The report's rows, in order.
const (
	rowScratch = iota
	rowFirstSync
	rowChange
	rowChangeSync
	rowProgramming
	rowMemory
	rowConnVIP    // -conn: connections per second to the ClusterIP
	rowConnDirect // ... to the server pod directly
	rowConnRatio  // ClusterIP / direct
	rowConnCPU    // ClusterIP / direct, per CPU time of the client
	rowResetMed   // -reset: endpoint removal to the client's reset, median
	rowResetP99   // ... p99
	rowResetCount // connections reset of resetConns
	nRows
)

func rows(r result, timeout time.Duration) [nRows]metric {
	var m [nRows]metric
	switch {
	case r.skippedAt > 0:
		m[rowScratch] = metric{v: timeout.Seconds(), ok: true, capped: true, skipped: true}
	case r.timedOut:
		m[rowScratch] = metric{v: timeout.Seconds(), ok: true, capped: true}
	case r.err == nil || r.scratch > 0:
		m[rowScratch] = metric{v: r.scratch.Seconds(), ok: r.scratch > 0, late: r.late}
	}
	if r.firstSync > 0 {
		m[rowFirstSync] = metric{v: r.firstSync.Seconds(), ok: true}
	}
	for row, ds := range map[int][]time.Duration{rowChange: r.change, rowChangeSync: r.syncDur, rowProgramming: r.program} {
		if d, ok := median(ds); ok && len(ds) == changes {
			m[row] = metric{v: d.Seconds(), ok: true}
		}
	}
	if c := r.conn; c != nil && c.err == nil {
		m[rowConnVIP] = metric{v: c.vip, ok: true}
		m[rowConnDirect] = metric{v: c.direct, ok: true}
		m[rowConnRatio] = metric{v: c.ratio, ok: true}
		m[rowConnCPU] = metric{v: c.cpuRatio, ok: true}
	}
	if rr := r.reset; rr != nil && rr.err == nil {
		m[rowResetCount] = metric{v: float64(len(rr.times)), ok: true}
		// Connections not reset waited out the cap: with half or more of
		// them hung the median is the cap, with any the p99 is.
		hung := resetConns - len(rr.times)
		m[rowResetMed] = metric{v: resetCap.Seconds(), ok: true, capped: true}
		m[rowResetP99] = m[rowResetMed]
		if 2*hung < resetConns {
			m[rowResetMed] = metric{v: quantile(rr.times, 0.5).Seconds(), ok: true}
		}
		if hung == 0 {
			m[rowResetP99] = metric{v: quantile(rr.times, 0.99).Seconds(), ok: true}
		}
	}
	if r.hwm > 0 {
		// At the cap the proxy was still in its first sync: a lower bound.
		m[rowMemory] = metric{v: float64(r.hwm), ok: true, capped: r.timedOut}
	}
	return m
}

func (m metric) format(row int) string {
	if !m.ok {
		return "-"
	}
	var s string
	switch {
	case row == rowMemory:
		s = fmt.Sprintf("%.1f MiB", m.v/(1<<20))
	case row == rowConnVIP || row == rowConnDirect:
		s = fmt.Sprintf("%.0f/s", m.v)
	case row == rowConnRatio || row == rowConnCPU:
		s = fmt.Sprintf("%.3f", m.v)
	case row == rowResetCount:
		s = fmt.Sprintf("%.0f/%d", m.v, resetConns)
	case m.v >= 10:
		s = fmt.Sprintf("%.0fs", m.v)
	case m.v >= 1:
		s = fmt.Sprintf("%.2fs", m.v)
	default:
		s = fmt.Sprintf("%.1fms", m.v*1000)
	}
	if m.capped && row == rowMemory {
		s = ">= " + s
	} else if m.capped {
		s = "> " + s
	}
	if m.late {
		s += "*"
	}
	if m.skipped {
		s += "†"
	}
	return s
}

// ratio is w/k; a capped value is a lower bound, so the ratio is a bound
// when one side is capped and unknown when both are.
func ratio(w, k metric) string {
	switch {
	case !w.ok || !k.ok || w.capped && k.capped || k.v == 0:
		return "-"
	case w.capped:
		return fmt.Sprintf("> %.3f", w.v/k.v)
	case k.capped:
		return fmt.Sprintf("< %.3f", w.v/k.v)
	}
	return fmt.Sprintf("%.3f", w.v/k.v)
}

// columns are the proxies in report order; ratios the pairs compared.
var (
	columns = []string{"weft", "weft-nftables", "weft-ebpf", "kp-iptables", "kp-nftables"}
	ratios  = []struct{ label, a, b string }{
		{"weft/ipt", "weft", "kp-iptables"}, {"weft/nft", "weft", "kp-nftables"}, {"wnft/nft", "weft-nftables", "kp-nftables"},
		{"webpf/ipt", "weft-ebpf", "kp-iptables"}, {"webpf/nft", "weft-ebpf", "kp-nftables"},
	}
)

func report(size, perSvc int, timeout time.Duration, res map[string]result) {
	m := map[string][nRows]metric{}
	for _, n := range columns {
		m[n] = rows(res[n], timeout)
	}
	labels := [nRows]string{"from scratch", "  its first sync (own metric)", "one change, median of 5", "  its sync (own metric)",
		"  its network programming", "peak RSS (VmHWM)", "TCP connections to a ClusterIP", "  to the pod directly", "  ClusterIP / direct (paired)", "  the same per client CPU time",
		"removal to client reset, median", "  p99", "  connections reset"}
	fmt.Printf("\n%d Services × %d endpoints (%d endpoints)\n", size, perSvc, size*perSvc)
	fmt.Printf("%-30s", "")
	for _, n := range columns {
		fmt.Printf(" %14s", n)
	}
	for _, r := range ratios {
		fmt.Printf(" %10s", r.label)
	}
	fmt.Println()
	late, capped, skipped, conn, reset := false, false, false, false, false
	for _, n := range columns {
		conn = conn || res[n].conn != nil
		reset = reset || res[n].reset != nil
	}
	for row, l := range labels {
		if (row >= rowConnVIP && row <= rowConnCPU && !conn) || (row >= rowResetMed && !reset) {
			continue
		}
		fmt.Printf("%-30s", l)
		for _, n := range columns {
			fmt.Printf(" %14s", m[n][row].format(row))
			late = late || m[n][rowScratch].late
			capped = capped || res[n].timedOut
			skipped = skipped || res[n].skippedAt > 0
		}
		for _, r := range ratios {
			fmt.Printf(" %10s", ratio(m[r.a][row], m[r.b][row]))
		}
		fmt.Println()
	}
	if late {
		fmt.Println("  * the first sync failed, or its rules failed the kernel check; time of the first passing check after a successful sync (500 ms polls)")
	}
	if capped {
		fmt.Println("  > the -timeout cap was hit; peak RSS is then a lower bound, taken while the first sync ran")
	}
	if skipped {
		fmt.Println("  † not run at this size: over the -timeout cap at a smaller size already (see below); a bound if more Services take no less time")
	}
	for _, n := range columns {
		if err := res[n].err; err != nil {
			fmt.Printf("  %s: %v\n", n, err)
		}
		if at := res[n].skippedAt; at > 0 {
			fmt.Printf("  %s: not run, it hit the cap at %d Services\n", n, at)
		}
		if c := res[n].conn; c != nil && c.err != nil {
			fmt.Printf("  %s, connections: %v\n", n, c.err)
		}
		if rr := res[n].reset; rr != nil && rr.err != nil {
			fmt.Printf("  %s, reset: %v\n", n, rr.err)
		}
	}
	note := ""
	if size != 10000 {
		note = " (the targets are set for 10000 Services)"
	}
	fmt.Printf("targets%s:\n", note)
	// weft (iptables) against both kube-proxy modes; weft-nftables against
	// kube-proxy's nftables mode (issue 12).
	targets("weft", m["weft"], 0.050, 5, []string{"kp-iptables", "kp-nftables"}, 1, m)
	targets("weft-nftables", m["weft-nftables"], 0.030, 3, []string{"kp-nftables"}, 0.5, m)
	targets("weft-ebpf", m["weft-ebpf"], 0.020, 2, []string{"kp-nftables"}, 0.5, m) // issue 11
	if conn {
		verdict := func(c metric) string {
			if !c.ok {
				return "n/a"
			}
			return map[bool]string{true: "met", false: "MISSED"}[c.v >= 0.95]
		}
		fmt.Printf("  weft-ebpf: connections to a ClusterIP ≥ 0.95× direct: %s by the clock, %s per CPU time\n",
			verdict(m["weft-ebpf"][rowConnRatio]), verdict(m["weft-ebpf"][rowConnCPU]))
	}
}

// targets prints whether a proxy met its targets: one change and from
// scratch within bounds (seconds), peak RSS within share of each peer's.
func targets(name string, w [nRows]metric, change, scratch float64, peers []string, share float64, m map[string][nRows]metric) {
	var t []string
	check := func(what string, ok, known bool) {
		verdict := "MISSED"
		if !known {
			verdict = "n/a"
		} else if ok {
			verdict = "met"
		}
		t = append(t, what+": "+verdict)
	}
	ch, sc, mem := w[rowChange], w[rowScratch], w[rowMemory]
	check(fmt.Sprintf("one change ≤ %.0f ms", change*1000), ch.ok && ch.v <= change, ch.ok)
	check(fmt.Sprintf("from scratch ≤ %.0f s", scratch), sc.ok && !sc.capped && sc.v <= scratch, sc.ok)
	memKnown, memOK := mem.ok && !mem.capped, true
	for _, p := range peers {
		pm := m[p][rowMemory]
		memKnown = memKnown && pm.ok && !pm.capped
		memOK = memOK && mem.v <= share*pm.v
	}
	check(fmt.Sprintf("memory ≤ %g× %s", share, strings.Join(peers, ", ")), memKnown && memOK, memKnown)
	fmt.Printf("  %s: %s\n", name, strings.Join(t, "; "))
}

func printMethod(perSvc, workers int, timeout time.Duration) {
	fmt.Printf(`method:
  Each proxy runs alone, one after the other, in a fresh network namespace on the
  lab's underlay, against the same API state (selector-less ClusterIP Services with
  one hand-made EndpointSlice of %d ready endpoints each, every endpoint a unique
  address). The lab node's own weft-agent is removed (its DaemonSet selects no node)
  so it takes no CPU.
  seeding: through the API server (creates of Services and EndpointSlices, %d at a
    time, protobuf, no client-side rate limit), before each size's measurements:
    no proxy runs while it seeds (each is started for its measurement and stopped
    after it), so each proxy's informers list the whole state at start, the path
    a proxy's restart takes. The bench names each Service's ClusterIP, from
    ServiceCIDRs of its own (10.97.0.0/16 on, 65,000 Services each): the API
    server, left to choose, allocates one ClusterIP at a time under one lock, each
    an etcd write; a named address is allocated in parallel (-seed-dynamic-ips:
    the old way). The progress lines
    give the CPU the control plane and the bench took (cores, over the interval).
  cap: each measurement (from scratch, each change) stops at -timeout (%v); a
    proxy that hits it is reported "> %v" and not run at larger sizes (†). weft-ebpf attaches its socket
  programs to an empty cgroup the bench makes and its tc programs to the box's eth0,
  pins on a bpffs the bench mounts (emptied before each run). Proxy flags are the defaults
  otherwise: weft --min-sync-period 100ms, kube-proxy --iptables-min-sync-period 1s
  (changes are written >= 1.5 s after the last sync, so it never holds one back);
  kube-proxy runs dual-stack (its IPv6 side has no Services); only the IPv4
  series of its metrics is read. Both iptables proxies use iptables-nft.
  from scratch: exec until /metrics, polled every 100 ms, counts the first sync
    (kubeproxy_sync_proxy_rules_duration_seconds_count >= 1); then the ruleset
    dumped in the namespace (iptables-save -t nat / nft list table ip kube-proxy /
    nft list table inet weft; weft-ebpf: its pinned maps, read back by the bench as
    weft-proxy --dump reads them)
    must hold every endpoint as a DNAT target and every seeded Service's
    ClusterIP (the last one included), and no sync may have failed
    (kubeproxy_sync_proxy_rules_iptables_restore_failures_total), or the time of
    the first dump that does, after a successful sync
    (kubeproxy_sync_proxy_rules_last_timestamp_seconds), is taken (marked *,
    500 ms polls).
    The sync count is used rather than the last-sync timestamp so that every
    proxy is measured by the same counter.
  one change: one EndpointSlice update (one endpoint's IP) from just before the
    API write until /metrics counts a sync after which the dumped ruleset holds
    the new IP (polls every 5 ms for 200 ms, 20 ms to 2 s, then 100 ms): an upper
    bound that includes the API server and watch delivery. Median of 5, on
    Services spread from the first seeded to the last; a failed sync meanwhile
    is an error.
    weft-ebpf: until the pinned maps, read by the bench every 1 ms, give the
    Service's frontend the new backend (what its programs read).
  its sync: the proxy's own kubeproxy_sync_proxy_rules_duration_seconds
    (_sum/_count deltas).
  its network programming: the proxy's own kubeproxy_network_programming_duration_seconds
    for the change (_sum/_count deltas): from the slice's
    endpoints.kubernetes.io/last-change-trigger-time, which the bench stamps
    just before the write as the EndpointSlice controller would, until the
    rules are programmed. Median of 5.
  peak RSS: VmHWM of the proxy process after the changes; the iptables-restore
    and nft processes it runs are not included.
`, perSvc, workers, timeout, timeout)
}

func printResetMethod() {
	fmt.Printf(`  reset after endpoint removal (-reset), after the from-scratch check: in the
    proxy's namespace a client pod and a server pod (as for -conn) and a Service %s
    whose one endpoint is the server (port %d). The client, a child process in its
    pod and the bench's cgroup, opens %d connections to the ClusterIP and waits on
    each for data the server never sends; the bench cuts the server's veth (the pod
    vanishes without a FIN or a reset, as when its node dies or it is force-deleted)
    and deletes the EndpointSlice; from just before that API write, each connection's
    time until the client's read fails with ECONNRESET (the API server, the watch and
    the proxy's sync included). A read still waiting %v later is a hang ("> %v"):
    kube-proxy resets nothing, its clients wait for their own timeout.
`, resetSvc, resetPort, resetConns, resetCap, resetCap)
}

func printConnMethod() {
	fmt.Printf(`  TCP connections (-conn), after the from-scratch check: in the proxy's namespace a
    client pod and a server pod, each on a veth with a /32 route (the namespace
    forwards between them, as a node between two of its pods), and a Service
    %s whose one endpoint is the server (port %d). The client, a child process
    in the client pod and in the bench's cgroup (weft-ebpf's socket programs are
    attached there while it runs, nothing is for the others), runs socket, connect,
    close with SO_LINGER 0 (a reset, no TIME_WAIT) in a loop, one connection at a
    time, to the server's address directly and to the ClusterIP, alternately, %d
    rounds of %v each; rates are medians over rounds, ClusterIP / direct is the
    median of each ClusterIP round over the direct round just before it (both ran
    under about the same load), by the clock and per CPU time of the client thread
    (what a connection costs it, the handshake and the forwarding included: on
    these veths they run in its softirq context; time descheduled costs nothing).
    The server, a process in its pod, accepts and closes.
`, connSvc, connPort, connRounds, connRound)
}
