// Package sysctl reads and sets the kernel's settings under /proc/sys by
// their dotted names (net.ipv4.ip_forward), as sysctl(8) does.
package sysctl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Path is the file of a setting: dots separate its path below /proc/sys
// unless the name holds a slash, then slashes do (for names with a dot in
// them, such as an interface's: net/ipv4/conf/eth0.10/rp_filter).
func Path(name string) string {
	if !strings.Contains(name, "/") {
		name = strings.ReplaceAll(name, ".", "/")
	}
	return filepath.Join("/proc/sys", name)
}

// Ensure sets the setting name to value unless it has that value already,
// so that a setting made beforehand (on the node, or by a privileged init
// container) needs no write. Errors name the setting, and say so when this
// kernel lacks it (a module not loaded) or it differs and /proc/sys is
// read-only (a container that is not privileged).
func Ensure(name, value string) error {
	p := Path(name)
	cur, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sysctl %s: not in this kernel: %w", name, err)
	}
	if err != nil {
		return fmt.Errorf("sysctl %s: %w", name, err)
	}
	have := strings.TrimSpace(string(cur))
	if have == value {
		return nil
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		hint := ""
		if errors.Is(err, syscall.EROFS) {
			hint = " (/proc/sys is read-only here: set it on the node or from a privileged container)"
		}
		return fmt.Errorf("sysctl %s is %s and cannot be set to %s%s: %w", name, have, value, hint, err)
	}
	return nil
}
