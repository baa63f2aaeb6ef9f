package ebpf

import (
	"bufio"
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

// pressureWarn is the fill ratio from which a conntrack map is reported
// full soon.
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
