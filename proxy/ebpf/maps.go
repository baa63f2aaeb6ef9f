package ebpf

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

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
	backends []uint32  // the active list
	used     [2]uint16 // the highest slot written in each half
	ranges   []netip.Prefix
}

// writer keeps the services and backends maps equal to the desired
// frontends, remembering what it wrote (or, after a restart, what it read
// back) so that a sync writes only what changed.
type writer struct {
	writerMaps
	fronts      map[FrontendKey]*frontendState
	backendID   map[netip.AddrPort]uint32
	backendAddr map[uint32]netip.AddrPort
	nextBackend uint32
	nextFront   uint32
	orphans     []sockSvcKey    // slots without a master entry, found by load
	refs        map[uint32]int  // active lists naming each backend
	unused      map[uint32]bool // backends whose count fell to 0 this sync
	// Stats of the last apply.
	Stats Stats
}

// Stats count the map writes of one sync.
type Stats struct {
	Frontends        int // frontends written
	Removed          int // frontends deleted
	BackendsAdded    int
	BackendsRemoved  int
	SlotsWritten     int
	UnchangedSkipped int
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
		backendID: map[netip.AddrPort]uint32{}, backendAddr: map[uint32]netip.AddrPort{},
		refs: map[uint32]int{}, unused: map[uint32]bool{}}
}

