package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	procstat "github.com/weftnet/weft/internal/proc"
	"github.com/weftnet/weft/test/bench/benchlab"
)

// env is what every subject's measurement shares.
type env struct {
	bin, kc, logDir string
	opts            options
	ebpf            *ebpfEnv // made for the first eBPF subject
	drop            *ebpf.Program
	nonce           uint64
	worlds          int
}

type options struct {
	duration      time.Duration
	runs          int
	pktSize       int
	flows         int
	batch         int
	local, remote int
	readyTimeout  time.Duration
}

// run is one generator run: a baseline (to the sink, which drops every
// packet at its ingress) or a forward run (to the node, whose proxy
// forwards them).
type run struct {
	gen      genResult
	arrived  uint64   // node1's uplink rx_packets (the sink's in a baseline)
	refused  uint64   // the generator's tx_dropped (node1's backlog full)
	fwd      []uint64 // each backend's rx_packets, in pods' order
	softirqd time.Duration
	busy     time.Duration // every CPU's non-idle time
	proxyCPU time.Duration // the proxy process (ticks: 10 ms)
}

// pipeline is the CPU the packets took: the generator thread's (with the
// softirq processing veth runs in it) and ksoftirqd's (what was deferred).
func (r run) pipeline() time.Duration { return r.gen.CPU + r.softirqd }

func (r run) forwarded() uint64 {
	var n uint64
	for _, v := range r.fwd {
		n += v
	}
	return n
}

// pair is a baseline run and the forward run after it.
type pair struct{ base, fwd run }

// result is one subject's.
type result struct {
	name     string
	notRun   string // why it was not run (not in this build)
	err      error
	answers  map[string]int // the probe's answers per backend
	check    string         // the sample check's findings
	idleRx   uint64         // backends' rx over an idle second
	pairs    []pair
	pods     []pod
	proxyLog string
}

func newNonce() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}

// session is one subject set up and checked on its own world, ready for
// pairs of runs: its proxy (or proxies) running, its backends dropping.
type session struct {
	s              subject
	w              *world
	procs          []*proc
	spec, baseSpec genSpec
	undo           []func() // in reverse order
}

func (ss *session) alive() error {
	for _, p := range ss.procs {
		if err := p.Exited(); err != nil {
			return err
		}
	}
	return nil
}

// close stops the proxies and removes the world.
func (ss *session) close() {
	for i := len(ss.undo) - 1; i >= 0; i-- {
		ss.undo[i]()
	}
	ss.undo = nil
}

