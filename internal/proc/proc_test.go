package proc

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestRunningAndStop(t *testing.T) {
	// A shell that ignores SIGTERM: Stop must kill it after the grace.
	cmd := exec.Command("sh", "-c", "trap '' TERM; while :; do sleep 1; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !Running(pid) {
		t.Fatalf("pid %d just started: not running", pid)
	}
	done := make(chan struct{})
	go func() {
		Stop([]int{pid}, 200*time.Millisecond)
		close(done)
	}()
	<-done
	// Not reaped yet: a zombie is not running.
	deadline := time.Now().Add(5 * time.Second)
	for Running(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if Running(pid) {
		t.Fatalf("pid %d still running after Stop", pid)
	}
	_ = cmd.Wait()
	if Running(0) || Running(-1) {
		t.Error("pid 0 or -1 reported running")
	}
}

func TestCPU(t *testing.T) {
	pid := os.Getpid()
	before, err := CPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel has charged this process two more clock ticks
	// (the deadline only guards against a CPU that never moves).
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; ; n++ {
		if n%1_000_000 != 0 {
			continue
		}
		now, err := CPU(pid)
		if err != nil {
			t.Fatal(err)
		}
		if now < before {
			t.Fatalf("CPU went back from %s to %s", before, now)
		}
		if now >= before+20*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU stuck at %s after 30 s of spinning (from %s)", now, before)
		}
	}
	if _, err := CPU(0); err == nil {
		t.Fatal("CPU(0): no error")
	}
}
