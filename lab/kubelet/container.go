package kubelet

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A container of weft's image runs as a real runtime would run it: in a
// mount namespace of its own, chrooted into the image's root file system,
// with its volumes bound at their mount paths, a fresh /proc, a /sys of the
// network namespace it runs in, and its own /tmp and /run, confined as its
// securityContext says (security.go). The image's
// programs are the lab's binaries, bound over their paths in the image, so
// that a rebuilt binary needs no new image.
//
// Go cannot run code between fork and exec, so the kubelet starts a shim
// (ContainerShim, `weftctl lab container`) in a new mount namespace; the
// shim makes the mounts, enters the root, confines itself and executes the
// container's command, keeping its pid.

// ContainerSpec is what the shim needs to start one container.
type ContainerSpec struct {
	Root  string   `json:"root"`  // the image's unpacked root file system
	Binds []Bind   `json:"binds"` // mounted in order, after /proc, /sys, /dev, /tmp and /run
	Argv  []string `json:"argv"`
	Env   []string `json:"env"`
	Dir   string   `json:"dir,omitempty"`
	UID   *int64   `json:"uid,omitempty"`
	GID   *int64   `json:"gid,omitempty"`
	Security
}

// Bind mounts Source (a path in the node's mount namespace) at Target (a
// path inside the container).
type Bind struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// ContainerShim runs the container described by the spec file. It must be
// running in a mount namespace of its own (the kubelet starts it so) and
// only returns on error: on success the container's program replaces it.
func ContainerShim(specPath string) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var s ContainerSpec
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%s: %w", specPath, err)
	}
	if len(s.Argv) == 0 {
		return fmt.Errorf("%s: no command", specPath)
	}
	// Capabilities, the bounding set and no_new_privs are a thread's: the
	// thread confined is the one that executes the command.
	runtime.LockOSThread()
	// Sources are opened before the root changes: after it they are
	// reachable only through these descriptors.
	sources := make([]*os.File, len(s.Binds))
	for i, bd := range s.Binds {
		f, err := os.OpenFile(bd.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("volume source %s: %w", bd.Source, err)
		}
		sources[i] = f
	}
	dev, err := os.OpenFile("/dev", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	// The root is bound on itself so that it is a mount of this namespace
	// only; what is mounted below it stays here.
	if err := unix.Mount(s.Root, s.Root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding the root %s: %w", s.Root, err)
	}
	if err := unix.Chroot(s.Root); err != nil {
		return fmt.Errorf("entering the root %s: %w", s.Root, err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	// Only a privileged container may write /sys.
	sysFlags := uintptr(unix.MS_RDONLY)
	if s.Privileged {
		sysFlags = 0
	}
	for _, m := range []struct {
		fstype, target string
		flags          uintptr
	}{{"proc", "/proc", 0}, {"sysfs", "/sys", sysFlags}, {"tmpfs", "/tmp", 0}, {"tmpfs", "/run", 0}} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, m.target, m.fstype, unix.MS_NOSUID|unix.MS_NODEV|m.flags, ""); err != nil {
			return fmt.Errorf("mounting %s on %s: %w", m.fstype, m.target, err)
		}
	}
	if !s.Privileged {
		if err := confineMounts(); err != nil {
			return err
		}
	}
	if err := bindFD(dev, "/dev", false); err != nil {
		return err
	}
	for i, bd := range s.Binds {
		if err := bindFD(sources[i], bd.Target, bd.ReadOnly); err != nil {
			return err
		}
	}
	if s.Dir != "" {
		if err := os.Chdir(s.Dir); err != nil {
			return err
		}
	}
	if !s.Privileged {
		if err := limitBounding(s.Capabilities); err != nil {
			return err
		}
	}
	if s.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("setting no_new_privs: %w", err)
		}
	}
	if s.GID != nil {
		if err := syscall.Setgroups(nil); err != nil {
			return err
		}
		if err := syscall.Setgid(int(*s.GID)); err != nil {
			return err
		}
	}
	if s.UID != nil {
		if err := syscall.Setuid(int(*s.UID)); err != nil {
			return err
		}
	}
	if !s.Privileged {
		if err := limitCaps(s.Capabilities); err != nil {
			return err
		}
	}
	path, err := lookPath(s.Argv[0], s.Env)
	if err != nil {
		return err
	}
	return syscall.Exec(path, s.Argv, s.Env)
}

// bindFD mounts what src refers to at target (inside the root), making the
// target like the source: a directory or an empty file.
func bindFD(src *os.File, target string, readOnly bool) error {
	st, err := src.Stat()
	if err != nil {
		return err
	}
	if st.IsDir() {
		err = os.MkdirAll(target, 0o755)
	} else if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
			f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("mount point %s: %w", target, err)
	}
	fdPath := fmt.Sprintf("/proc/self/fd/%d", src.Fd())
	if err := unix.Mount(fdPath, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s on %s: %w", src.Name(), target, err)
	}
	if readOnly {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("making %s read-only: %w", target, err)
		}
	}
	return nil
}

// lookPath finds a command in the container's PATH (from its environment).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New(name + ": not found in the container's PATH")
}
