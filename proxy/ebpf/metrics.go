package ebpf

import (
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
)

// The backend's own metrics, beside the proxy's kube-proxy-named ones
// (Backend is a prometheus.Collector):
//
//   - weft_ebpf_map_entries and weft_ebpf_map_max_entries per map: how
//     full each map is. The maps weft writes (services, backends,
//     affinity members, source ranges, Maglev tables) are counted from
//     what the writer wrote; the LRU maps the programs fill (revnat,
//     affinity, conntrack) by reading them, at most every lruCountEvery;
//     an LRU map at its maximum evicts its least recently used entries.
//   - weft_ebpf_map_memory_bytes per map: the kernel memory it takes, as
//     the kernel accounts it (Linux >= 6.4 counts what the map holds;
//     earlier kernels, what it may hold at most).
//   - weft_ebpf_map_entries_needed per map the writer fills: what the
//     last sync needed there (at most, while it wrote: capacity.go). Above
//     weft_ebpf_map_max_entries, that sync was refused and wrote nothing
//     (the sync error counter counts it, weft-proxy's /healthz fails): raise
//     --bpf-lb-map-max.
//   - weft_ebpf_program_attached per hook (a cgroup hook, or
//     "tc:<device>:<side>"): 1 while weft's program is there, 0 once it is
//     found detached; the next sync attaches it again and counts it in
//     weft_ebpf_program_reattached_total.
//   - weft_ebpf_ct_insert_failures_total: new flows from outside dropped
//     because their entries could not be written to weft_ct or
//     weft_nat_rev (an LRU map evicts rather than fails: this counts
//     what eviction cannot help). A warning is logged when a conntrack
//     map reaches 90 % of its size (sizing.go).
//   - weft_ebpf_dsr_fallbacks_total: packets of direct-server-return
//     frontends the program could not route itself (bpf/nodeport.c), and
//     weft_ebpf_lb_mode{mode} 1 for the --bpf-lb-mode running.
//   - weft_ebpf_xdp_mode{device,mode} 1 for the hook each uplink's
//     external traffic is translated at (--bpf-xdp): native, generic, or
//     tc where XDP is off or could not attach (auto); and
//     weft_ebpf_xdp_packets_total{action}: packets weft_nodeport_xdp
//     translated, dropped, or handed off to the tc program untouched.
//   - weft_ebpf_udp_sockets_terminated_total: connected UDP sockets
//     destroyed because their backend left the Service, and
//     weft_ebpf_udp_socket_termination_available (0 on a kernel without
//     bpf_sock_destroy).
var (
	descEntries = prometheus.NewDesc("weft_ebpf_map_entries",
		"Entries in a map of the eBPF service proxy", []string{"map"}, nil)
	descMaxEntries = prometheus.NewDesc("weft_ebpf_map_max_entries",
		"Maximum entries of a map of the eBPF service proxy", []string{"map"}, nil)
	descNeeded = prometheus.NewDesc("weft_ebpf_map_entries_needed",
		"Entries the last sync needed in a map of the eBPF service proxy (above its maximum, the sync was refused: raise --bpf-lb-map-max)", []string{"map"}, nil)
	descAttached = prometheus.NewDesc("weft_ebpf_program_attached",
		"1 if weft's program is attached to the hook, 0 if it was found detached (the next sync attaches it again)", []string{"hook"}, nil)
	descReattached = prometheus.NewDesc("weft_ebpf_program_reattached_total",
		"Programs found detached and attached again by a sync", []string{"hook"}, nil)
	descTerminated = prometheus.NewDesc("weft_ebpf_udp_sockets_terminated_total",
		"Connected UDP sockets destroyed because their backend left the Service", nil, nil)
	descTermAvailable = prometheus.NewDesc("weft_ebpf_udp_socket_termination_available",
		"1 if the kernel can destroy connected UDP sockets of removed backends (bpf_sock_destroy)", nil, nil)
	descMemory = prometheus.NewDesc("weft_ebpf_map_memory_bytes",
		"Kernel memory a map of the eBPF service proxy takes, as the kernel accounts it (weft_maglev: the outer map only, each frontend's table adds 4 bytes a slot)", []string{"map"}, nil)
	descDSRFallbacks = prometheus.NewDesc("weft_ebpf_dsr_fallbacks_total",
		"Packets of direct-server-return frontends the per-packet program could not route to the backend's node itself: new flows masqueraded instead, later packets passed to the stack.", nil, nil)
	descLBMode = prometheus.NewDesc("weft_ebpf_lb_mode",
		"1 for the load balancing mode of external traffic to backends of other nodes (--bpf-lb-mode).", []string{"mode"}, nil)
	descXDPMode = prometheus.NewDesc("weft_ebpf_xdp_mode",
		"1 for the hook an uplink's external traffic is translated at: native or generic XDP, or tc (--bpf-xdp off, or auto on a driver without native XDP).", []string{"device", "mode"}, nil)
	descXDPPackets = prometheus.NewDesc("weft_ebpf_xdp_packets_total",
		"Packets of external frontends the XDP program translated, dropped, or handed off untouched to the tc program (DSR, masquerade without XDP metadata).", []string{"action"}, nil)
	descCTFailures = prometheus.NewDesc("weft_ebpf_ct_insert_failures_total",
		"New flows from outside dropped because their conntrack entries could not be written", nil, nil)
)

// lruCountEvery bounds how often the LRU maps are read to count them.
const lruCountEvery = 30 * time.Second

// lruCount is the last count of one LRU map.
type lruCount struct {
	n  int
	at time.Time
}

