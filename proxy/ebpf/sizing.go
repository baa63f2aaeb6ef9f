package ebpf

import (
	"bufio"
	"fmt"
	"math/bits"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
)

// The conntrack maps of the per-packet programs (weft_ct and
// weft_nat_rev) hold one entry each per flow from outside: about 230
// bytes of kernel memory a flow. They are sized from the node's memory
// unless --bpf-ct-max says otherwise: a quarter of a percent of it (the
// share Cilium's dynamic map sizing gives all of its maps), rounded down
// to a power of two, at least 65,536 (262,144 on a node of 23 GiB). A map
// at its size evicts its least recently used entries; the entries of
// closed TCP connections leave at once (bpf/nodeport.c), and a flow whose
// entries were evicted is balanced again to the same backend by its
// Maglev hash while the backends stand.
const (
	MinCTMax     = 1 << 10
	MaxCTMax     = 1 << 24
	defaultCTMin = 1 << 16
	flowBytes    = 230
)

// CTMaxFor is the conntrack maps' size for a node of mem bytes.
func CTMaxFor(mem uint64) int {
	n := mem / 400 / flowBytes // 0.25 %
	if n < defaultCTMin {
		return defaultCTMin
	}
	if n > MaxCTMax {
		return MaxCTMax
	}
	return 1 << (bits.Len64(n) - 1)
}

// The maps the writer fills grow with the Services and endpoints
// (bpf/lb.h, bpf/nodeport.c): weft_services holds, per frontend, its
// master entry and the slots of its active list, 1+n entries for n
// backends (a rewrite writes the new list into the other half, and the
// old one is deleted after the grace period that follows: 1+2n until
// then; a restart's full sync compares each frontend with what it read
// back and rewrites only those that changed);
// weft_backends one
// entry per endpoint address and port; weft_affinity_members one per
// backend of a frontend with ClientIP affinity; weft_src_ranges one per
// loadBalancerSourceRange of an external frontend; weft_maglev one table
// per external frontend with backends. The hash maps and the trie are
// allocated per entry (BPF_F_NO_PREALLOC): an entry costs about 110
// bytes of kernel memory once written; the hash maps' buckets cost 16
// bytes per entry of capacity from the start. One number sets their
// capacities, --bpf-lb-map-max, the services map's: the backends, affinity
// members and source ranges maps get half of it, the Maglev map a 64th
// (at least 65,536 both of the last two; the Maglev map is preallocated,
// and each of its tables costs 8 KiB and more). By default it is one entry
// per 4 KiB of the node's memory, a power of two from 524,288 (the fixed
// size of earlier versions) to 4,194,304: the buckets of the three hash
// maps (32 bytes per unit) take under 1 % of the memory (128 MiB at
// most), and from 16 GiB on, 100,000 Services of 10
// endpoints each fit (1.1 million entries in the services map, 2.1
// million during a sync that changes every list, 1 million backends). A larger cluster
// raises --bpf-lb-map-max. A sync whose state does not fit writes nothing
// and fails, naming the map (CapacityError).
const (
	MinLBMax     = 1 << 10
	MaxLBMax     = 1 << 26
	defaultLBMin = 1 << 19
	defaultLBMax = 1 << 22
)

// LBMaxFor is the services map's capacity (--bpf-lb-map-max) for a node
// of mem bytes.
func LBMaxFor(mem uint64) int {
	n := mem >> 12
	if n < defaultLBMin {
		return defaultLBMin
	}
	if n > defaultLBMax {
		return defaultLBMax
	}
	return 1 << (bits.Len64(n) - 1)
}

// lbMapNames are the maps the writer fills, whose capacities
// --bpf-lb-map-max sets (in the order their pins are replaced: see
// pinLB).
var lbMapNames = []string{"weft_backends", "weft_affinity_members", "weft_src_ranges", "weft_maglev", "weft_services"}

// lbShare is the part of --bpf-lb-map-max a map gets: n/div, at least
// floor.
type lbShare struct {
	div, floor int
	what       string
}

var lbShares = map[string]lbShare{
	"weft_services":         {1, 0, "all"},
	"weft_backends":         {2, 0, "half"},
	"weft_affinity_members": {2, 0, "half"},
	"weft_src_ranges":       {2, 1 << 16, "half, at least 65536,"},
	"weft_maglev":           {64, 1 << 16, "a 64th, at least 65536,"},
}

// LBCapacities are the capacities of the maps the writer fills for
// --bpf-lb-map-max n, by map name.
func LBCapacities(n int) map[string]int {
	out := make(map[string]int, len(lbShares))
	for name, s := range lbShares {
		out[name] = max(n/s.div, s.floor)
	}
	return out
}

// CapacityError is a sync refused because its state does not fit a map
// the writer fills: nothing was written, the maps keep the previous
// state. LBMax is --bpf-lb-map-max (0: not known, a writer of tests).
type CapacityError struct {
	Map              string
	Needed, Capacity int
	LBMax            int
}

func (e *CapacityError) Error() string {
	s := fmt.Sprintf("map %s needs %d entries for this state and holds at most %d", e.Map, e.Needed, e.Capacity)
	if sh, ok := lbShares[e.Map]; ok && e.LBMax > 0 {
		s += fmt.Sprintf(" (%s of --bpf-lb-map-max %d)", sh.what, e.LBMax)
	}
	return s + ": raise --bpf-lb-map-max"
}

// memTotal is the node's memory in bytes (/proc/meminfo's MemTotal), 0
// when unknown.
func memTotal() uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// pressureEvery is how often the conntrack maps are counted for the
// pressure warning (and the metrics, which reuse the count).
const pressureEvery = lruCountEvery

// pressureWarn is the fill ratio from which a conntrack map, or a map the
// writer fills, is reported full soon.
const pressureWarn = 0.9

// watchPressure counts the conntrack maps every pressureEvery until stop
// is closed, and logs a warning when one crosses pressureWarn of its size
// (once per crossing), before it is full and starts evicting the entries
// of live flows.
func (b *Backend) watchPressure(maps map[string]*ebpf.Map, stop <-chan struct{}) {
	warned := map[string]bool{}
	t := time.NewTicker(pressureEvery)
	defer t.Stop()
	for {
		for name, m := range maps {
			n, ok := b.lru.count(name, m)
			if !ok {
				continue
			}
			max := m.MaxEntries()
			full := float64(n) >= pressureWarn*float64(max)
			if full && !warned[name] {
				b.cfg.Log.Warn("an eBPF conntrack map is nearly full: the least recently used flows' entries will be evicted (raise --bpf-ct-max)",
					"map", name, "entries", n, "max_entries", max)
			}
			warned[name] = full
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}
