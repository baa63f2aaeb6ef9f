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
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
)

// backendBatch bounds the entries written by one map update.
const backendBatch = 4096

// backendKey is a backend's address and port as the backends map holds
// them (with no pointer, the garbage collector does not scan the
// writer's tables of millions of them).
type backendKey struct {
	addr [4]uint32
	port uint16 // network order
}

func keyOf(ap netip.AddrPort) backendKey { return backendKey{toWords(ap.Addr()), htons(ap.Port())} }

// value is the backends map's value of k.
func (k backendKey) value(flags uint16) sockBackend {
	return sockBackend{Addr: k.addr, Port: k.port, Flags: flags}
}

func (k backendKey) addrPort() netip.AddrPort {
	return netip.AddrPortFrom(fromWords(k.addr), ntohs(k.port))
}

func (k backendKey) String() string { return k.addrPort().String() }

// backendState is what the writer knows of one backend.
type backendState struct {
	key    backendKey
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
	backs  []backendState        // by index; index 0 names none (a slot load found missing)
	free   []uint32              // indices of backs to reuse
	byAddr map[backendKey]uint32 // the index of each backend
	live   int                   // backends written
	// unused lists the indices to check at the end of an apply: whose
	// count fell to 0, or that were added (duplicates and indices reused
	// since are harmless: a check looks at the backend there now).
	unused []uint32
	// pending are the indices plan gave the backends apply adds
	// (addBackends writes them; until then their id is 0 and they are
	// not live).
	pending     []uint32
	nextBackend uint32 // the highest id written
}

// index returns a new index for k, not yet written (id 0).
func (t *backendTable) index(k backendKey) uint32 {
	var i uint32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
		t.backs[i] = backendState{key: k}
	} else {
		i = uint32(len(t.backs))
		t.backs = append(t.backs, backendState{key: k})
	}
	t.byAddr[k] = i
	return i
}

// release forgets index i.
func (t *backendTable) release(i uint32) {
	b := &t.backs[i]
	if t.byAddr[b.key] == i {
		delete(t.byAddr, b.key)
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
// of them per update, the batches on every CPU (a first sync writes one
// per endpoint of the cluster). A backend no frontend names yet is unused
// until one does. The writer forgets those a failed update left, which
// write then writes each alone, an error naming the frontend of one that
// fails.
func (w *writer) addBackends() {
	todo, base := w.pending, w.nextBackend
	w.pending = nil
	w.unused = slices.Grow(w.unused, len(todo)) // added notes each
	res := writeBatches(evenBounds(len(todo)), func() func(from, to int) (int, error) {
		ids := make([]uint32, min(len(todo), backendBatch))
		vals := make([]sockBackend, len(ids))
		return func(from, to int) (int, error) {
			for j, i := range todo[from:to] {
				b := &w.backs[i]
				ids[j], vals[j] = base+1+uint32(from+j), b.key.value(0)
				if b.remote {
					vals[j].Flags = backendRemote
				}
			}
			return w.backends.BatchUpdate(ids[:to-from], vals[:to-from], nil)
		}
	})
	for _, r := range res {
		for j := r.from; j < r.to; j++ {
			if j < r.from+r.done {
				w.added(todo[j], base+1+uint32(j))
			} else {
				w.release(todo[j])
			}
		}
	}
}

// batchResult is what one update of writeBatches did: entries from..to,
// of which the first done were written.
type batchResult struct {
	from, to, done int
	err            error
}

// evenBounds are the bounds of n entries cut into batches of backendBatch.
func evenBounds(n int) []int {
	bounds := []int{0}
	for from := 0; from < n; from += backendBatch {
		bounds = append(bounds, min(from+backendBatch, n))
	}
	return bounds
}

// writeBatches makes the updates of the batches bounds[i]..bounds[i+1]
// on every CPU (they are independent, and the kernel's hash maps lock per
// bucket), each goroutine with the update function newUpdate gives it
// (its own buffers), and returns their results in order.
func writeBatches(bounds []int, newUpdate func() func(from, to int) (int, error)) []batchResult {
	res := make([]batchResult, max(len(bounds)-1, 0))
	var next atomic.Int64
	work := func() {
		update := newUpdate()
		for b := int(next.Add(1)) - 1; b < len(res); b = int(next.Add(1)) - 1 {
			r := batchResult{from: bounds[b], to: bounds[b+1]}
			r.done, r.err = update(r.from, r.to)
			if r.err == nil {
				r.done = r.to - r.from
			}
			r.done = min(max(r.done, 0), r.to-r.from)
			res[b] = r
		}
	}
	workers := min(runtime.GOMAXPROCS(0), len(res))
	if workers <= 1 {
		work()
		return res
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(work)
	}
	wg.Wait()
	return res
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
	k := keyOf(ap)
	if i, ok := w.byAddr[k]; ok {
		return i, nil
	}
	id := w.nextBackend + 1
	if err := w.backends.Update(id, k.value(0), ebpf.UpdateAny); err != nil {
		return 0, fmt.Errorf("writing backend %s: %w", ap, err)
	}
	i := w.index(k)
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
	v := b.key.value(0)
	if f.Remote[j] {
		v.Flags = backendRemote
	}
	if err := w.backends.Update(b.id, v, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("writing backend %s: %w", b.key, err)
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
		vals = append(vals, b.key.value(backendGone))
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
						errs = append(errs, fmt.Errorf("retiring backend %s: %w", w.backs[idx[j]].key, err))
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
			errs = append(errs, fmt.Errorf("deleting backend %s: %w", b.key, err))
			continue
		}
		w.forget(i)
	}
	return errors.Join(errs...)
}
