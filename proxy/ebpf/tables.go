package ebpf

// The writer's per-service tables for traffic from outside the node (the
// allowed source ranges and the Maglev lookup tables) and the encodings of
// keys and values as the programs read them (network byte order, address
// words, protocol numbers).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/proxy/model"
)

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
// (It allocates nothing: it runs for every backend of a first sync.)
func htons(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func ntohs(p uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], p)
	return binary.BigEndian.Uint16(b[:])
}

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
