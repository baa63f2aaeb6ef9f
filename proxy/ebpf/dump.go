package ebpf

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/cilium/ebpf"
)

// Reader reads frontends from the maps pinned under a pin path, as the
// programs see them.
type Reader struct {
	services, backends *ebpf.Map
}

// OpenReader opens the pinned services and backends maps read-only.
func OpenReader(pinPath string) (*Reader, error) {
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("opening the pinned map %s: %w", name, err)
		}
		return m, nil
	}
	services, err := open("weft_services")
	if err != nil {
		return nil, err
	}
	backends, err := open("weft_backends")
	if err != nil {
		_ = services.Close()
		return nil, err
	}
	return &Reader{services: services, backends: backends}, nil
}

// Close closes the maps.
func (r *Reader) Close() error { return errors.Join(r.services.Close(), r.backends.Close()) }

// Backends returns the active backends of frontend k, as a program reads
// them: its master entry, then the slots of its active half (none: the
// frontend is not there).
func (r *Reader) Backends(k FrontendKey) ([]netip.AddrPort, error) {
	var m sockSvcValue
	if err := r.services.Lookup(svcKey(k, 0), &m); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, err
	}
	out := make([]netip.AddrPort, 0, m.Count)
	for i := range m.Count {
		var slot sockSvcValue
		if err := r.services.Lookup(svcKey(k, uint16(m.Half)*slotHalf+i+1), &slot); err != nil {
			return nil, fmt.Errorf("slot %d of %s: %w", i+1, k, err)
		}
		var be sockBackend
		if err := r.backends.Lookup(slot.BackendId, &be); err != nil {
			return nil, fmt.Errorf("backend %d of %s: %w", slot.BackendId, k, err)
		}
		out = append(out, netip.AddrPortFrom(fromWords(be.Addr), ntohs(be.Port)))
	}
	return out, nil
}

// Dump prints the frontends and backends pinned under pinPath as a table:
// what the socket programs translate right now.
func Dump(pinPath string, out io.Writer) error {
	r, err := OpenReader(pinPath)
	if err != nil {
		return err
	}
	defer r.Close()
	w := newWriter(writerMaps{services: r.services, backends: r.backends})
	if err := w.load(); err != nil {
		return err
	}
	keys := make([]FrontendKey, 0, len(w.fronts))
	for k := range w.fronts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "FRONTEND\tVERDICT\tAFFINITY\tBACKENDS")
	for _, k := range keys {
		f := w.fronts[k]
		verdict := "forward"
		switch {
		case f.flags&flagReject != 0:
			verdict = "reject"
		case f.flags&flagDrop != 0:
			verdict = "drop"
		case f.flags&flagSNAT != 0:
			verdict = "forward+snat"
		}
		if f.flags&flagDSR != 0 {
			verdict += "+dsr"
		}
		if f.flags&flagRanges != 0 {
			verdict += "+ranges"
		}
		affinity := "-"
		if f.affinity > 0 {
			affinity = fmt.Sprintf("%ds", f.affinity)
		}
		var bes []string
		for _, i := range f.backends {
			if b := w.backs[i]; b.key != (backendKey{}) {
				bes = append(bes, b.key.String())
			} else {
				bes = append(bes, fmt.Sprintf("#%d(missing)", b.id))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k, verdict, affinity, strings.Join(bes, " "))
	}
	return tw.Flush()
}
