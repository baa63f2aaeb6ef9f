package ebpf

import (
	"net/netip"
	"testing"

	"github.com/weftnet/weft/proxy/model"
)

// TestBackendIndexReused: a backend the writer forgot gives its index to
// the next new one, which still gets a key (id) of its own in the
// backends map, since the conntrack entries of flows from outside name
// the old id and must not lead to the new backend. The old id stays
// marked gone (until the grace period, which this writer alone does not
// run), the frontend's slots name the new id, and the writer counts what
// it holds.
func TestBackendIndexReused(t *testing.T) {
	e := newTCEnv(t)
	pod := func(i byte) netip.AddrPort { return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, i}), 80) }
	front := FrontendKey{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: model.TCP}
	e.program(map[FrontendKey]Frontend{front: {Backends: backends(pod(1), pod(2))}})
	old, _ := e.w.backendID(pod(1))
	oldIndex := e.w.byAddr[keyOf(pod(1))]
	e.program(map[FrontendKey]Frontend{front: {Backends: backends(pod(2))}})
	e.program(map[FrontendKey]Frontend{front: {Backends: backends(pod(2), pod(3))}})
	if i, ok := e.w.byAddr[keyOf(pod(3))]; !ok || i != oldIndex {
		t.Fatalf("pod 3 has index %d (%v), want pod 1's %d, freed", i, ok, oldIndex)
	}
	id2, _ := e.w.backendID(pod(2))
	id3, _ := e.w.backendID(pod(3))
	if id3 == old || id3 == id2 {
		t.Fatalf("pod 3 got id %d, pod 1 had %d, pod 2 has %d", id3, old, id2)
	}
	entry := func(id uint32) (backendKey, uint16) {
		t.Helper()
		var v sockBackend
		if err := e.w.backends.Lookup(id, &v); err != nil {
			t.Fatalf("backend %d: %v", id, err)
		}
		return backendKey{v.Addr, v.Port}, v.Flags
	}
	if k, flags := entry(id3); k != keyOf(pod(3)) || flags != 0 {
		t.Errorf("backend %d holds %s flags %d, want pod 3, 0", id3, k, flags)
	}
	if k, flags := entry(old); k != keyOf(pod(1)) || flags&backendGone == 0 {
		t.Errorf("backend %d holds %s flags %d, want pod 1 marked gone", old, k, flags)
	}
	f := e.w.fronts[front]
	for i, want := range []uint32{id2, id3} {
		var v sockSvcValue
		if err := e.w.services.Lookup(svcKey(front, uint16(f.half)*slotHalf+uint16(i)+1), &v); err != nil || v.BackendId != want {
			t.Errorf("slot %d of the active half: %d %v, want %d", i+1, v.BackendId, err, want)
		}
	}
	if e.w.live != 2 || len(e.w.byAddr) != 2 {
		t.Errorf("the writer counts %d backends, %d addresses; want 2", e.w.live, len(e.w.byAddr))
	}
	e.program(map[FrontendKey]Frontend{})
	if e.w.live != 0 || len(e.w.byAddr) != 0 {
		t.Errorf("with no frontend the writer counts %d backends, %d addresses; want none", e.w.live, len(e.w.byAddr))
	}
}
