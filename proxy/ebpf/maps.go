package ebpf

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/weftnet/weft/proxy/model"
)

// slotHalf is the size of each half of a frontend's slot space (SLOT_HALF
// in bpf/sock.c); a frontend has at most slotHalf-1 backends.
const slotHalf = 32768

// Master entry flags (SVC_* in bpf/lb.h).
const (
	flagReject = 1
	flagDrop   = 2
	flagSNAT   = 4
	flagRanges = 8
	flagDSR    = 16
)

// Frontend scopes (SCOPE_* in bpf/lb.h).
const (
	scopeSocket   = 0
	scopeExternal = 1
)

// frontendState is what the maps hold for one frontend.
type frontendState struct {
	id       uint32
	half     uint8
	flags    uint8
	affinity uint32
	backends []uint32  // the active list (indices of the writer's backs)
	used     [2]uint16 // the highest slot written in each half
	ranges   []netip.Prefix
}

// writer keeps the services and backends maps equal to the desired
// frontends, remembering what it wrote (or, after a restart, what it read
// back) so that a sync writes only what changed.
type writer struct {
	writerMaps
	fronts map[FrontendKey]*frontendState
	backendTable
	nextFront uint32
	orphans   []sockSvcKey // slots without a master entry, found by load
	// retired are backends (ids) marked BACKEND_GONE, to delete after a
	// grace period (grace.go), and rewritten the frontends whose inactive
	// half holds a list no reader will use once that period is over.
	retired   []uint32
	rewritten []FrontendKey
	// stale are the backends removed from UDP frontends of the socket
	// programs whose connected sockets are still to be terminated.
	stale []staleUDP
	// Stats of the last apply.
	Stats Stats
	// tally counts what the frontends keep in the maps (metrics).
	tally tally
	// needed: what the last apply needed in each map (capacity.go), and
	// lbMax the --bpf-lb-map-max the maps were sized from (0: unknown).
	needed map[string]int
	lbMax  int
}

// Stats count the map writes of one sync.
type Stats struct {
	Frontends        int // frontends written
	Removed          int // frontends deleted
	BackendsAdded    int
	BackendsRemoved  int
	SlotsWritten     int
	UnchangedSkipped int
	// UDPSocketsTerminated: connected UDP sockets of removed backends
	// destroyed after the sync.
	UDPSocketsTerminated int
}

// writerMaps are the maps a writer writes; members, ranges and maglev may
// be nil for a writer that only reads frontends back (Dump).
type writerMaps struct {
	services, backends *ebpf.Map
	members            *ebpf.Map // affinity members
	ranges             *ebpf.Map // source ranges of external frontends
	maglev             *ebpf.Map // Maglev tables of external frontends
}

func newWriter(m writerMaps) *writer {
	return &writer{writerMaps: m, fronts: map[FrontendKey]*frontendState{},
		backendTable: backendTable{backs: make([]backendState, 1), byAddr: map[backendKey]uint32{}}} // index 0: none
}

