package ebpf

// The writer's backends: the backends map's entries (id -> address, port,
// flags), written before the frontends that name them, counted by the
// active lists that name them, and retired (marked BACKEND_GONE, deleted
// after a grace period) when no list does.
//
// The writer keeps them in a slice (backs) indexed by a dense index of
// its own, reused once a backend is forgotten; the frontends' lists hold
// these indices. The key in the backends map (id) is another number,
// never reused, since conntrack entries of flows from outside name it.

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// backendBatch bounds the entries written by one map update.
const backendBatch = 4096

// backendState is what the writer knows of one backend.
type backendState struct {
	ap     netip.AddrPort
	id     uint32 // its key in the backends map; 0: a free index
	refs   int32  // active lists naming it
	remote bool   // written BACKEND_REMOTE
	listed bool   // in unused
	// Scratch of plan, zero outside it.
	drop int32 // removals naming it
	cand bool  // a candidate for freed
}

// backendTable is the writer's backends.
type backendTable struct {
	backs  []backendState
	free   []uint32                  // indices of backs to reuse
	byAddr map[netip.AddrPort]uint32 // the index of each backend
	live   int                       // backends written
	// unused lists the indices to check at the end of an apply: whose
	// count fell to 0, or that were added (duplicates and indices reused
	// since are harmless: a check looks at the backend there now).
	unused []uint32
	// pending are the indices plan gave the backends apply adds
	// (addBackends writes them; until then their id is 0 and they are
	// not live).
	pending     []uint32
	nextBackend uint32
}

// index returns a new index for ap, not yet written (id 0).
func (t *backendTable) index(ap netip.AddrPort) uint32 {
	var i uint32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
		t.backs[i] = backendState{ap: ap}
	} else {
		i = uint32(len(t.backs))
		t.backs = append(t.backs, backendState{ap: ap})
	}
	t.byAddr[ap] = i
	return i
}

// release forgets index i.
func (t *backendTable) release(i uint32) {
	b := &t.backs[i]
	if t.byAddr[b.ap] == i {
		delete(t.byAddr, b.ap)
	}
	if b.id != 0 {
		t.live--
	}
	*b = backendState{}
	t.free = append(t.free, i)
}

// note lists backend i in unused.
func (t *backendTable) note(i uint32) {
	if b := &t.backs[i]; !b.listed {
		b.listed = true
		t.unused = append(t.unused, i)
	}
}

// ids are the backend map keys of the backends at indices idx.
func (t *backendTable) ids(idx []uint32) []uint32 {
	out := make([]uint32, len(idx))
	for i, x := range idx {
		out[i] = t.backs[x].id
	}
	return out
}

// addBackends writes the backends plan gave an index (pending), a batch
// of them per update (a first sync writes one per endpoint of the
// cluster). A backend no frontend names yet is unused until one does.
// After a failed update the writer forgets the rest, which write then
// writes each alone, an error naming the frontend of one that fails.
func (w *writer) addBackends() {
	todo := w.pending
	w.pending = nil
	ids := make([]uint32, min(len(todo), backendBatch))
	vals := make([]sockBackend, len(ids))
	for len(todo) > 0 {
		n := min(len(todo), backendBatch)
		for j, i := range todo[:n] {
			b := &w.backs[i]
			ids[j] = w.nextBackend + 1 + uint32(j)
			vals[j] = sockBackend{Addr: toWords(b.ap.Addr()), Port: htons(b.ap.Port())}
			if b.remote {
				vals[j].Flags = backendRemote
			}
		}
		done, err := w.backends.BatchUpdate(ids[:n], vals[:n], nil)
		if err != nil {
			done = min(max(done, 0), n)
		}
		for j, i := range todo[:done] {
			w.added(i, ids[j])
		}
		if err != nil {
			for _, i := range todo[done:] {
				w.release(i)
			}
			return
		}
		todo = todo[n:]
	}
}

// dropPending forgets the backends plan gave an index and apply did not
// write.
func (w *writer) dropPending() {
	for _, i := range w.pending {
		w.release(i)
	}
	w.pending = nil
}

// backend returns the index of ap, writing a new backend entry if needed.
func (w *writer) backend(ap netip.AddrPort) (uint32, error) {
	if i, ok := w.byAddr[ap]; ok {
		return i, nil
	}
	id := w.nextBackend + 1
	if err := w.backends.Update(id, sockBackend{Addr: toWords(ap.Addr()), Port: htons(ap.Port())}, ebpf.UpdateAny); err != nil {
		return 0, fmt.Errorf("writing backend %s: %w", ap, err)
	}
	i := w.index(ap)
	w.added(i, id)
	return i, nil
}

