package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/test/bench/benchlab"
)

const (
	nodeName    = "bench-node"
	nodeIP      = "172.18.0.50"
	metricsAddr = "127.0.0.1:10249"
	healthzAddr = "127.0.0.1:10256"
	changes     = 5
)

// subject is one proxy under test.
type subject struct {
	name string
	args func(bin, kubeconfig string) []string
	dump []string // prints the proxy's ruleset inside its namespace
	// ebpf: the proxy runs in the bench's bpffs and cgroup (ebpfEnv),
	// its ruleset is the pinned maps read back.
	ebpf bool
}

func subjects() []subject {
	kp := func(mode string) func(bin, kc string) []string {
		return func(bin, kc string) []string {
			return []string{filepath.Join(bin, "kube-proxy"), "--kubeconfig", kc, "--proxy-mode", mode,
				"--hostname-override", nodeName, "--cluster-cidr", lab.ClusterCIDR, "--conntrack-max-per-core=0",
				"--metrics-bind-address", metricsAddr, "--healthz-bind-address", healthzAddr}
		}
	}
	return []subject{
		{"weft", func(bin, kc string) []string {
			return []string{filepath.Join(bin, "weft-proxy"), "--kubeconfig", kc, "--mode", "iptables",
				"--node-name", nodeName, "--node-ip", nodeIP, "--cluster-cidr", lab.ClusterCIDR,
				"--metrics-addr", metricsAddr, "--healthz-addr", healthzAddr}
		}, []string{"iptables-save", "-t", "nat"}, false},
		{"weft-nftables", func(bin, kc string) []string {
			return []string{filepath.Join(bin, "weft-proxy"), "--kubeconfig", kc, "--mode", "nftables",
				"--node-name", nodeName, "--node-ip", nodeIP, "--cluster-cidr", lab.ClusterCIDR,
				"--metrics-addr", metricsAddr, "--healthz-addr", healthzAddr}
		}, []string{"nft", "list", "table", "inet", "weft"}, false},
		{name: "weft-ebpf", args: func(bin, kc string) []string {
			return []string{filepath.Join(bin, "weft-proxy"), "--kubeconfig", kc, "--mode", "ebpf",
				"--node-name", nodeName, "--node-ip", nodeIP, "--cluster-cidr", lab.ClusterCIDR, "--bpf-devices", "eth0",
				"--metrics-addr", metricsAddr, "--healthz-addr", healthzAddr}
		}, ebpf: true},
		{"kp-iptables", kp("iptables"), []string{"iptables-save", "-t", "nat"}, false},
		{"kp-nftables", kp("nftables"), []string{"nft", "list", "table", "ip", "kube-proxy"}, false},
	}
}

// syncs is what /metrics says about the proxy's syncs (count and sum of
// sync durations, failed syncs, the time of the last successful one) and
// its network programming latencies (npCount, npSum).
type syncs struct{ count, sum, fails, lastOK, npCount, npSum float64 }

type scraper struct{ c *http.Client }

func newScraper(b *box) *scraper {
	return &scraper{&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: netnsutil.Dialer(b.path, nil)}}}
}

// get reads the _count and _sum of kubeproxy_sync_proxy_rules_duration_seconds,
// which both proxies observe once per sync, and of
// kubeproxy_network_programming_duration_seconds, which both observe per
// programmed EndpointSlice change carrying a trigger time (kube-proxy per
// IP family: the IPv4 series is taken).
func (s *scraper) get(ctx context.Context) (syncs, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+metricsAddr+"/metrics", nil)
	resp, err := s.c.Do(req)
	if err != nil {
		return syncs{}, err
	}
	defer resp.Body.Close()
	var out syncs
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		name, labels, _ := strings.Cut(f[0], "{")
		if labels != "" && !strings.Contains(labels, `ip_family="IPv4"`) {
			continue // kube-proxy labels its metrics by family; the bench is IPv4
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch name {
		case "kubeproxy_sync_proxy_rules_duration_seconds_count":
			out.count = v
		case "kubeproxy_sync_proxy_rules_duration_seconds_sum":
			out.sum = v
		case "kubeproxy_sync_proxy_rules_iptables_restore_failures_total":
			out.fails = v // weft: any failed sync; kube-proxy: a failed restore or nft transaction
		case "kubeproxy_sync_proxy_rules_last_timestamp_seconds":
			out.lastOK = v // set by successful syncs only
		case "kubeproxy_network_programming_duration_seconds_count":
			out.npCount = v
		case "kubeproxy_network_programming_duration_seconds_sum":
			out.npSum = v
		}
	}
	return out, sc.Err()
}