// load reads the maps back (after a restart).
func (w *writer) load() error {
	var k sockBackend
	var id uint32
	index := map[uint32]uint32{} // backend id -> index
	it := w.backends.Iterate()
	for it.Next(&id, &k) {
		w.nextBackend = max(w.nextBackend, id)
		if k.Flags&backendGone != 0 {
			w.retired = append(w.retired, id) // by a process that stopped before its grace period ended
			continue
		}
		i := w.index(backendKey{k.Addr, k.Port})
		w.backs[i].id, w.backs[i].remote = id, k.Flags&backendRemote != 0
		w.live++
		index[id] = i
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading the backends map: %w", err)
	}
	var sk sockSvcKey
	var sv sockSvcValue
	slots := map[FrontendKey]map[uint16]uint32{}
	it = w.services.Iterate()
	for it.Next(&sk, &sv) {
		fk := FrontendKey{Addr: fromWords(sk.Addr), Port: ntohs(sk.Port), Protocol: protocolOf(sk.Proto), External: sk.Scope == scopeExternal}
		if sk.Slot == 0 {
			w.fronts[fk] = &frontendState{id: sv.SvcId, half: sv.Half, flags: sv.Flags, affinity: sv.AffinityTimeout,
				backends: make([]uint32, sv.Count)}
			w.nextFront = max(w.nextFront, sv.SvcId)
			continue
		}
		if slots[fk] == nil {
			slots[fk] = map[uint16]uint32{}
		}
		slots[fk][sk.Slot] = sv.BackendId
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading the services map: %w", err)
	}
	for fk, f := range w.fronts {
		for slot, id := range slots[fk] {
			h := slot / slotHalf
			f.used[h] = max(f.used[h], slot%slotHalf)
			if i := int(slot%slotHalf) - 1; uint8(h) == f.half && i < len(f.backends) {
				x, ok := index[id]
				if !ok {
					// A slot naming no backend entry: an index of
					// its own, no address, retired once unused.
					x = w.index(backendKey{})
					delete(w.byAddr, backendKey{})
					w.backs[x].id = id
					w.live++
					index[id] = x
				}
				f.backends[i] = x
			}
		}
	}
	for _, f := range w.fronts {
		w.ref(nil, f.backends)
	}
	if err := w.loadRanges(); err != nil {
		return err
	}
	if err := w.dropOrphanTables(); err != nil {
		return err
	}
	for _, i := range index {
		if w.backs[i].refs == 0 {
			w.note(i)
		}
	}
	for fk, f := range w.fronts {
		w.tally.add(fk, f, 1)
		if f.used[1-f.half] > 0 {
			w.rewritten = append(w.rewritten, fk) // left by a process stopped before its grace period ended
		}
	}
	for fk, s := range slots {
		if w.fronts[fk] == nil {
			for slot := range s {
				w.orphans = append(w.orphans, svcKey(fk, slot))
			}
		}
	}
	return nil
}

// dropOrphans deletes the slots load found without a master entry (a
// removal interrupted between the master entry and its slots).
func (w *writer) dropOrphans() error {
	for _, k := range w.orphans {
		if err := w.services.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting an orphan slot: %w", err)
		}
	}
	w.orphans = nil
	return nil
}

