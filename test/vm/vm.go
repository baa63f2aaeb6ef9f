// Package vm runs weft's kernel tests on another kernel than the host's: it
// fetches a pinned Debian kernel package through apt, builds an initramfs of
// busybox, the kernel modules the tests need, weft's static test binaries
// and the few userspace tools they call, boots it under qemu (software
// emulation: no KVM needed) and turns what the guest printed on its serial
// console into a result per test binary.
//
// The guest's tests know they run in the VM through the WEFT_VM environment
// variable (see GuestEnv); a test that needs a kernel feature only the VM
// has (IPVS) fails there when the feature is missing instead of skipping.
package vm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The kernel the VM boots: Debian 12's cloud kernel, pinned by package
// name and version. Debian keeps one ABI (the number in the name) per
// point release; moving on is a change of these two lines.
const (
	KernelPackage = "linux-image-6.1.0-56-cloud-amd64"
	KernelVersion = "6.1.192-2"
)

// GuestEnv is set (to "1") for every test binary run in the VM.
const GuestEnv = "WEFT_VM"

// KernelRelease is the kernel's uname -r.
func KernelRelease() string { return strings.TrimPrefix(KernelPackage, "linux-image-") }

// Kernel is an extracted kernel package: Root holds boot/ and lib/modules/.
type Kernel struct{ Root string }

// Image is the kernel image qemu boots.
func (k Kernel) Image() string { return filepath.Join(k.Root, "boot", "vmlinuz-"+KernelRelease()) }

func (k Kernel) modDir() string { return filepath.Join(k.Root, "lib", "modules", KernelRelease()) }

// FetchKernel returns the pinned kernel, extracted under cache (downloaded
// through apt and unpacked on first use, with its modules.dep made).
func FetchKernel(cache string) (Kernel, error) {
	dir := filepath.Join(cache, KernelPackage+"_"+KernelVersion)
	k := Kernel{Root: filepath.Join(dir, "root")}
	stamp := filepath.Join(dir, "ok")
	if _, err := os.Stat(stamp); err == nil {
		return k, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return k, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return k, err
	}
	download := func() ([]byte, error) {
		get := exec.Command("apt-get", "download", KernelPackage+"="+KernelVersion)
		get.Dir = dir
		return get.CombinedOutput()
	}
	if _, err := download(); err != nil {
		// A fresh machine has no package lists yet.
		if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
			return k, fmt.Errorf("apt-get update: %w: %s", err, out)
		}
		if out, err := download(); err != nil {
			return k, fmt.Errorf("downloading %s=%s: %w: %s", KernelPackage, KernelVersion, err, out)
		}
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	if len(debs) != 1 {
		return k, fmt.Errorf("apt-get download %s left %d packages in %s", KernelPackage, len(debs), dir)
	}
	for _, args := range [][]string{
		{"dpkg-deb", "-x", debs[0], k.Root},
		// The package has no modules.dep: modprobe needs it.
		{"depmod", "-b", k.Root, KernelRelease()},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			return k, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	if err := os.Remove(debs[0]); err != nil {
		return k, err
	}
	return k, os.WriteFile(stamp, nil, 0o644)
}

// Binary is a test binary (static: built with CGO_ENABLED=0) the guest runs
// with Args, under the name Name.
type Binary struct {
	Name, Path string
	Args       []string
}

// Guest is what the initramfs holds besides busybox.
type Guest struct {
	Binaries []Binary
	// Tools are host executables (or shared objects) copied with the
	// shared libraries they load, at the same path (e.g. /usr/sbin/ip).
	Tools []string
	// Files maps a guest path to a host file (copied as is).
	Files map[string]string
	// ModuleDirs are directories under the kernel's lib/modules/<release>/
	// whose modules the guest gets, with every module they depend on;
	// Load are the modules loaded at boot.
	ModuleDirs, Load []string
	Env              map[string]string
}

// Initramfs writes a gzip'd newc cpio archive of g for k to out.
func Initramfs(k Kernel, g Guest, out string) error {
	stage, err := os.MkdirTemp(filepath.Dir(out), "initramfs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	for _, d := range []string{"bin", "usr/sbin", "proc", "sys", "dev", "tmp", "run", "etc", "weft"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return err
		}
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("the guest's shell is busybox (Debian's busybox-static): %w", err)
	}
	if err := copyFile(busybox, filepath.Join(stage, "bin", "busybox")); err != nil {
		return err
	}
	for _, link := range [][2]string{{"bin/sh", "busybox"}, {"sbin", "bin"}} {
		if err := os.Symlink(link[1], filepath.Join(stage, link[0])); err != nil {
			return err
		}
	}
	if err := modules(k, g, stage); err != nil {
		return err
	}
	for _, tool := range g.Tools {
		if err := copyWithLibs(tool, stage); err != nil {
			return err
		}
	}
	for dst, src := range g.Files {
		if err := copyFile(src, filepath.Join(stage, dst)); err != nil {
			return err
		}
	}
	for _, b := range g.Binaries {
		if err := copyFile(b.Path, filepath.Join(stage, "weft", b.Name)); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(stage, "init"), []byte(initScript(g)), 0o755); err != nil {
		return err
	}
	pack := exec.Command("sh", "-c", `find . | cpio -o -H newc --quiet | gzip -1 > "$0"`, out)
	pack.Dir = stage
	if o, err := pack.CombinedOutput(); err != nil {
		return fmt.Errorf("packing the initramfs (needs cpio): %w: %s", err, o)
	}
	return nil
}

