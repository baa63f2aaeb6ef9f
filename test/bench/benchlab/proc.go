package benchlab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

// Proc is a process a benchmark started in a network namespace, its
// output in a log file.
type Proc struct {
	Cmd     *exec.Cmd
	Log     string
	Started time.Time
	done    chan struct{}
	err     error
}

// Start runs args in the network namespace at ns with PATH, HOME and env,
// its output to logPath. The process dies with the benchmark: the forking
// thread is locked (netnsutil.Do) and lives on, and its death signal is
// SIGKILL.
func Start(ns, logPath string, args []string, env ...string) (*Proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &Proc{Cmd: cmd, Log: logPath, Started: time.Now(), done: make(chan struct{})}
	if err := netnsutil.Do(ns, cmd.Start); err != nil {
		f.Close()
		return nil, err
	}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited describes the exit, with the log's last lines, if the process
// has ended; else nil.
func (p *Proc) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%v); log %s:\n%s", filepath.Base(p.Cmd.Args[0]), p.err, p.Log, Tail(p.Log, 12))
	default:
		return nil
	}
}

// Stop ends the process (SIGTERM, SIGKILL after 5 s) and waits for it. A
// nil Proc is a no-op.
func (p *Proc) Stop() {
	if p == nil {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
}

// VmHWM is the process's peak resident set size in bytes.
func (p *Proc) VmHWM() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmHWM in /proc/PID/status")
}

// Tail is the last n lines of the file at path, indented.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// MountTemp mounts a file system of type fs on a new temporary directory
// (in the benchmark's private mount namespace).
func MountTemp(fs string) (string, error) {
	dir, err := os.MkdirTemp("", "bench-"+fs)
	if err != nil {
		return "", err
	}
	if err := unix.Mount(fs, dir, fs, 0, ""); err != nil {
		_ = os.Remove(dir)
		return "", fmt.Errorf("mounting %s on %s: %w", fs, dir, err)
	}
	return dir, nil
}

// BPFMounts are a bpffs and the cgroup v2 hierarchy mounted on temporary
// directories in the benchmark's private mount namespace (its own /sys
// hides the machine's), where weft-proxy --mode ebpf pins and attaches.
type BPFMounts struct{ BPFFS, Cgroup2 string }

// MountBPF mounts both.
func MountBPF() (*BPFMounts, error) {
	m := &BPFMounts{}
	var err error
	if m.BPFFS, err = MountTemp("bpf"); err != nil {
		return nil, err
	}
	if m.Cgroup2, err = MountTemp("cgroup2"); err != nil {
		m.Unmount()
		return nil, err
	}
	return m, nil
}

// Unmount unmounts both and removes their directories (what the bpffs
// pinned goes with it).
func (m *BPFMounts) Unmount() {
	for _, dir := range []string{m.Cgroup2, m.BPFFS} {
		if dir != "" {
			_ = unix.Unmount(dir, unix.MNT_DETACH)
			_ = os.Remove(dir)
		}
	}
}
