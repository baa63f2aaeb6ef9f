// Package cniinstall copies CNI plugin binaries into a node's CNI bin
// directory, the job of the weft-agent DaemonSet's init container.
//
// Every file is written under a temporary name in the destination and
// renamed over the old one: a runtime executing the plugin at that moment
// runs either the old or the new binary, never a half-written one, and a
// running plugin (weft's veth reaper lives up to 30 s after a DEL) does
// not make the install fail with "text file busy".
package cniinstall

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/weftnet/weft/internal/fsutil"
)

// Install copies every regular file of from into to. A file named in
// replace is always installed; any other (e.g. the portmap plugin, which
// the node's own packages may provide) only when to lacks it. The files
// named in replace are installed last, in replace's order: weft's shim
// ("weft") executes the Go plugin next to it ("weft-plugin"), so the shim
// comes after what it runs. It returns the names it installed.
func Install(from, to string, replace []string) ([]string, error) {
	entries, err := os.ReadDir(from)
	if err != nil {
		return nil, fmt.Errorf("reading the plugins to install: %w", err)
	}
	// Stable: the others keep their order, before the replaced ones.
	slices.SortStableFunc(entries, func(a, b os.DirEntry) int {
		return slices.Index(replace, a.Name()) - slices.Index(replace, b.Name())
	})
	if err := os.MkdirAll(to, 0o755); err != nil {
		return nil, fmt.Errorf("CNI bin dir %s: %w", to, err)
	}
	var done []string
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		name := e.Name()
		if !slices.Contains(replace, name) {
			if _, err := os.Stat(filepath.Join(to, name)); err == nil {
				continue
			} else if !errors.Is(err, os.ErrNotExist) {
				return done, fmt.Errorf("CNI bin dir %s: %w", to, err)
			}
		}
		if err := copyFile(filepath.Join(from, name), to, name); err != nil {
			return done, fmt.Errorf("installing %s into CNI bin dir %s: %w", name, to, err)
		}
		done = append(done, name)
	}
	return done, nil
}

func copyFile(src, dir, name string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(dir, name), data, 0o755)
}

// Uninstall removes the named plugins from dir (what an uninstall takes
// back; plugins installed only where the node lacked them, such as
// portmap, may serve other networks and stay). A missing one is fine.
func Uninstall(dir string, names ...string) error {
	var errs []error
	for _, n := range names {
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
