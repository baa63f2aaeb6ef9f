package proc

import (
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