// load reads the maps back (after a restart).
func (w *writer) load() error {
	var k sockBackend
	var id uint32
	it := w.backends.Iterate()
	for it.Next(&id, &k) {
		ap := netip.AddrPortFrom(fromWords(k.Addr), ntohs(k.Port))
		w.backendID[ap], w.backendAddr[id] = id, ap
		w.nextBackend = max(w.nextBackend, id)
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
				f.backends[i] = id
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
	for id := range w.backendAddr {
		if w.refs[id] == 0 {
			w.unused[id] = true
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
// full it compares and rewrites every frontend.
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
	var errs []error
	for _, k := range keys {
		if f, ok := want[k]; ok {
			if err := w.write(k, f, full); err != nil {
				errs = append(errs, fmt.Errorf("service port %s, frontend %s: %w", f.Service, k, err))
			}
		} else if cur := w.fronts[k]; cur != nil {
			if err := w.remove(k, cur); err != nil {
				errs = append(errs, fmt.Errorf("removing frontend %s: %w", k, err))
			}
		}
	}
	if err := w.collect(); err != nil {
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
func (w *writer) write(k FrontendKey, f Frontend, full bool) error {
	if len(f.Backends) >= slotHalf {
		return fmt.Errorf("%d backends, at most %d are supported", len(f.Backends), slotHalf-1)
	}
	ids := make([]uint32, len(f.Backends))
	for i, ap := range f.Backends {
		id, err := w.backend(ap)
		if err != nil {
			return err
		}
		ids[i] = id
	}
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
	cur := w.fronts[k]
	if cur != nil && !full && cur.flags == flags && cur.affinity == uint32(f.AffinitySeconds) && equalIDs(cur.backends, ids) &&
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
		for i, id := range ids {
			keys[i], vals[i] = svcKey(k, base+uint16(i)+1), sockSvcValue{BackendId: id}
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
		if err := w.setMembers(next.id, ids); err != nil {
			return err
		}
	}
	if err := w.setRanges(next.id, next.ranges); err != nil {
		return err
	}
	if k.External && len(ids) > 0 {
		if err := w.setMaglev(next.id, f.Backends, ids); err != nil {
			return err
		}
	}
	m := sockSvcValue{Count: uint16(len(ids)), Half: next.half, Flags: flags, SvcId: next.id, AffinityTimeout: next.affinity}
	if err := w.services.Update(svcKey(k, 0), m, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("writing the master entry: %w", err)
	}
	w.fronts[k] = next
	w.Stats.Frontends++
	var old []uint32
	if cur != nil {
		old = cur.backends
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

// dropMembers deletes the affinity members of old that keep lacks.
func (w *writer) dropMembers(svc uint32, old, keep []uint32) error {
	kept := map[uint32]bool{}
	for _, id := range keep {
		kept[id] = true
	}
	for _, id := range old {
		if kept[id] {
			continue
		}
		if err := w.members.Delete(sockAffinityMember{SvcId: svc, BackendId: id}); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting an affinity member: %w", err)
		}
	}
	return nil
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

// backend returns the id of ap, writing a new backend entry if needed.
func (w *writer) backend(ap netip.AddrPort) (uint32, error) {
	if id, ok := w.backendID[ap]; ok {
		return id, nil
	}
	id := w.nextBackend + 1
	if err := w.backends.Update(id, sockBackend{Addr: toWords(ap.Addr()), Port: htons(ap.Port())}, ebpf.UpdateAny); err != nil {
		return 0, fmt.Errorf("writing backend %s: %w", ap, err)
	}
	w.nextBackend = id
	w.backendID[ap], w.backendAddr[id] = id, ap
	w.unused[id] = true // until a master entry names it
	w.Stats.BackendsAdded++
	return id, nil
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

// collect deletes the backends no active list uses any more.
func (w *writer) collect() error {
	var errs []error
	for id := range w.unused {
		if w.refs[id] > 0 {
			delete(w.unused, id)
			continue
		}
		ap := w.backendAddr[id]
		if err := w.backends.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting backend %s: %w", ap, err))
			continue
		}
		delete(w.unused, id)
		delete(w.backendAddr, id)
		delete(w.backendID, ap)
		w.Stats.BackendsRemoved++
	}
	return errors.Join(errs...)
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func svcKey(k FrontendKey, slot uint16) sockSvcKey {
	scope := uint8(scopeSocket)
	if k.External {
		scope = scopeExternal
	}
	return sockSvcKey{Addr: toWords(k.Addr), Port: htons(k.Port), Proto: protocolNumber(k.Protocol), Scope: scope, Slot: slot}
}

// rangeKey is the source-range trie's key of prefix p of frontend svc:
// the frontend id, then the address, IPv4 as ::ffff:a.b.c.d.
func rangeKey(svc uint32, p netip.Prefix) nodeportSrcRangeKey {
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return nodeportSrcRangeKey{Prefixlen: uint32(32 + bits), SvcId: htonl(svc), Addr: toWords(p.Addr())}
}

// setRanges writes the source ranges of frontend svc.
func (w *writer) setRanges(svc uint32, ranges []netip.Prefix) error {
	for _, p := range ranges {
		if err := w.ranges.Update(rangeKey(svc, p), uint8(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("writing source range %s: %w", p, err)
		}
	}
	return nil
}

// dropRanges deletes the source ranges of frontend svc in old that keep
// lacks.
func (w *writer) dropRanges(svc uint32, old, keep []netip.Prefix) error {
	for _, p := range old {
		if slices.Contains(keep, p) {
			continue
		}
		if err := w.ranges.Delete(rangeKey(svc, p)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting source range %s: %w", p, err)
		}
	}
	return nil
}

// loadRanges reads the source ranges back into the frontends they belong
// to; those of no frontend (a removal interrupted) are deleted.
func (w *writer) loadRanges() error {
	if w.ranges == nil {
		return nil
	}
	byID := map[uint32]*frontendState{}
	for _, f := range w.fronts {
		byID[f.id] = f
	}
	var k nodeportSrcRangeKey
	var v uint8
	var stale []nodeportSrcRangeKey
	it := w.ranges.Iterate()
	for it.Next(&k, &v) {
		f := byID[ntohl(k.SvcId)]
		if f == nil {
			stale = append(stale, k)
			continue
		}
		bits := int(k.Prefixlen) - 32
		a := fromWords(k.Addr)
		if a.Is4() {
			bits -= 96
		}
		f.ranges = append(f.ranges, netip.PrefixFrom(a, bits))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading the source ranges map: %w", err)
	}
	for _, k := range stale {
		if err := w.ranges.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting an orphan source range: %w", err)
		}
	}
	return nil
}

// toWords lays an address out as bpf/sock.c reads it: 16 bytes in network
// order, IPv4 as ::ffff:a.b.c.d.
func toWords(a netip.Addr) [4]uint32 {
	b := a.As16()
	var w [4]uint32
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

func fromWords(w [4]uint32) netip.Addr {
	var b [16]byte
	for i := range w {
		binary.NativeEndian.PutUint32(b[4*i:], w[i])
	}
	return netip.AddrFrom16(b).Unmap()
}

// htons gives the value whose bytes in memory are p in network order.
func htons(p uint16) uint16 { return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, p)) }

func ntohs(p uint16) uint16 { return binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, p)) }

// setMaglev writes a new Maglev table for frontend svc (ids are the ids
// of backends) and swaps it in whole: a reader sees the old table or the
// new one.
func (w *writer) setMaglev(svc uint32, backends []netip.AddrPort, ids []uint32) error {
	m := maglevSize(len(ids))
	table, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: m, Flags: unix.BPF_F_INNER_MAP})
	if err != nil {
		return fmt.Errorf("creating a Maglev table of %d entries: %w", m, err)
	}
	defer table.Close()
	keys, vals := make([]uint32, m), make([]uint32, m)
	for i, b := range maglevTable(backends, m) {
		keys[i], vals[i] = uint32(i), ids[b]
	}
	if _, err := table.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("filling the Maglev table: %w", err)
	}
	if err := w.maglev.Update(svc, table, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("swapping in the Maglev table: %w", err)
	}
	return nil
}

// dropMaglev deletes the Maglev table of frontend svc.
func (w *writer) dropMaglev(svc uint32) error {
	if err := w.maglev.Delete(svc); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting the Maglev table: %w", err)
	}
	return nil
}

// dropOrphanTables deletes the Maglev tables of no frontend (a removal
// interrupted).
func (w *writer) dropOrphanTables() error {
	if w.maglev == nil {
		return nil
	}
	ids := map[uint32]bool{}
	for _, f := range w.fronts {
		ids[f.id] = true
	}
	var id uint32
	var stale []uint32
	it := w.maglev.Iterate()
	var inner ebpf.MapID
	for it.Next(&id, &inner) {
		if !ids[id] {
			stale = append(stale, id)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading the Maglev tables: %w", err)
	}
	for _, id := range stale {
		if err := w.dropMaglev(id); err != nil {
			return err
		}
	}
	return nil
}

func htonl(v uint32) uint32 { return binary.NativeEndian.Uint32(binary.BigEndian.AppendUint32(nil, v)) }

func ntohl(v uint32) uint32 { return binary.BigEndian.Uint32(binary.NativeEndian.AppendUint32(nil, v)) }

func protocolNumber(p model.Protocol) uint8 {
	if p == model.UDP {
		return 17
	}
	return 6
}

func protocolOf(n uint8) model.Protocol {
	if n == 17 {
		return model.UDP
	}
	return model.TCP
}