// result is one proxy's numbers at one size.
type result struct {
	scratch   time.Duration // process start to the first sync of the full state
	late      bool          // the first sync failed or its rules were incomplete: scratch is the kernel check's time
	firstSync time.Duration // the proxy's own duration of its first sync
	timedOut  bool
	change    []time.Duration // update written to sync observed (and rules checked)
	syncDur   []time.Duration // the proxy's own duration of that sync
	program   []time.Duration // the proxy's own network programming latency of that change
	hwm       int64
	conn      *connResult  // -conn
	reset     *resetResult // -reset
	err       error
	// skippedAt: not run, having hit the -timeout cap at skippedAt
	// Services already.
	skippedAt int
}

type env struct {
	client    kubernetes.Interface
	bin, kc   string
	logDir    string
	timeout   time.Duration
	ebpf      *ebpfEnv // made by the first weft-ebpf measurement, or for -conn
	connVIP   string   // -conn: conn-target's ClusterIP
	resetVIP  string   // -reset: reset-target's ClusterIP
	boxes     int      // boxes made so far
	changeSeq int      // 10.244.255.x addresses used so far
	vips      []string // the seeded Services' ClusterIPs, by index
}

// measure runs one proxy alone in a fresh namespace against the current
// state of size services × perSvc endpoints.
func (e *env) measure(ctx context.Context, s subject, size, perSvc int) (r result) {
	b, err := newBox(e.boxes)
	e.boxes++
	if err != nil {
		return result{err: err}
	}
	defer b.close()
	args := s.args(e.bin, e.kc)
	if s.ebpf {
		if args, err = e.ebpfArgs(args); err != nil {
			return result{err: err}
		}
		// Its programs stay attached to the cgroup until the pins go.
		defer func() { _ = e.ebpf.reset() }()
	}
	p, err := b.start(filepath.Join(e.logDir, fmt.Sprintf("%s-%d.log", s.name, size)), args)
	if err != nil {
		return result{err: err}
	}
	defer p.Stop()
	defer func() {
		if hwm, err := p.VmHWM(); err == nil {
			r.hwm = hwm
		}
	}()
	m := newScraper(b)
	deadline := p.Started.Add(e.timeout)
	sctx, cancel := context.WithDeadline(ctx, deadline.Add(30*time.Second))
	defer cancel()

	// 1. From scratch: /metrics every 100 ms until the first sync is counted.
	var first time.Time
	firstFailed := false
	for first.IsZero() {
		if err := p.Exited(); err != nil {
			return result{err: err}
		}
		st, err := m.get(sctx)
		if err == nil && st.count >= 1 {
			first = time.Now()
			r.firstSync = time.Duration(st.sum / st.count * float64(time.Second))
			// Both proxies count a failure before they observe the
			// sync's duration.
			firstFailed = st.fails > 0
			break
		}
		if time.Now().After(deadline) {
			return result{timedOut: true, err: fmt.Errorf("no sync counted in /metrics (last scrape: %+v, %v); log %s:\n%s", st, err, p.Log, benchlab.Tail(p.Log, 8))}
		}
		if err := sleep(sctx, 100*time.Millisecond); err != nil {
			return result{err: err}
		}
	}
	// ... then the kernel must hold the whole state: every endpoint's DNAT
	// and every seeded Service's ClusterIP, and the sync must have
	// succeeded. If that sync failed or was not complete, poll the ruleset
	// every 500 ms and count until a dump that does has ended, after a
	// successful sync.
	r.scratch = first.Sub(p.Started)
	r.late = firstFailed
	want, vips := size*perSvc, e.vips[:size]
	for {
		out, err := e.ruleset(b, s)
		var ok bool
		if err == nil && !r.late {
			ok = completeState(out, want, vips) == ""
		} else if err == nil {
			st, merr := m.get(sctx)
			ok = merr == nil && st.lastOK > 0 && completeState(out, want, vips) == ""
		}
		if ok {
			if r.late {
				r.scratch = time.Since(p.Started)
			}
			break
		}
		r.late = true
		if time.Now().After(deadline) {
			st, merr := m.get(sctx)
			why := "dump error: " + fmt.Sprint(err)
			if err == nil {
				why = completeState(out, want, vips)
			}
			return result{timedOut: true, err: fmt.Errorf("not programmed within the cap: %s; failed syncs %v, last successful sync at %v (metrics error: %v)", why, st.fails, st.lastOK, merr)}
		}
		if err := sleep(sctx, 500*time.Millisecond); err != nil {
			return result{err: err}
		}
	}

	// -conn: the data path, before the changes.
	if e.connVIP != "" {
		c := e.connRates(ctx, b)
		r.conn = &c
	}
	// -reset: before the changes too (it deletes and recreates a slice).
	if e.resetVIP != "" {
		rr := e.resetTimes(ctx, b)
		r.reset = &rr
	}

	// 2. One change at a time, each on another service, spread over all
	// of them from the first to the last seeded.
	for i := 0; i < changes; i++ {
		c, err := e.oneChange(ctx, b, p, m, s, i*(size-1)/(changes-1))
		if err != nil {
			r.err = fmt.Errorf("change %d: %w", i+1, err)
			return r
		}
		r.change, r.syncDur = append(r.change, c.seen), append(r.syncDur, c.sync)
		if c.program > 0 {
			r.program = append(r.program, c.program)
		}
	}
	return r
}

