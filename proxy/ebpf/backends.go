package ebpf

// The writer's backends: the backends map's entries (id -> address, port,
// flags), written before the frontends that name them, counted by the
// active lists that name them, and retired (marked BACKEND_GONE, deleted
// after a grace period) when no list does.

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// backendBatch bounds the backends written by one map update.
const backendBatch = 4096

// addBackends writes the backends the frontends keys will name and the map
// lacks, a batch of them per update (a first sync writes one per endpoint
// of the cluster). A backend no frontend names yet is unused until one
// does. After a failed update the rest are left to write, which writes
// each alone and names the frontend of one that fails.
func (w *writer) addBackends(want map[FrontendKey]Frontend, keys []FrontendKey) {
	n := 0
	for _, k := range keys {
		n += len(want[k].Backends)
	}
	aps := make([]netip.AddrPort, 0, n)
	seen := make(map[netip.AddrPort]bool, n)
	remote := map[netip.AddrPort]bool{}
	for _, k := range keys {
		f := want[k]
		for i, ap := range f.Backends {
			if _, ok := w.backendID[ap]; !ok && !seen[ap] {
				seen[ap] = true
				aps = append(aps, ap)
			}
			if f.Remote != nil && f.Remote[i] {
				remote[ap] = true
			}
		}
	}
	if len(w.backendID) == 0 && len(aps) > 0 {
		// A first fill: the maps of the writer get their size at once
		// rather than by doubling.
		w.backendID, w.backendAddr = make(map[netip.AddrPort]uint32, len(aps)), make(map[uint32]netip.AddrPort, len(aps))
		w.refs, w.unused = make(map[uint32]int, len(aps)), make(map[uint32]bool, len(aps))
	}
	for len(aps) > 0 {
		n := min(len(aps), backendBatch)
		ids := make([]uint32, n)
		vals := make([]sockBackend, n)
		for i, ap := range aps[:n] {
			ids[i] = w.nextBackend + 1 + uint32(i)
			vals[i] = sockBackend{Addr: toWords(ap.Addr()), Port: htons(ap.Port())}
			if remote[ap] {
				vals[i].Flags = backendRemote
			}
		}
		done, err := w.backends.BatchUpdate(ids, vals, nil)
		for i, ap := range aps[:min(done, n)] {
			w.added(ap, ids[i])
			if remote[ap] {
				w.remote[ids[i]] = true
			}
		}
		if err != nil {
			return // the rest one by one, each error naming its frontend
		}
		aps = aps[n:]
	}
}

// backend returns the id of ap, writing a new backend entry if needed.
func (w *writer) backend(ap netip.AddrPort) (uint32, error) {
	if id, ok := w.backendID[ap]; ok {
		return id, nil
	}
	id := w.nextBackend + 1
	if err := w.backends.Update(id, sockBackend{Addr: toWords(ap.Addr()), Port: htons(ap.Port())}, ebpf.UpdateAny); err != nil {
		return 0, fmt.Errorf("writing backend %s: %w", ap, err)
	}
	w.added(ap, id)
	return id, nil
}

// backendRemote is bpf/lb.h's BACKEND_REMOTE.
const backendRemote = 2

// setRemote makes backend id's BACKEND_REMOTE flag say what f, naming it
// as its i-th backend, says (f.Remote nil: nothing; a backend's node is
// the same whichever frontend names it).
func (w *writer) setRemote(id uint32, f Frontend, i int) error {
	if f.Remote == nil || f.Remote[i] == w.remote[id] {
		return nil
	}
	ap := f.Backends[i]
	v := sockBackend{Addr: toWords(ap.Addr()), Port: htons(ap.Port())}
	if f.Remote[i] {
		v.Flags = backendRemote
	}
	if err := w.backends.Update(id, v, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("writing backend %s: %w", ap, err)
	}
	if f.Remote[i] {
		w.remote[id] = true
	} else {
		delete(w.remote, id)
	}
	return nil
}

// added records backend ap written as id.
func (w *writer) added(ap netip.AddrPort, id uint32) {
	w.nextBackend = max(w.nextBackend, id)
	w.backendID[ap], w.backendAddr[id] = id, ap
	w.unused[id] = true // until a master entry names it
	w.Stats.BackendsAdded++
}

// ref moves the active-list counts from old to new ids, noting backends
// that no list uses any more.
func (w *writer) ref(old, new []uint32) {
	for _, id := range new {
		w.refs[id]++
		delete(w.unused, id)
	}
	for _, id := range old {
		if w.refs[id]--; w.refs[id] <= 0 {
			delete(w.refs, id)
			w.unused[id] = true
		}
	}
}

// backendGone is bpf/lb.h's BACKEND_GONE.
const backendGone = 1

// retire marks the backends of ids that no active list uses any more
// BACKEND_GONE, to be deleted after a grace period (grace.go): the
// backends the lists rewritten by this sync left. The writer forgets
// them at once, so that an endpoint coming back gets a new entry.
func (w *writer) retire(ids map[uint32]bool) error {
	var keys []uint32
	var vals []sockBackend
	for id := range ids {
		if w.refs[id] > 0 {
			delete(w.unused, id)
			continue
		}
		ap := w.backendAddr[id]
		keys = append(keys, id)
		vals = append(vals, sockBackend{Addr: toWords(ap.Addr()), Port: htons(ap.Port()), Flags: backendGone})
	}
	var errs []error
	for len(keys) > 0 {
		n := min(len(keys), backendBatch)
		done, err := w.backends.BatchUpdate(keys[:n], vals[:n], nil)
		if err == nil {
			done = n
		}
		for i := range n {
			// One by one what a failed batch left; a backend that
			// cannot be marked is deleted now.
			if i >= done {
				if err := w.backends.Update(keys[i], vals[i], ebpf.UpdateAny); err != nil {
					if err := w.backends.Delete(keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
						errs = append(errs, fmt.Errorf("retiring backend %s: %w", w.backendAddr[keys[i]], err))
						continue
					}
					w.forget(keys[i])
					continue
				}
			}
			w.retired = append(w.retired, keys[i])
			w.forget(keys[i])
		}
		keys, vals = keys[n:], vals[n:]
	}
	return errors.Join(errs...)
}

// forget drops backend id from what the writer remembers.
func (w *writer) forget(id uint32) {
	ap := w.backendAddr[id]
	delete(w.unused, id)
	delete(w.backendAddr, id)
	delete(w.backendID, ap)
	delete(w.remote, id)
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

// collect deletes the backends of ids that no active list uses any more.
func (w *writer) collect(ids map[uint32]bool) error {
	var errs []error
	for id := range ids {
		if w.refs[id] > 0 {
			delete(w.unused, id)
			continue
		}
		if err := w.backends.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting backend %s: %w", w.backendAddr[id], err))
			continue
		}
		w.forget(id)
	}
	return errors.Join(errs...)
}
