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
	// freed are the backends the removals leave unused and no frontend
	// written names, deleted before new ones are added.
	freed map[uint32]bool
}

// plan counts what apply(want, keys) needs (see above).
func (w *writer) plan(want map[FrontendKey]Frontend, keys []FrontendKey) applyPlan {
	services, members, ranges, tables := w.tally.services, w.tally.members, w.tally.ranges, w.tally.maglev
	// The removals.
	drop := map[uint32]int{}
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
		for _, id := range cur.backends {
			drop[id]++
		}
	}
	// The backends unused once the removals are done: candidates, unless
	// a frontend written names them.
	unused := map[netip.AddrPort]uint32{}
	candidate := func(id uint32) {
		if ap, ok := w.backendAddr[id]; ok && w.refs[id]-drop[id] <= 0 {
			unused[ap] = id
		}
	}
	for id := range w.unused {
		candidate(id)
	}
	for id := range drop {
		candidate(id)
	}
	// The frontends written.
	var added map[netip.AddrPort]bool
	if len(w.backendID) == 0 {
		// A first fill: nearly every backend is new.
		n := 0
		for _, k := range keys {
			n += len(want[k].Backends)
		}
		added = make(map[netip.AddrPort]bool, n)
	} else {
		added = map[netip.AddrPort]bool{}
	}
	for _, k := range keys {
		f, ok := want[k]
		if !ok || len(f.Backends) >= slotHalf {
			continue // removed, or refused by write
		}
		cur := w.fronts[k]
		n := len(f.Backends)
		for _, ap := range f.Backends {
			delete(unused, ap)
			if _, ok := w.backendID[ap]; !ok {
				added[ap] = true
			}
		}
		if cur != nil && w.unchanged(cur, f) {
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
	freed := make(map[uint32]bool, len(unused))
	for _, id := range unused {
		freed[id] = true
	}
	return applyPlan{
		need: map[string]int{"weft_services": services, "weft_backends": len(w.backendAddr) + len(w.retired) - len(freed) + len(added),
			"weft_affinity_members": members, "weft_src_ranges": ranges, "weft_maglev": tables},
		freed: freed,
	}
}

// unchanged reports whether frontend f is what state cur holds, as write
// compares them (write skips it).
func (w *writer) unchanged(cur *frontendState, f Frontend) bool {
	if cur.flags != flagsOf(f) || cur.affinity != uint32(f.AffinitySeconds) || len(cur.backends) != len(f.Backends) ||
		!slices.Equal(cur.ranges, f.SourceRanges) {
		return false
	}
	for i, ap := range f.Backends {
		if id, ok := w.backendID[ap]; !ok || id != cur.backends[i] {
			return false
		}
	}
	return true
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
		if id, ok := w.backendID[ap]; !ok || !has[id] {
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
