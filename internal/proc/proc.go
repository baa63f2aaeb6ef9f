// Package proc holds what the lab and its mini-kubelet both need of
// processes they started: whether one still runs, and stopping a set of
// them with a grace period.
package proc

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// Running reports whether pid is a live process: it exists and is not a
// zombie waiting for its parent.
func Running(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// Stop sends SIGTERM to every pid, waits up to grace for them to exit,
// then SIGKILLs what is left.
func Stop(pids []int, grace time.Duration) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for _, pid := range pids {
		for Running(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
