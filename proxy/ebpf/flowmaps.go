package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// The flow maps are the LRU maps the programs fill per flow besides the
// conntrack maps: weft_revnat (one entry per socket the socket programs
// translated: the Service a connected socket's replies come from, and
// how the drain-then-reset finds the socket), weft_affinity (a pod's
// ClientIP affinity) and weft_ext_affinity (a client from outside's). They
// take the conntrack maps' size, --bpf-ct-max (sizing.go), instead of a
// fixed 65,536 entries: a node with more sockets open through Services
// would lose the oldest's entries.
//
// Entries must outlive a change of that size (and the upgrade from the
// fixed one): a socket whose weft_revnat entry is lost would take its
// replies from the backend's address (a resolver drops them) and escape
// the reset of its backend. So a pinned flow map of another size is
// migrated rather than replaced: a new map of the new size is created
// unpinned and given what the pinned one holds, the new programs load with
// it, and once they are attached in place of the old ones and a grace
// period has let those return, what the old programs wrote in between is
// copied too, and the new map takes the pin (pinFlowMaps).

// flowMapNames are the flow maps.
var flowMapNames = []string{"weft_revnat", "weft_affinity", "weft_ext_affinity"}

// flowMigration is a pinned flow map being replaced by one of another
// size.
type flowMigration struct {
	name     string
	old, new *ebpf.Map
}

// sizeFlowMaps sets the size of the flow maps spec holds.
func sizeFlowMaps(spec *ebpf.CollectionSpec, n int) {
	for _, name := range flowMapNames {
		if ms := spec.Maps[name]; ms != nil {
			ms.MaxEntries = uint32(n)
		}
	}
}

// openFlowMaps starts the migration of each flow map pinned under pinPath
// whose spec (in specs) it does not match: a new map, unpinned, holding
// its entries. Maps pinned that match, and maps not pinned, need none.
func openFlowMaps(pinPath string, specs map[string]*ebpf.MapSpec) ([]flowMigration, error) {
	var out []flowMigration
	fail := func(err error) ([]flowMigration, error) {
		closeMigrations(out)
		return nil, err
	}
	for _, name := range flowMapNames {
		old, err := ebpf.LoadPinnedMap(filepath.Join(pinPath, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fail(fmt.Errorf("opening the pinned map %s: %w", name, err))
		}
		if specs[name].Compatible(old) == nil {
			_ = old.Close()
			continue
		}
		ms := specs[name].Copy()
		ms.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			_ = old.Close()
			return fail(fmt.Errorf("creating the map %s of %d entries (--bpf-ct-max): %w", name, ms.MaxEntries, err))
		}
		out = append(out, flowMigration{name: name, old: old, new: m})
		if err := copyEntries(old, m, ebpf.UpdateAny); err != nil {
			return fail(fmt.Errorf("copying %s to a map of %d entries: %w", name, ms.MaxEntries, err))
		}
	}
	return out, nil
}

// copyEntries writes what from holds into to with flag. A key and value
// layout both maps share is all it assumes.
func copyEntries(from, to *ebpf.Map, flag ebpf.MapUpdateFlags) error {
	var k, v []byte
	it := from.Iterate()
	for it.Next(&k, &v) {
		if err := to.Update(k, v, flag); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return err
		}
	}
	return it.Err()
}

// flowReplacements are the new maps of migrations that spec holds.
func flowReplacements(spec *ebpf.CollectionSpec, migrations []flowMigration) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	for _, f := range migrations {
		if spec.Maps[f.name] != nil {
			out[f.name] = f.new
		}
	}
	return out
}

func closeMigrations(migrations []flowMigration) {
	for _, f := range migrations {
		_ = f.old.Close()
		_ = f.new.Close()
	}
}

// pinFlowMaps ends the migrations, once the new programs are attached:
// after a grace period no old program writes the old maps any more; what
// they wrote since the first copy and the new map lacks is copied, and the
// new map takes the pin.
func (b *Backend) pinFlowMaps() error {
	if len(b.migrating) == 0 {
		return nil
	}
	if err := b.grace.wait(); err != nil {
		return err
	}
	for len(b.migrating) > 0 {
		f := b.migrating[0]
		if err := copyEntries(f.old, f.new, ebpf.UpdateNoExist); err != nil {
			return fmt.Errorf("copying %s to a map of %d entries: %w", f.name, f.new.MaxEntries(), err)
		}
		path := filepath.Join(b.cfg.PinPath, f.name)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpinning the earlier %s: %w", f.name, err)
		}
		if err := f.new.Pin(path); err != nil {
			return fmt.Errorf("pinning %s: %w", f.name, err)
		}
		closeMigrations(b.migrating[:1])
		b.migrating = b.migrating[1:]
	}
	return nil
}

// sharingRevnat are the options that load spec (an iterator's) with the
// socket programs' weft_revnat, revnat, of whatever size.
func sharingRevnat(spec *ebpf.CollectionSpec, revnat *ebpf.Map) *ebpf.CollectionOptions {
	spec.Maps["weft_revnat"].MaxEntries = revnat.MaxEntries()
	spec.Maps["weft_revnat"].Pinning = ebpf.PinNone
	return &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{"weft_revnat": revnat}}
}
