package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Handing the node over to another proxy mode. A plain cleanup would cut
// the connections from outside that the per-packet programs translate:
// their next packet, no longer translated, would meet the other mode's
// rules as a new flow, balanced anew and masqueraded from another port.
// So the other mode retires this one instead: the socket programs go
// (the pods' new connections meet the other mode's rules; their open ones
// are connected to their backends and need nothing), the frontends go
// (new flows from outside pass the per-packet programs untouched), and
// the per-packet programs stay with the flows weft_ct holds until those
// are drained (a TCP connection's entries leave with it), or a grace
// period has passed; then the other mode cleans up the rest.

// retiredMarker is the map pinned in the pin directory (a bpffs holds
// no plain files) whose one entry is when another mode first retired this
// one, in Unix nanoseconds.
const retiredMarker = "weft_retired"

// Retire retires the eBPF mode whose state is pinned under the
// configured pin path (see above) and returns when it was first retired.
func (b *Backend) Retire() (time.Time, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	since, err := retiredSince(filepath.Join(b.cfg.PinPath, retiredMarker))
	if err != nil {
		return since, fmt.Errorf("marking the eBPF mode retired: %w", err)
	}
	errs := detachHookLinks(b.cfg.PinPath)
	if err := clearMap(filepath.Join(b.cfg.PinPath, "weft_services")); err != nil {
		errs = append(errs, err)
	}
	if err := removeMasq(b.ipt, b.cfg.Families); err != nil {
		errs = append(errs, err)
	}
	return since, errors.Join(errs...)
}

// retiredSince reads the time the marker map pinned at path holds, or
// pins one holding now.
func retiredSince(path string) (time.Time, error) {
	now := time.Now()
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err == nil {
		defer m.Close()
		var ns int64
		if err := m.Lookup(uint32(0), &ns); err != nil {
			return now, err
		}
		return time.Unix(0, ns), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return now, err
	}
	m, err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return now, err
	}
	defer m.Close()
	if err := m.Put(uint32(0), now.UnixNano()); err != nil {
		return now, err
	}
	return now, m.Pin(path)
}

// clearMap deletes every entry of the pinned map at path (none there:
// nothing to do).
func clearMap(path string) error {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("loading %s: %w", path, err)
	}
	defer m.Close()
	var keys [][]byte
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, append([]byte(nil), k...))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clearing %s: %w", path, err)
		}
	}
	return nil
}

// Drained reports whether the retired per-packet programs hold no open
// TCP connection of their own any more (UDP flows, balanced again by the
// other mode, keep going from the client's side; connections another
// mode translated were never theirs).
func (b *Backend) Drained() (bool, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(b.cfg.PinPath, "weft_ct"), nil)
	if errors.Is(err, os.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer m.Close()
	var (
		k nodeportTuple
		v nodeportCtValue
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Proto == unix.IPPROTO_TCP && v.Masq != ctKernel {
			return false, nil
		}
	}
	return true, it.Err()
}