// Describe implements prometheus.Collector.
func (b *Backend) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEntries, descMaxEntries, descMemory, descNeeded, descAttached, descReattached, descTerminated, descTermAvailable, descCTFailures, descDSRFallbacks, descLBMode, descXDPMode, descXDPPackets} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. The LRU maps are read without
// holding the backend's lock (a sync need not wait for a count).
func (b *Backend) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	lru := map[string]*ebpf.Map{} // clones, closed below
	defer func() {
		for _, m := range lru {
			_ = m.Close()
		}
	}()
	b.mu.Lock()
	ch <- prometheus.MustNewConstMetric(descTerminated, prometheus.CounterValue, float64(b.terminated))
	for hook, n := range b.reattached {
		ch <- prometheus.MustNewConstMetric(descReattached, prometheus.CounterValue, float64(n), hook)
	}
	if b.objs == nil {
		b.mu.Unlock()
		return // not started, or cleaned up
	}
	gauge(descTermAvailable, boolValue(b.udp != nil))
	if n, err := counterSum(b.np.WeftCtFailures, 0); err == nil {
		ch <- prometheus.MustNewConstMetric(descCTFailures, prometheus.CounterValue, float64(n))
	}
	if n, err := counterSum(b.np.WeftDsrFallbacks, 0); err == nil {
		ch <- prometheus.MustNewConstMetric(descDSRFallbacks, prometheus.CounterValue, float64(n))
	}
	gauge(descLBMode, 1, b.cfg.lbMode())
	for d, a := range b.xdp {
		gauge(descXDPMode, 1, d, a.mode)
	}
	if st, err := xdpStats(b.np.WeftXdpStats); err == nil {
		for action, n := range st {
			ch <- prometheus.MustNewConstMetric(descXDPPackets, prometheus.CounterValue, float64(n), action)
		}
	}
	for hook, ok := range b.attachments() {
		gauge(descAttached, boolValue(ok), hook)
	}
	written := b.w.entries()
	for name, n := range b.w.needed {
		gauge(descNeeded, float64(n), name)
	}
	for name, m := range b.maps() {
		gauge(descMaxEntries, float64(m.MaxEntries()), name)
		if info, err := m.Info(); err == nil {
			n, _ := info.Memlock() // 0 (not ok) for an empty trie
			gauge(descMemory, float64(n), name)
		}
		if n, ok := written[name]; ok {
			gauge(descEntries, float64(n), name)
		} else if c, err := m.Clone(); err == nil {
			lru[name] = c
		}
	}
	b.mu.Unlock()
	for name, m := range lru {
		if n, ok := b.lru.count(name, m); ok {
			gauge(descEntries, float64(n), name)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// maps are the backend's pinned maps by name.
func (b *Backend) maps() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		"weft_services": b.objs.WeftServices, "weft_backends": b.objs.WeftBackends, "weft_revnat": b.objs.WeftRevnat,
		"weft_affinity": b.objs.WeftAffinity, "weft_affinity_members": b.objs.WeftAffinityMembers,
		"weft_ct": b.np.WeftCt, "weft_nat_rev": b.np.WeftNatRev, "weft_src_ranges": b.np.WeftSrcRanges, "weft_maglev": b.np.WeftMaglev,
		"weft_ext_affinity": b.np.WeftExtAffinity,
	}
}

// lruCounts are the last counts of the LRU maps.
type lruCounts struct {
	mu   sync.Mutex
	last map[string]lruCount
}

// count returns the entries of LRU map m, read at most every
// lruCountEvery; false if it cannot be read.
func (c *lruCounts) count(name string, m *ebpf.Map) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.last[name]; ok && time.Since(l.at) < lruCountEvery {
		return l.n, true
	}
	n := 0
	it := m.Iterate()
	var k, v []byte
	for it.Next(&k, &v) {
		n++
	}
	if it.Err() != nil {
		return 0, false
	}
	if c.last == nil {
		c.last = map[string]lruCount{}
	}
	c.last[name] = lruCount{n: n, at: time.Now()}
	return n, true
}

// entries counts what the writer keeps in the maps it writes: per
// frontend its master entry and the slots of both halves, the backends,
// the affinity members of frontends with affinity, the source ranges and
// one Maglev table per external frontend with backends.
func (w *writer) entries() map[string]int {
	return map[string]int{"weft_services": w.tally.services, "weft_backends": w.live,
		"weft_affinity_members": w.tally.members, "weft_src_ranges": w.tally.ranges, "weft_maglev": w.tally.maglev}
}

// tally is what entries counts for the frontends, kept as they are
// written and removed: /metrics may be read every few milliseconds, and
// counting 10k frontends under the backend's lock held each sync up.
type tally struct{ services, members, ranges, maglev int }

// add adds (sign 1) or takes away (-1) what frontend k in state f keeps.
func (t *tally) add(k FrontendKey, f *frontendState, sign int) {
	if f == nil {
		return
	}
	t.services += sign * (1 + int(f.used[0]) + int(f.used[1]))
	if f.affinity > 0 {
		t.members += sign * len(f.backends)
	}
	t.ranges += sign * len(f.ranges)
	if k.External && len(f.backends) > 0 {
		t.maglev += sign
	}
}

// counterSum is the value of counter key of the programs' per-CPU
// counter array m, summed over the CPUs.
func counterSum(m *ebpf.Map, key uint32) (uint64, error) {
	var perCPU []uint64
	if err := m.Lookup(key, &perCPU); err != nil {
		return 0, err
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n, nil
}