// apply makes the maps hold want for the keys in dirty (want is complete;
// dirty names the frontends that may differ from what was written); with
// full it compares every frontend (after a restart, with what load read
// back) and rewrites those that differ. It first counts what that
// needs in each map and, if a map cannot hold it, writes nothing and
// returns the CapacityErrors (capacity.go). Removed frontends go first,
// with the backends they leave unused.
func (w *writer) apply(want map[FrontendKey]Frontend, dirty map[FrontendKey]bool, full bool) error {
	w.Stats = Stats{}
	var keys []FrontendKey
	if full {
		for k := range want {
			keys = append(keys, k)
		}
		for k := range w.fronts {
			if _, ok := want[k]; !ok {
				keys = append(keys, k)
			}
		}
	} else {
		for k := range dirty {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	p := w.plan(want, keys)
	w.needed = p.need
	if err := w.fits(p.need); err != nil {
		w.dropPending()
		return err
	}
	// Removals first, then the backends they leave unused: what they
	// free makes room for what the others add.
	var errs []error
	for _, k := range keys {
		if _, ok := want[k]; ok {
			continue
		}
		if cur := w.fronts[k]; cur != nil {
			if err := w.remove(k, cur); err != nil {
				errs = append(errs, fmt.Errorf("removing frontend %s: %w", k, err))
			}
		}
	}
	if err := w.collect(p.freed); err != nil {
		errs = append(errs, err)
	}
	w.addBackends()
	added := w.addFrontends(want, keys, p.lists)
	for _, k := range keys {
		if added[k] {
			continue
		}
		if f, ok := want[k]; ok {
			if err := w.write(k, f); err != nil {
				errs = append(errs, fmt.Errorf("service port %s, frontend %s: %w", f.Service, k, err))
			}
		}
	}
	if err := w.retire(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (k FrontendKey) String() string {
	s := fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Protocol)
	if k.External {
		s += " external"
	}
	return s
}

func compareKeys(a, b FrontendKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}

// write programs one frontend: new backends, then the inactive half of its
// slots, then its master entry. On error the master entry is unchanged, so
// readers keep the previous state.
func (w *writer) write(k FrontendKey, f Frontend) error {
	if len(f.Backends) >= slotHalf {
		return fmt.Errorf("%d backends, at most %d are supported", len(f.Backends), slotHalf-1)
	}
	ids := make([]uint32, len(f.Backends)) // indices
	for i, ap := range f.Backends {
		x, err := w.backend(ap)
		if err != nil {
			return err
		}
		if err := w.setRemote(x, f, i); err != nil {
			return err
		}
		ids[i] = x
	}
	flags := flagsOf(f)
	cur := w.fronts[k]
	if cur != nil && cur.flags == flags && cur.affinity == uint32(f.AffinitySeconds) && slices.Equal(cur.backends, ids) &&
		slices.Equal(cur.ranges, f.SourceRanges) {
		w.Stats.UnchangedSkipped++
		return nil
	}
	next := &frontendState{flags: flags, affinity: uint32(f.AffinitySeconds), backends: ids, ranges: f.SourceRanges}
	if cur != nil {
		next.id, next.half, next.used = cur.id, 1-cur.half, cur.used
	} else {
		w.nextFront++
		next.id = w.nextFront
	}
	base := uint16(next.half) * slotHalf
	if len(ids) > 0 {
		keys := make([]sockSvcKey, len(ids))
		vals := make([]sockSvcValue, len(ids))
		for i, x := range ids {
			keys[i], vals[i] = svcKey(k, base+uint16(i)+1), sockSvcValue{BackendId: w.backs[x].id}
		}
		if _, err := w.services.BatchUpdate(keys, vals, nil); err != nil {
			return fmt.Errorf("writing %d backend slots: %w", len(ids), err)
		}
		w.Stats.SlotsWritten += len(ids)
	}
	if err := w.deleteSlots(k, base, uint16(len(ids))+1, next.used[next.half]); err != nil {
		return err
	}
	next.used[next.half] = uint16(len(ids))
	if next.affinity > 0 {
		if err := w.setMembers(next.id, w.ids(ids)); err != nil {
			return err
		}
	}
	if err := w.setRanges(next.id, next.ranges); err != nil {
		return err
	}
	if k.External && len(ids) > 0 {
		if err := w.setMaglev(next.id, f.Backends, w.ids(ids)); err != nil {
			return err
		}
	}
	m := sockSvcValue{Count: uint16(len(ids)), Half: next.half, Flags: flags, SvcId: next.id, AffinityTimeout: next.affinity}
	if err := w.services.Update(svcKey(k, 0), m, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing the master entry: %w", err)
	}
	w.fronts[k] = next
	w.tally.add(k, cur, -1)
	w.tally.add(k, next, 1)
	if next.used[1-next.half] > 0 {
		w.rewritten = append(w.rewritten, k)
	}
	w.Stats.Frontends++
	var old []uint32
	if cur != nil {
		old = cur.backends
		w.noteStale(k, old, ids)
	}
	w.ref(old, ids)
	if cur != nil {
		if err := w.dropRanges(cur.id, cur.ranges, next.ranges); err != nil {
			return err
		}
		if k.External && len(ids) == 0 && len(cur.backends) > 0 {
			if err := w.dropMaglev(cur.id); err != nil {
				return err
			}
		}
	}
	if cur != nil && cur.affinity > 0 {
		keep := ids
		if next.affinity == 0 {
			keep = nil
		}
		return w.dropMembers(cur.id, cur.backends, keep)
	}
	return nil
}

// flagsOf are the master entry's flags of f.
func flagsOf(f Frontend) uint8 {
	flags := uint8(0)
	switch f.Verdict {
	case Reject:
		flags = flagReject
	case Drop:
		flags = flagDrop
	}
	if f.Masquerade {
		flags |= flagSNAT
	}
	if len(f.SourceRanges) > 0 {
		flags |= flagRanges
	}
	if f.DSR {
		flags |= flagDSR
	}
	return flags
}

// addFrontends writes the new plain frontends of keys (socket scope,
// without affinity: the ClusterIPs, nearly all of a first sync) a batch
// of entries per update, on every CPU: every slot, then every master
// entry. As with
// write, a reader finds a frontend by its master entry only, written after
// its slots. It returns the keys written; the others, and any a failed
// update left, go through write (one frontend at a time, an error naming
// it).
func (w *writer) addFrontends(want map[FrontendKey]Frontend, keys []FrontendKey, lists [][]uint32) map[FrontendKey]bool {
	type pending struct {
		k    FrontendKey
		next *frontendState
	}
	var todo []pending
	if len(w.fronts) == 0 {
		// A first fill: nearly every frontend goes here.
		todo = make([]pending, 0, len(keys))
		w.fronts = make(map[FrontendKey]*frontendState, len(keys))
	}
	nextFront := w.nextFront
	bounds, slots := []int{0}, 0 // batches of frontends, by their slots
	for x, k := range keys {
		f, ok := want[k]
		if !ok || k.External || f.AffinitySeconds > 0 || len(f.SourceRanges) > 0 || len(f.Backends) >= slotHalf || w.fronts[k] != nil {
			continue
		}
		ids := lists[x] // indices, from plan
		if slices.ContainsFunc(ids, func(i uint32) bool { return w.backs[i].id == 0 }) {
			continue // its backend failed to go in a batch: write tries it alone
		}
		nextFront++
		next := &frontendState{id: nextFront, flags: flagsOf(f), backends: ids}
		next.used[0] = uint16(len(ids))
		if slots += len(ids); slots > backendBatch && len(todo) > bounds[len(bounds)-1] {
			bounds, slots = append(bounds, len(todo)), len(ids)
		}
		todo = append(todo, pending{k, next})
	}
	if len(todo) == 0 {
		return nil
	}
	bounds = append(bounds, len(todo))
	for _, r := range writeBatches(bounds, func() func(from, to int) (int, error) {
		var keys []sockSvcKey
		var vals []sockSvcValue
		return func(from, to int) (int, error) {
			keys, vals = keys[:0], vals[:0]
			for _, p := range todo[from:to] {
				k := svcKey(p.k, 0)
				for i, x := range p.next.backends {
					k.Slot = uint16(i) + 1
					keys, vals = append(keys, k), append(vals, sockSvcValue{BackendId: w.backs[x].id})
				}
			}
			if len(keys) == 0 {
				return 0, nil
			}
			_, err := w.services.BatchUpdate(keys, vals, nil)
			return 0, err
		}
	}) {
		if r.err != nil {
			return nil // slots without a master entry are not read; write rewrites them
		}
	}
	w.nextFront = nextFront
	added := make(map[FrontendKey]bool, len(todo))
	for _, r := range writeBatches(evenBounds(len(todo)), func() func(from, to int) (int, error) {
		mk := make([]sockSvcKey, min(len(todo), backendBatch))
		mv := make([]sockSvcValue, len(mk))
		return func(from, to int) (int, error) {
			for i, p := range todo[from:to] {
				mk[i] = svcKey(p.k, 0)
				mv[i] = sockSvcValue{Count: p.next.used[0], Flags: p.next.flags, SvcId: p.next.id}
			}
			return w.services.BatchUpdate(mk[:to-from], mv[:to-from], nil)
		}
	}) {
		for _, p := range todo[r.from : r.from+r.done] {
			w.fronts[p.k] = p.next
			w.tally.add(p.k, p.next, 1)
			w.ref(nil, p.next.backends)
			w.Stats.Frontends++
			w.Stats.SlotsWritten += len(p.next.backends)
			added[p.k] = true
		}
	}
	return added
}

// setMembers records ids as the backends affinity may return to.
func (w *writer) setMembers(svc uint32, ids []uint32) error {
	if len(ids) == 0 {
		return nil
	}
	keys := make([]sockAffinityMember, len(ids))
	vals := make([]uint8, len(ids))
	for i, id := range ids {
		keys[i] = sockAffinityMember{SvcId: svc, BackendId: id}
	}
	if _, err := w.members.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("writing %d affinity members: %w", len(ids), err)
	}
	return nil
}

// dropMembers deletes the affinity members of old that keep lacks
// (indices of backends).
func (w *writer) dropMembers(svc uint32, old, keep []uint32) error {
	kept := map[uint32]bool{}
	for _, id := range keep {
		kept[id] = true
	}
	for _, id := range old {
		if kept[id] {
			continue
		}
		if err := w.members.Delete(sockAffinityMember{SvcId: svc, BackendId: w.backs[id].id}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting an affinity member: %w", err)
		}
	}
	return nil
}

// dropOldHalves deletes the inactive half of the frontends the last sync
// rewrote, once the grace period after it is over (grace.go): no reader
// is left on it, and a frontend holds 1+n entries until its next rewrite
// rather than 1+2n. A half whose slots cannot be deleted stays until that
// rewrite overwrites it.
func (w *writer) dropOldHalves() error {
	type half struct {
		k FrontendKey
		f *frontendState
	}
	var halves []half
	var keys []sockSvcKey
	var owner []int // keys[i] is a slot of halves[owner[i]]
	for _, k := range w.rewritten {
		f := w.fronts[k]
		if f == nil || f.used[1-f.half] == 0 {
			continue // removed since (both halves with it), or nothing there
		}
		h := 1 - f.half
		for s := uint16(1); s <= f.used[h]; s++ {
			keys = append(keys, svcKey(k, uint16(h)*slotHalf+s))
			owner = append(owner, len(halves))
		}
		halves = append(halves, half{k, f})
	}
	w.rewritten = nil
	failed := map[int]error{}
	for from := 0; from < len(keys); from += backendBatch {
		to := min(from+backendBatch, len(keys))
		done, err := w.services.BatchDelete(keys[from:to], nil)
		if err == nil {
			continue
		}
		for i := from + max(done, 0); i < to; i++ { // one by one what the batch left
			if err := w.services.Delete(keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				failed[owner[i]] = err
			}
		}
	}
	var errs []error
	for i, hf := range halves {
		if err := failed[i]; err != nil {
			// Left as it is: the next rewrite overwrites it.
			errs = append(errs, fmt.Errorf("deleting the inactive half of %s: %w", hf.k, err))
			continue
		}
		w.tally.add(hf.k, hf.f, -1)
		hf.f.used[1-hf.f.half] = 0
		w.tally.add(hf.k, hf.f, 1)
	}
	return errors.Join(errs...)
}

// deleteSlots deletes slots base+from .. base+to of a frontend.
func (w *writer) deleteSlots(k FrontendKey, base, from, to uint16) error {
	for s := from; s <= to && s > 0; s++ {
		if err := w.services.Delete(svcKey(k, base+s)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting slot %d: %w", base+s, err)
		}
	}
	return nil
}

// remove deletes a frontend: the master entry first (readers stop finding
// it), then its slots.
func (w *writer) remove(k FrontendKey, f *frontendState) error {
	if err := w.services.Delete(svcKey(k, 0)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	delete(w.fronts, k)
	w.tally.add(k, f, -1)
	w.noteStale(k, f.backends, nil)
	w.ref(f.backends, nil)
	w.Stats.Removed++
	for h := range uint16(2) {
		if err := w.deleteSlots(k, h*slotHalf, 1, f.used[h]); err != nil {
			return err
		}
	}
	if err := w.dropRanges(f.id, f.ranges, nil); err != nil {
		return err
	}
	if k.External {
		if err := w.dropMaglev(f.id); err != nil {
			return err
		}
	}
	if f.affinity > 0 {
		return w.dropMembers(f.id, f.backends, nil)
	}
	return nil
}

// noteStale records the backends of old that keep lacks as removed from
// frontend k, when k is a UDP frontend of the socket programs (whose
// connected sockets are connected to the backend itself).
func (w *writer) noteStale(k FrontendKey, old, keep []uint32) {
	if k.Protocol != model.UDP || k.External {
		return
	}
	for _, id := range old {
		if !slices.Contains(keep, id) {
			w.stale = append(w.stale, staleUDP{frontend: netip.AddrPortFrom(k.Addr, k.Port), backend: w.backs[id].key.addrPort()})
		}
	}
}