// ruleset is what s programmed: its dump command's output inside b, or
// for weft-ebpf the pinned maps.
func (e *env) ruleset(b *box, s subject) (string, error) {
	if s.ebpf {
		return e.ebpf.dump()
	}
	return b.output(s.dump...)
}

// ebpfArgs makes the bench's bpffs and cgroup on first use, empties the
// pin path (each run is from scratch) and points the proxy at them.
func (e *env) ebpfArgs(args []string) ([]string, error) {
	if err := e.ensureEBPFEnv(); err != nil {
		return nil, err
	}
	if err := e.ebpf.reset(); err != nil {
		return nil, fmt.Errorf("removing the previous run's pins: %w", err)
	}
	return append(args, "--cgroup-root", e.ebpf.cgroup, "--bpf-pin-path", e.ebpf.pin()), nil
}

func (e *env) ensureEBPFEnv() error {
	if e.ebpf != nil {
		return nil
	}
	env, err := newEBPFEnv()
	e.ebpf = env
	return err
}

// changed is what one change measured: from the API write until a sync
// after which the ruleset holds the change was seen, that sync's own
// duration, and the proxy's own network programming latency (0 if it
// observed none).
type changed struct{ seen, sync, program time.Duration }

// oneChange moves one endpoint of service idx to a new address, stamped with
// the trigger time the EndpointSlice controller would write, and measures
// it (see changed). The proxy's own durations are the change of a
// histogram's _sum over its _count. /metrics is polled every 5 ms for the
// first 200 ms, every 20 ms to 2 s, then every 100 ms.
func (e *env) oneChange(ctx context.Context, b *box, p *proc, m *scraper, s subject, idx int) (changed, error) {
	before, err := quiet(ctx, m, p)
	if err != nil {
		return changed{}, err
	}
	e.changeSeq++
	ip := fmt.Sprintf("10.244.%d.%d", changedIPOctet, e.changeSeq%250+1)
	vip := e.vips[idx]
	var t0 time.Time
	if err := changeOne(ctx, e.client, idx, ip, func() { t0 = time.Now() }); err != nil {
		return changed{}, err
	}
	// weft-ebpf: the time until the maps hold the new backend, polled
	// every millisecond; /metrics then gives the proxy's own durations.
	var inMap time.Duration
	if s.ebpf {
		if inMap, err = e.ebpf.await(ctx, vip, ip, t0, e.timeout); err != nil {
			return changed{}, err
		}
	}
	seen := before.count
	for {
		if err := p.Exited(); err != nil {
			return changed{}, err
		}
		el := time.Since(t0)
		if el > e.timeout {
			return changed{}, fmt.Errorf("not applied within %v", e.timeout)
		}
		st, err := m.get(ctx)
		if err == nil && st.count > seen {
			at := time.Since(t0)
			if s.ebpf {
				at = inMap
			}
			seen = st.count
			out, err := e.ruleset(b, s)
			if err != nil {
				return changed{}, err
			}
			if st.fails > before.fails {
				return changed{}, fmt.Errorf("a sync failed (failed syncs %v, were %v before the change)", st.fails, before.fails)
			}
			if hasIP(out, ip) {
				c := changed{seen: at, sync: perSample(st.sum-before.sum, st.count-before.count)}
				if st.npCount > before.npCount {
					c.program = perSample(st.npSum-before.npSum, st.npCount-before.npCount)
				}
				return c, nil
			}
			continue
		}
		step := 100 * time.Millisecond
		if el < 200*time.Millisecond {
			step = 5 * time.Millisecond
		} else if el < 2*time.Second {
			step = 20 * time.Millisecond
		}
		if err := sleep(ctx, step); err != nil {
			return changed{}, err
		}
	}
}

// perSample is a histogram's mean over n new samples whose sum is sum.
func perSample(sum, n float64) time.Duration { return time.Duration(sum / n * float64(time.Second)) }

// quiet waits until no sync has happened for 1.5 s, so that no sync is under
// way when the change is written, and kube-proxy's --iptables-min-sync-period
// (1 s) does not hold the next one back.
func quiet(ctx context.Context, m *scraper, p *proc) (syncs, error) {
	last, err := m.get(ctx)
	if err != nil {
		return last, err
	}
	stable := time.Now()
	for time.Since(stable) < 1500*time.Millisecond {
		if err := p.Exited(); err != nil {
			return last, err
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return last, err
		}
		st, err := m.get(ctx)
		if err != nil {
			return last, err
		}
		if st.count != last.count {
			last, stable = st, time.Now()
		}
	}
	return last, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return errors.Join(errors.New("interrupted"), ctx.Err())
	case <-time.After(d):
		return nil
	}
}
