package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// The maps the writer fills (lbMapNames) are pinned, and a restarted
// proxy reuses them, as it does the other maps: its programs read what
// the previous proxy wrote until its first sync has written the cluster
// view again. But pinned maps of another capacity (--bpf-lb-map-max
// changed, or the node's memory, or an earlier version's fixed sizes) or
// layout cannot be reused. They are then replaced as a set (the entries
// of one map name the ids of another): the new maps are created unpinned,
// the first sync fills them while the programs of the earlier proxy go on
// serving from the old ones, then swaps the new programs into the pinned
// links and only then pins the new maps in place of the old (pinLB). No
// program ever reads the new maps empty. A state that does not fit the
// new maps leaves the earlier programs and maps in place, and the first
// sync fails with the CapacityError.

// sizeLB sets the capacity of the maps of lbMapNames that spec holds.
func sizeLB(spec *ebpf.CollectionSpec, caps map[string]int) {
	for _, name := range lbMapNames {
		if ms := spec.Maps[name]; ms != nil {
			ms.MaxEntries = uint32(caps[name])
		}
	}
}

// openLBMaps returns the maps of lbMapNames for specs: the pinned ones
// under pinPath when every one of them is pinned and compatible with its
// spec; otherwise (fresh) new ones, none pinned. The caller closes them.
func openLBMaps(pinPath string, specs map[string]*ebpf.MapSpec) (maps map[string]*ebpf.Map, fresh bool, err error) {
	maps = map[string]*ebpf.Map{}
	closeAll := func() {
		for _, m := range maps {
			_ = m.Close()
		}
		clear(maps)
	}
	for _, name := range lbMapNames {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			closeAll()
			return nil, false, fmt.Errorf("opening the pinned map %s: %w", name, err)
		}
		if specs[name].Compatible(m) != nil {
			_ = m.Close()
			break
		}
		maps[name] = m
	}
	if len(maps) == len(lbMapNames) {
		return maps, false, nil
	}
	closeAll()
	for _, name := range lbMapNames {
		ms := specs[name].Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			closeAll()
			return nil, false, fmt.Errorf("creating the map %s of %d entries (--bpf-lb-map-max): %w", name, ms.MaxEntries, err)
		}
		maps[name] = m
	}
	return maps, true, nil
}

// replacementsIn are the maps of lb that spec holds.
func replacementsIn(spec *ebpf.CollectionSpec, lb map[string]*ebpf.Map) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	for name, m := range lb {
		if spec.Maps[name] != nil {
			out[name] = m
		}
	}
	return out
}

// lbMaps are the backend's maps of lbMapNames.
func (b *Backend) lbMaps() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{"weft_services": b.objs.WeftServices, "weft_backends": b.objs.WeftBackends,
		"weft_affinity_members": b.objs.WeftAffinityMembers, "weft_src_ranges": b.np.WeftSrcRanges, "weft_maglev": b.np.WeftMaglev}
}

// pinLB pins the new maps the programs now read in place of those an
// earlier proxy pinned. The services map's pin goes first and comes back
// last: a restart that interrupts this finds no services map pinned and
// replaces the whole set again, never a mix of old and new.
func (b *Backend) pinLB() error {
	maps := b.lbMaps()
	path := func(name string) string { return filepath.Join(b.cfg.PinPath, name) }
	if err := os.Remove(path("weft_services")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpinning the earlier weft_services: %w", err)
	}
	for _, name := range lbMapNames {
		if maps[name].IsPinned() {
			continue // pinned by an attempt that failed further on
		}
		if err := os.Remove(path(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpinning the earlier %s: %w", name, err)
		}
		if err := maps[name].Pin(path(name)); err != nil {
			return fmt.Errorf("pinning %s: %w", name, err)
		}
	}
	b.fresh = false
	return nil
}