// prepare sets subject s up on a fresh world and checks it (the probe,
// the sample check, the idle counters), filling r; a nil session means
// r says why there is none.
func (e *env) prepare(ctx context.Context, s subject, r *result) *session {
	r.name = s.name
	if ok, err := available(s, e.bin); err != nil || !ok {
		if err != nil {
			r.err = err
		} else {
			r.notRun = fmt.Sprintf("%s has no --%s in this build", s.prog, s.needs)
		}
		return nil
	}
	ss := &session{s: s}
	ok := false
	defer func() {
		if !ok {
			ss.close()
		}
	}()
	w, err := newWorld(e.worlds, e.opts.local, e.opts.remote)
	e.worlds++
	if err != nil {
		r.err = fmt.Errorf("building the namespaces: %w", err)
		return nil
	}
	ss.w = w
	ss.undo = append(ss.undo, w.close)
	r.pods = w.pods
	stopEcho, err := startEchoes(w.pods)
	if err != nil {
		r.err = err
		return nil
	}
	echoing := true
	ss.undo = append(ss.undo, func() {
		if echoing {
			stopEcho()
		}
	})

	// The proxy (and on node2 too, for a subject that needs both).
	type node struct{ path, name, ip, uplink string }
	nodes := []node{{w.node1, node1Name, node1IP.String(), uplinkDev}}
	if s.bothNodes {
		// Its eBPF devices: where packets from node1 arrive (the option
		// read there) and where the replies to the client leave (their
		// source translated back there).
		nodes = append(nodes, node{w.node2, node2Name, node2IP.String(), node2Uplink + "," + node2Client})
	}
	if s.routing {
		nodes = nil
	}
	for _, n := range nodes {
		args := commonArgs(s, e.bin, e.kc, n.name, n.ip, n.uplink)
		if s.ebpf() {
			if e.ebpf == nil {
				if e.ebpf, err = newEBPFEnv(); err != nil {
					r.err = err
					return nil
				}
			}
			key := s.name + "-" + n.name
			more, err := e.ebpf.args(key)
			if err != nil {
				r.err = err
				return nil
			}
			// Its programs stay attached until the pins go.
			ss.undo = append(ss.undo, func() { e.ebpf.release(key) })
			args = append(args, more...)
		}
		log := filepath.Join(e.logDir, fmt.Sprintf("%s-%s.log", s.name, n.name))
		p, err := benchlab.Start(n.path, log, args)
		if err != nil {
			r.err = err
			return nil
		}
		ss.procs = append(ss.procs, p)
		ss.undo = append(ss.undo, p.Stop)
	}
	// 1. The path works: every backend answers through the NodePort (the
	// routing reference: at its own address).
	dsts := []*net.UDPAddr{{IP: node1IP.AsSlice(), Port: nodePort}}
	if s.routing {
		dsts = nil
		for _, p := range w.pods {
			dsts = append(dsts, &net.UDPAddr{IP: p.ip.AsSlice(), Port: targetPort})
		}
	}
	if r.answers, err = probe(ctx, w.gen, w.pods, dsts, time.Now().Add(e.opts.readyTimeout), ss.alive); err != nil {
		r.err = fmt.Errorf("probe: %w", err)
		return nil
	}
	if !seenBoth(w.pods, r.answers) {
		r.err = fmt.Errorf("probe: a local and a remote backend must answer: %v", r.answers)
		return nil
	}
	stopEcho()
	echoing = false

	// 2. The backends drop what arrives (after their rx counter), and so
	// does the sink.
	for _, d := range append([]struct{ ns, dev string }{{w.sink, "eth0"}}, podDevs(w.pods)...) {
		l, err := attachDrop(d.ns, d.dev, e.drop)
		if err != nil {
			r.err = err
			return nil
		}
		ss.undo = append(ss.undo, func() { l.Close() })
	}
	ss.spec = genSpec{Dev: genDev, DstMAC: w.uplinkMAC, SrcMAC: w.genMAC, Src: genUplinkIP, Dst: node1IP,
		Dport: nodePort, SportMin: sportMin, Flows: e.opts.flows, Size: e.opts.pktSize, Batch: e.opts.batch, Nonce: e.nonce}
	if s.routing {
		ss.spec.Dport = targetPort
		for _, p := range w.pods {
			ss.spec.Dsts = append(ss.spec.Dsts, p.ip)
		}
	}

	// 3. What the backends count is the generator's.
	if r.check, err = e.sampleCheck(w, ss.spec); err != nil {
		r.err = fmt.Errorf("sample check: %w", err)
		return nil
	}
	before, err := w.backendRx()
	if err == nil {
		time.Sleep(time.Second)
		var after []uint64
		if after, err = w.backendRx(); err == nil {
			for i := range after {
				r.idleRx += after[i] - before[i]
			}
		}
	}
	if err != nil {
		r.err = err
		return nil
	}
	// The runs: the baseline sends the same frames to the sink, which
	// drops them at once.
	ss.spec.Duration = e.opts.duration
	ss.baseSpec = ss.spec
	ss.baseSpec.Dev, ss.baseSpec.SrcMAC, ss.baseSpec.DstMAC = genSinkDev, w.genSinkMAC, w.sinkMAC
	ok = true
	return ss
}

func podDevs(pods []pod) []struct{ ns, dev string } {
	var out []struct{ ns, dev string }
	for _, p := range pods {
		out = append(out, struct{ ns, dev string }{p.path, podDev})
	}
	return out
}

// pair runs a baseline, then a forward run.
func (e *env) pair(ss *session) (pair, error) {
	var pr pair
	var err error
	var proxy *proc
	if len(ss.procs) > 0 {
		proxy = ss.procs[0]
	}
	if pr.base, err = e.oneRun(ss.w, ss.baseSpec, proxy); err != nil {
		return pr, fmt.Errorf("baseline run: %w", err)
	}
	// The backends' counters count the nodes' ARP requests too: a few.
	if pr.base.arrived != uint64(pr.base.gen.Sent) || pr.base.forwarded() > uint64(pr.base.gen.Sent)/1000 {
		return pr, fmt.Errorf("baseline run: %d packets sent, the sink counted %d, the backends %d", pr.base.gen.Sent, pr.base.arrived, pr.base.forwarded())
	}
	if pr.fwd, err = e.oneRun(ss.w, ss.spec, proxy); err != nil {
		return pr, fmt.Errorf("forward run: %w", err)
	}
	return pr, ss.alive()
}

// sportMin is the generator's first source port: its flows stay clear of
// the NodePort range and of the local port range a masquerade uses.
const sportMin = 10000

