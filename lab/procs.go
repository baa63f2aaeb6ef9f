package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/proc"
)

// Proc is a lab daemon: a process started inside a member namespace,
// detached from weftctl, with its log and pid file in the lab dir.
type Proc struct {
	Name string   // unique in the lab: "etcd", "kube-apiserver", "node1-agent"
	NS   string   // namespace path; empty for the host's
	Args []string // argv, Args[0] the binary
	Env  []string // added to a minimal environment
	// Cgroup, when set, is the cgroup v2 directory the process starts in
	// (its children stay there too).
	Cgroup string `json:",omitempty"`
}

func logPath(dir, name string) string { return filepath.Join(dir, "logs", name+".log") }
func pidPath(dir, name string) string { return filepath.Join(dir, "pids", name+".pid") }

// start launches p in its own session so that it outlives weftctl.
func start(dir string, p Proc) (int, error) {
	for _, sub := range []string{"logs", "pids"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return 0, err
		}
	}
	logf, err := os.OpenFile(logPath(dir, p.Name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command(p.Args[0], p.Args[1:]...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}, p.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if p.Cgroup != "" {
		cg, err := os.Open(p.Cgroup)
		if err != nil {
			return 0, fmt.Errorf("starting %s: %w", p.Name, err)
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
	}
	run := cmd.Start
	if p.NS != "" {
		// The child inherits the namespace of the thread that forks it.
		run = func() error { return netnsutil.Do(p.NS, cmd.Start) }
	}
	if err := run(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", p.Name, err)
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	if err := os.WriteFile(pidPath(dir, p.Name), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return 0, err
	}
	return pid, nil
}

// alive reports whether the daemon of that name is running.
func alive(dir, name string) (int, bool) {
	b, err := os.ReadFile(pidPath(dir, name))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, proc.Running(pid)
}

// recordedPIDs reads every pid file of the lab.
func recordedPIDs(dir string) []int {
	entries, err := os.ReadDir(filepath.Join(dir, "pids"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		if pid, ok := alive(dir, strings.TrimSuffix(e.Name(), ".pid")); ok {
			pids = append(pids, pid)
		}
	}
	return pids
}

// pidsInNamespaces finds every process whose network namespace is one of
// the given namespace files, as `ip netns pids` does: this catches what a
// crashed lab left without pid files.
func pidsInNamespaces(paths []string) ([]int, error) {
	want := map[uint64]bool{}
	for _, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err == nil {
			want[st.Ino] = true
		}
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var pids []int
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
			continue
		}
		if want[st.Ino] {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// findProcess returns the first process whose /proc/PID/cgroup text match
// accepts.
func findProcess(match func(pid int, cgroup string) bool) (int, bool) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cgroup"); err == nil && match(pid, string(b)) {
			return pid, true
		}
	}
	return 0, false
}

// inNodeCgroup reports whether a /proc/PID/cgroup text places the process
// under a node's kubelet cgroup root (a container of the node's).
func inNodeCgroup(cgroup, node string) bool {
	return strings.Contains(cgroup, ":"+kubeletCgroupRoot(node)+"/")
}
