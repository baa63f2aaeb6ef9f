// Package proc holds what the lab and the benchmarks need of processes they started: whether one still runs, the CPU time it
// used, and stopping a set of them with a grace period.
package proc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Running reports whether pid is a live process: it exists and is not a
// zombie waiting for its parent.
func Running(pid int) bool {
	f, err := statFields(pid)
	return err == nil && syscall.Kill(pid, 0) == nil && len(f) > 0 && f[0] != "Z"
}

// CPU is the CPU time (user and system) pid has used, at the kernel's
// clock-tick resolution (10 ms).
func CPU(pid int) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var ticks int64
	for _, v := range f[11:13] { // utime, stime: fields 14 and 15
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// statFields are /proc/pid/stat's fields from the state on (field 3): the
// command before them may hold spaces and parentheses.
func statFields(pid int) ([]string, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("no process %d", pid)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	return strings.Fields(s[i+1:]), nil
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