// sampleCheck runs the generator for 300 ms with a capture on every
// backend's interface and checks that each backend receives the
// generator's packets (the payload's magic and this run's nonce), with
// the backend's address and port as destination, and other IPv4 packets
// at most 1 in 100 of those (described in what it returns). It
// describes what it found: the sources the backends saw (the
// masquerade address, or the client's).
func (e *env) sampleCheck(w *world, spec genSpec) (string, error) {
	var caps []*capture
	defer func() {
		for _, c := range caps {
			c.close()
		}
	}()
	for _, p := range w.pods {
		c, err := openCapture(p.path, podDev)
		if err != nil {
			return "", err
		}
		caps = append(caps, c)
	}
	spec.Duration = 300 * time.Millisecond
	g, err := runGen(w.gen, spec)
	if err != nil {
		return "", err
	}
	settle()
	srcs := map[string]int{}
	var found []string
	for i, c := range caps {
		s, err := c.read(e.nonce)
		if err != nil {
			return "", err
		}
		p := w.pods[i]
		want := fmt.Sprintf("%s:%d", p.ip, targetPort)
		switch {
		case s.ours == 0:
			return "", fmt.Errorf("backend %s captured none of the generator's packets (%d sent; other IPv4 %d, non-IPv4 %d)", p.name, g.Sent, s.otherIPv4, s.nonIP)
		case s.otherIPv4*100 > s.ours:
			return "", fmt.Errorf("backend %s captured %d IPv4 packets that are not the generator's (%d are): %s", p.name, s.otherIPv4, s.ours, strings.Join(s.others, "; "))
		case len(s.dst) != 1 || s.dst[want] == 0:
			return "", fmt.Errorf("backend %s: the generator's packets arrived for %v, not %s", p.name, s.dst, want)
		}
		for k, v := range s.srcs {
			srcs[fmt.Sprintf("%s@%s", k, p.name)] += v
		}
		found = append(found, fmt.Sprintf("%s %d", p.name, s.ours))
		if s.otherIPv4 > 0 {
			found[len(found)-1] += fmt.Sprintf(" (and %d others: %s)", s.otherIPv4, strings.Join(s.others, "; "))
		}
	}
	keys := make([]string, 0, len(srcs))
	for k := range srcs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return fmt.Sprintf("captured generator packets per backend: %s; sources seen (source@backend): %s", strings.Join(found, ", "), strings.Join(keys, " ")), nil
}

// backendRx reads every backend's rx_packets.
func (w *world) backendRx() ([]uint64, error) {
	out := make([]uint64, len(w.pods))
	for i, p := range w.pods {
		rx, _, err := rxPackets(p.path, podDev)
		if err != nil {
			return nil, err
		}
		out[i] = rx
	}
	return out, nil
}

// counters is a snapshot of what a run is the difference of.
type counters struct {
	arrived, refused uint64
	fwd              []uint64
	softirqd, busy   time.Duration
	proxy            time.Duration
}

// snapshot reads the counters of a run whose generator sends on genDev
// (to node1) or genSinkDev (to the sink).
func (w *world) snapshot(dev string, proxy *proc) (counters, error) {
	var c counters
	var err error
	ns, peer := w.node1, uplinkDev
	if dev == genSinkDev {
		ns, peer = w.sink, "eth0"
	}
	if c.arrived, _, err = rxPackets(ns, peer); err != nil {
		return c, err
	}
	if c.refused, err = txDropped(w.gen, dev); err != nil {
		return c, err
	}
	if c.fwd, err = w.backendRx(); err != nil {
		return c, err
	}
	if c.softirqd, err = ksoftirqdTime(); err != nil {
		return c, err
	}
	if c.busy, err = machineBusy(); err != nil {
		return c, err
	}
	if proxy != nil {
		c.proxy, _ = procstat.CPU(proxy.Cmd.Process.Pid)
	}
	return c, nil
}

// oneRun runs the generator once and takes the counters' differences.
func (e *env) oneRun(w *world, spec genSpec, proxy *proc) (run, error) {
	c0, err := w.snapshot(spec.Dev, proxy)
	if err != nil {
		return run{}, err
	}
	g, err := runGen(w.gen, spec)
	if err != nil {
		return run{}, err
	}
	settle()
	c1, err := w.snapshot(spec.Dev, proxy)
	if err != nil {
		return run{}, err
	}
	r := run{gen: g, arrived: c1.arrived - c0.arrived, refused: c1.refused - c0.refused,
		softirqd: c1.softirqd - c0.softirqd, busy: c1.busy - c0.busy, proxyCPU: c1.proxy - c0.proxy}
	for i := range c1.fwd {
		r.fwd = append(r.fwd, c1.fwd[i]-c0.fwd[i])
	}
	return r, nil
}

// ksoftirqdTime is the run time of every ksoftirqd thread (schedstat).
func ksoftirqdTime() (time.Duration, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	found := false
	for _, d := range ents {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", d.Name(), "comm"))
		if err != nil || !strings.HasPrefix(string(comm), "ksoftirqd/") {
			continue
		}
		t, err := schedstat(filepath.Join("/proc", d.Name(), "schedstat"))
		if err != nil {
			return 0, err
		}
		sum += t
		found = true
	}
	if !found {
		return 0, errors.New("no ksoftirqd thread in /proc")
	}
	return sum, nil
}

// machineBusy is the non-idle time of all CPUs (/proc/stat, ticks of 10 ms).
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: %q", line)
	}
	var busy int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, err
		}
		if i == 3 || i == 4 || i >= 7 { // idle, iowait, steal; guest time is in user already
			continue
		}
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond, nil
}