// modules copies the modules under g.ModuleDirs and their dependencies
// into stage and makes their modules.dep.
func modules(k Kernel, g Guest, stage string) error {
	dep, err := os.ReadFile(filepath.Join(k.modDir(), "modules.dep"))
	if err != nil {
		return fmt.Errorf("reading the kernel's modules.dep: %w", err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(string(dep), "\n") {
		mod, rest, ok := strings.Cut(line, ":")
		if ok {
			deps[mod] = strings.Fields(rest)
		}
	}
	want := map[string]bool{}
	var add func(string)
	add = func(m string) {
		if want[m] {
			return
		}
		want[m] = true
		for _, d := range deps[m] {
			add(d)
		}
	}
	for m := range deps {
		for _, d := range g.ModuleDirs {
			if d = strings.TrimSuffix(d, "/"); m == d || strings.HasPrefix(m, d+"/") {
				add(m)
			}
		}
	}
	dst := filepath.Join(stage, "lib", "modules", KernelRelease())
	for m := range want {
		if err := copyFile(filepath.Join(k.modDir(), m), filepath.Join(dst, m)); err != nil {
			return err
		}
	}
	for _, f := range []string{"modules.order", "modules.builtin", "modules.builtin.modinfo"} {
		if err := copyFile(filepath.Join(k.modDir(), f), filepath.Join(dst, f)); err != nil {
			return err
		}
	}
	if out, err := exec.Command("depmod", "-b", stage, KernelRelease()).CombinedOutput(); err != nil {
		return fmt.Errorf("depmod for the initramfs: %w: %s", err, out)
	}
	return nil
}

// copyWithLibs copies the executable at path, and every shared library
// ldd says it loads, to the same paths under stage.
func copyWithLibs(path, stage string) error {
	out, err := exec.Command("ldd", path).Output()
	if err != nil {
		// A static executable: ldd says so and fails.
		return copyFile(path, filepath.Join(stage, path))
	}
	files := []string{path}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				files = append(files, f)
			}
		}
	}
	for _, f := range files {
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			return err
		}
		if err := copyFile(real, filepath.Join(stage, f)); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// The markers the guest prints around each test binary's run.
const (
	runMarker  = "WEFT-VM-RUN"
	exitMarker = "WEFT-VM-EXIT"
	doneMarker = "WEFT-VM-DONE"
)