// backendRemote is bpf/lb.h's BACKEND_REMOTE.
const backendRemote = 2

// setRemote makes backend i's BACKEND_REMOTE flag say what f, naming it
// as its j-th backend, says (f.Remote nil: nothing; a backend's node is
// the same whichever frontend names it).
func (w *writer) setRemote(i uint32, f Frontend, j int) error {
	b := &w.backs[i]
	if f.Remote == nil || f.Remote[j] == b.remote {
		return nil
	}
	v := sockBackend{Addr: toWords(b.ap.Addr()), Port: htons(b.ap.Port())}
	if f.Remote[j] {
		v.Flags = backendRemote
	}
	if err := w.backends.Update(b.id, v, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("writing backend %s: %w", b.ap, err)
	}
	b.remote = f.Remote[j]
	return nil
}

// added records backend i written as id.
func (w *writer) added(i, id uint32) {
	w.nextBackend = max(w.nextBackend, id)
	w.backs[i].id = id
	w.live++
	w.note(i) // until a master entry names it
	w.Stats.BackendsAdded++
}

// ref moves the active-list counts from old to new indices, noting
// backends that no list uses any more.
func (w *writer) ref(old, new []uint32) {
	for _, i := range new {
		w.backs[i].refs++
	}
	for _, i := range old {
		b := &w.backs[i]
		if b.refs--; b.refs <= 0 {
			b.refs = 0
			w.note(i)
		}
	}
}

// backendGone is bpf/lb.h's BACKEND_GONE.
const backendGone = 1

// retire marks the backends of unused that no active list uses any more
// BACKEND_GONE, to be deleted after a grace period (grace.go): the
// backends the lists rewritten by this sync left. The writer forgets
// them at once, so that an endpoint coming back gets a new entry.
func (w *writer) retire() error {
	var idx, keys []uint32
	var vals []sockBackend
	var left []uint32
	for _, i := range w.unused {
		b := &w.backs[i]
		if !b.listed {
			continue
		}
		b.listed = false
		if b.refs > 0 || b.id == 0 {
			continue
		}
		idx, keys = append(idx, i), append(keys, b.id)
		vals = append(vals, sockBackend{Addr: toWords(b.ap.Addr()), Port: htons(b.ap.Port()), Flags: backendGone})
	}
	var errs []error
	for len(keys) > 0 {
		n := min(len(keys), backendBatch)
		done, err := w.backends.BatchUpdate(keys[:n], vals[:n], nil)
		if err == nil {
			done = n
		}
		for j := range n {
			// One by one what a failed batch left; a backend that
			// cannot be marked is deleted now.
			if j >= done {
				if err := w.backends.Update(keys[j], vals[j], ebpf.UpdateAny); err != nil {
					if err := w.backends.Delete(keys[j]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
						errs = append(errs, fmt.Errorf("retiring backend %s: %w", w.backs[idx[j]].ap, err))
						left = append(left, idx[j])
						continue
					}
					w.forget(idx[j])
					continue
				}
			}
			w.retired = append(w.retired, keys[j])
			w.forget(idx[j])
		}
		idx, keys, vals = idx[n:], keys[n:], vals[n:]
	}
	w.unused = w.unused[:0]
	for _, i := range left {
		w.note(i) // tried again by the next sync
	}
	return errors.Join(errs...)
}

// forget drops backend i from what the writer remembers.
func (w *writer) forget(i uint32) {
	w.release(i)
	w.Stats.BackendsRemoved++
}

// dropRetired deletes the retired backends (after a grace period); those
// it cannot delete stay retired.
func (w *writer) dropRetired() error {
	var errs []error
	var left []uint32
	for _, id := range w.retired {
		if err := w.backends.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting retired backend %d: %w", id, err))
			left = append(left, id)
		}
	}
	w.retired = left
	return errors.Join(errs...)
}

// collect deletes the backends of freed (indices) that no active list
// uses any more.
func (w *writer) collect(freed []uint32) error {
	var errs []error
	for _, i := range freed {
		b := &w.backs[i]
		if b.refs > 0 || b.id == 0 {
			continue
		}
		if err := w.backends.Delete(b.id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting backend %s: %w", b.ap, err))
			continue
		}
		w.forget(i)
	}
	return errors.Join(errs...)
}
