package ebpf

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// Before apply writes anything it counts what the maps will hold, so
// that a state too large for them is refused whole (a CapacityError)
// rather than written up to a full map: a half-written sync would leave
// some Services on their previous state, others missing, and every retry
// would fail the same way. The count is an upper bound on what each map
// holds at any point of the apply, in the order apply writes: first the
// removals (which free their entries, and their backends no frontend
// still names), then per frontend written what it adds: a new one its
// master entry and slots; a rewritten one the slots of its new list
// beyond what its inactive half still holds (that half is overwritten;
// the active half stays until the grace period after the sync, grace.go),
// nothing when write will skip it as unchanged; new backends, affinity members, source ranges and
// a Maglev table. What a rewrite frees is not counted.

// applyPlan is what apply will do, counted before it writes.
type applyPlan struct {
	// need is what each map holds at most meanwhile, by name.
	need map[string]int
	// freed are the backends (indices) the removals leave unused and no
	// frontend written names, deleted before new ones are added.
	freed []uint32
	// lists[j] are the indices of the backends of keys[j] (nil: removed,
	// or refused by write), those of pending included.
	lists [][]uint32
}

// plan counts what apply(want, keys) needs (see above). It gives the
// backends the frontends name and the writer lacks an index (pending,
// for addBackends; apply forgets them if it writes nothing).
func (w *writer) plan(want map[FrontendKey]Frontend, keys []FrontendKey) applyPlan {
	services, members, ranges, tables := w.tally.services, w.tally.members, w.tally.ranges, w.tally.maglev
	// The removals.
	var dropped []uint32
	for _, k := range keys {
		cur := w.fronts[k]
		if _, ok := want[k]; ok || cur == nil {
			continue
		}
		services -= 1 + int(cur.used[0]) + int(cur.used[1])
		if cur.affinity > 0 {
			members -= len(cur.backends)
		}
		ranges -= len(cur.ranges)
		if k.External && len(cur.backends) > 0 {
			tables--
		}
		for _, i := range cur.backends {
			w.backs[i].drop++
			dropped = append(dropped, i)
		}
	}
	// The backends unused once the removals are done: candidates, unless
	// a frontend written names them.
	var cands []uint32
	candidate := func(i uint32) {
		if b := &w.backs[i]; b.id != 0 && !b.cand && b.refs-b.drop <= 0 {
			b.cand = true
			cands = append(cands, i)
		}
	}
	for _, i := range w.unused {
		candidate(i)
	}
	for _, i := range dropped {
		candidate(i)
	}
	// The frontends written.
	lists := make([][]uint32, len(keys))
	if len(w.byAddr) == 0 {
		// A first fill: nearly every backend is new. The table gets its
		// size at once rather than by doubling.
		n := 0
		for _, k := range keys {
			n += len(want[k].Backends)
		}
		w.byAddr = make(map[backendKey]uint32, n)
		w.backs = slices.Grow(w.backs, n)
	}
	for x, k := range keys {
		f, ok := want[k]
		if !ok || len(f.Backends) >= slotHalf {
			continue // removed, or refused by write
		}
		cur := w.fronts[k]
		n := len(f.Backends)
		lists[x] = make([]uint32, n)
		for j, ap := range f.Backends {
			k := keyOf(ap)
			i, ok := w.byAddr[k]
			if !ok {
				i = w.index(k)
				w.pending = append(w.pending, i)
			}
			lists[x][j] = i
			b := &w.backs[i]
			b.cand = false
			if b.id == 0 && f.Remote != nil && f.Remote[j] {
				b.remote = true // written so by addBackends
			}
		}
		if cur != nil && w.unchanged(cur, f, lists[x]) {
			continue
		}
		if cur == nil {
			services += 1 + n
		} else {
			services += max(0, n-int(cur.used[1-cur.half]))
		}
		if f.AffinitySeconds > 0 {
			members += w.newMembers(cur, f.Backends)
		}
		for _, p := range f.SourceRanges {
			if cur == nil || !slices.Contains(cur.ranges, p) {
				ranges++
			}
		}
		if k.External && n > 0 && (cur == nil || len(cur.backends) == 0) {
			tables++
		}
	}
	var freed []uint32
	for _, i := range cands {
		if b := &w.backs[i]; b.cand {
			b.cand = false
			freed = append(freed, i)
		}
	}
	for _, i := range dropped {
		w.backs[i].drop = 0
	}
	return applyPlan{
		need: map[string]int{"weft_services": services, "weft_backends": w.live + len(w.retired) - len(freed) + len(w.pending),
			"weft_affinity_members": members, "weft_src_ranges": ranges, "weft_maglev": tables},
		freed: freed,
		lists: lists,
	}
}

// unchanged reports whether frontend f, whose backends are list
// (indices), is what state cur holds, as write compares them (write skips
// it).
func (w *writer) unchanged(cur *frontendState, f Frontend, list []uint32) bool {
	return cur.flags == flagsOf(f) && cur.affinity == uint32(f.AffinitySeconds) && slices.Equal(cur.backends, list) &&
		slices.Equal(cur.ranges, f.SourceRanges)
}

// newMembers counts the affinity members a frontend in state cur (nil: a
// new one) with backends adds: those it does not have yet.
func (w *writer) newMembers(cur *frontendState, backends []netip.AddrPort) int {
	if cur == nil || cur.affinity == 0 {
		return len(backends)
	}
	has := make(map[uint32]bool, len(cur.backends))
	for _, id := range cur.backends {
		has[id] = true
	}
	n := 0
	for _, ap := range backends {
		if i, ok := w.byAddr[keyOf(ap)]; !ok || !has[i] {
			n++
		}
	}
	return n
}

// fits returns the CapacityErrors of the maps whose need exceeds their
// capacity, nil when every one fits.
func (w *writer) fits(need map[string]int) error {
	var errs []error
	for _, name := range lbMapNames {
		m := w.lbMap(name)
		if m == nil {
			continue
		}
		if c := int(m.MaxEntries()); need[name] > c {
			errs = append(errs, &CapacityError{Map: name, Needed: need[name], Capacity: c, LBMax: w.lbMax})
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("refusing a state that does not fit the maps (nothing written, the previous state stays): %w", errors.Join(errs...))
}

// lbMap is the writer's map of that name (nil: the writer has none).
func (w *writer) lbMap(name string) *ebpf.Map {
	switch name {
	case "weft_services":
		return w.services
	case "weft_backends":
		return w.backends
	case "weft_affinity_members":
		return w.members
	case "weft_src_ranges":
		return w.ranges
	case "weft_maglev":
		return w.maglev
	}
	return nil
}

// warnLB logs a warning when what a sync needs in a map the writer fills
// crosses pressureWarn of its capacity (once per crossing), before syncs
// are refused.
func (b *Backend) warnLB() {
	for _, name := range lbMapNames {
		m, n := b.w.lbMap(name), b.w.needed[name]
		if m == nil {
			continue
		}
		full := float64(n) >= pressureWarn*float64(m.MaxEntries())
		if full && !b.lbWarned[name] {
			b.cfg.Log.Warn("an eBPF service map is 90 % full or more: a sync whose Services do not fit is refused (raise --bpf-lb-map-max)",
				"map", name, "entries_needed", n, "max_entries", m.MaxEntries(), "bpf_lb_map_max", b.cfg.LBMax)
		}
		b.lbWarned[name] = full
	}
}