// initScript is the guest's /init: mount the pseudo filesystems, load the
// modules, run each binary, print its exit status, power off.
func initScript(g Guest) string {
	var b strings.Builder
	b.WriteString(`#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up
`)
	for _, m := range g.Load {
		fmt.Fprintf(&b, "modprobe %s || echo 'modprobe %s failed'\n", m, m)
	}
	b.WriteString("export PATH=/usr/sbin:/usr/bin:/bin HOME=/tmp " + GuestEnv + "=1\n")
	keys := make([]string, 0, len(g.Env))
	for k := range g.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(g.Env[k]))
	}
	b.WriteString("cd /tmp\n")
	for _, bin := range g.Binaries {
		args := []string{"/weft/" + bin.Name}
		for _, a := range bin.Args {
			args = append(args, shellQuote(a))
		}
		fmt.Fprintf(&b, "echo %s %s\n%s\necho %s %s $?\n", runMarker, bin.Name, strings.Join(args, " "), exitMarker, bin.Name)
	}
	fmt.Fprintf(&b, "echo %s\npoweroff -f\n", doneMarker)
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Result is one binary's run in the guest.
type Result struct {
	Name   string
	Code   int    // its exit status; -1 when it never finished
	Output string // what it printed
}

// Boot boots k with initrd under qemu, copies the serial console to
// console, and returns a result per binary of g. It kills qemu after
// timeout; an error says the guest did not get to the end (its console
// tail is in the error).
func Boot(ctx context.Context, k Kernel, initrd string, g Guest, timeout time.Duration, console io.Writer) ([]Result, error) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, fmt.Errorf("booting the test VM needs qemu-system-x86_64 (Debian's qemu-system-x86; make deps installs it): %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, "-m", "2048", "-smp", "1", "-nographic", "-no-reboot", "-nodefaults",
		"-serial", "stdio", "-device", "virtio-rng-pci",
		"-kernel", k.Image(), "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1 rdinit=/init")
	var tail tailBuffer
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting qemu: %w", err)
	}
	results := make(chan []Result, 1)
	go func() { results <- parse(io.TeeReader(r, io.MultiWriter(console, &tail)), g) }()
	werr := cmd.Wait()
	w.Close()
	res := <-results
	if ctx.Err() != nil {
		return res, fmt.Errorf("the VM did not finish within %s (qemu killed); console tail:\n%s", timeout, tail.String())
	}
	if werr != nil {
		return res, fmt.Errorf("qemu: %w; console tail:\n%s", werr, tail.String())
	}
	if !bytes.Contains(tail.b, []byte(doneMarker)) {
		return res, fmt.Errorf("the guest stopped before the end of its tests; console tail:\n%s", tail.String())
	}
	return res, nil
}

var runLine = regexp.MustCompile(runMarker + ` (\S+)$`)

var exitLine = regexp.MustCompile(exitMarker + ` (\S+) (\d+)\s*$`)

// parse splits the console into the binaries' outputs.
func parse(r io.Reader, g Guest) []Result {
	res := make([]Result, len(g.Binaries))
	idx := map[string]int{}
	for i, b := range g.Binaries {
		res[i] = Result{Name: b.Name, Code: -1}
		idx[b.Name] = i
	}
	cur := -1
	var out strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		// The console's escape sequences may precede a marker.
		if m := runLine.FindStringSubmatch(line); m != nil {
			if i, ok := idx[m[1]]; ok {
				cur = i
				out.Reset()
			}
			continue
		}
		if m := exitLine.FindStringSubmatch(line); m != nil && cur >= 0 {
			code, _ := strconv.Atoi(m[2])
			out.WriteString(strings.TrimSuffix(line, m[0]))
			res[cur].Code, res[cur].Output = code, out.String()
			cur = -1
			continue
		}
		if cur >= 0 {
			out.WriteString(line + "\n")
			res[cur].Output = out.String()
		}
	}
	_, _ = io.Copy(io.Discard, r)
	return res
}

// tailBuffer keeps the last 64 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if n := len(t.b) - 64<<10; n > 0 {
		t.b = t.b[n:]
	}
	return len(p), nil
}

// String is the last 8 KiB.
func (t *tailBuffer) String() string {
	return string(t.b[max(0, len(t.b)-8<<10):])
}
