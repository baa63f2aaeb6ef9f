package ipam_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/ipam"
)

// Environment of a helper process (the test binary re-executed).
const (
	envMode  = "WEFT_IPAM_TEST_HELPER" // "alloc" or "hold"
	envDir   = "WEFT_IPAM_TEST_DIR"
	envID    = "WEFT_IPAM_TEST_ID"
	envReady = "WEFT_IPAM_TEST_READY"
)

// TestHelperProcess is not a test: the multi-process tests run the test
// binary again with envMode set, and this is its main.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(envMode)
	if mode == "" {
		t.Skip("helper for the multi-process tests")
	}
	dir, id := os.Getenv(envDir), os.Getenv(envID)
	var err error
	switch mode {
	case "alloc":
		err = allocateOnDisk(dir, id, nil)
	case "hold":
		err = holdLock(dir, id, os.Getenv(envReady))
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// holdLock allocates id inside Update, signals readiness by creating
// ready, then waits to be killed while holding the lock. If nobody kills
// it, it gives up without saving.
func holdLock(dir, id, ready string) error {
	return allocateOnDisk(dir, id, func() error {
		if err := os.WriteFile(ready, nil, 0o600); err != nil {
			return err
		}
		time.Sleep(time.Minute)
		return errors.New("was not killed")
	})
}

func helperCmd(mode, dir, id string, extraEnv ...string) (*exec.Cmd, *bytes.Buffer) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envMode+"="+mode, envDir+"="+dir, envID+"="+id)
	cmd.Env = append(cmd.Env, extraEnv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	return cmd, &out
}

func TestMultiProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "weft")
	type proc struct {
		cmd *exec.Cmd
		out *bytes.Buffer
	}
	var procs []proc
	var ids []string
	for i := range 20 {
		id := fmt.Sprint("process-", i)
		cmd, out := helperCmd("alloc", dir, id)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, proc{cmd, out})
		ids = append(ids, id)
	}
	for i, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("helper %d: %v\n%s", i, err, p.out)
		}
	}
	checkDistinct(t, dir, ids)
	if m := tempFiles(t, dir); len(m) != 0 {
		t.Errorf("temporary files left behind: %v", m)
	}
}

// TestKilledWhileLocked kills a process inside Update, while it holds the
// lock and has modified (but not saved) the state. The kernel must drop
// the flock, and the previous state must be intact.
func TestKilledWhileLocked(t *testing.T) {
	dir := t.TempDir()
	for _, id := range []string{"before-1", "before-2"} {
		if err := allocateOnDisk(dir, id, nil); err != nil {
			t.Fatal(err)
		}
	}
	s := openDisk(t, dir)
	prior, err := os.ReadFile(s.StatePath())
	if err != nil {
		t.Fatal(err)
	}

	ready := filepath.Join(t.TempDir(), "ready")
	cmd, out := helperCmd("hold", dir, "doomed", envReady+"="+ready)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill() }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("helper exited before taking the lock: %v\n%s", err, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("helper never signalled readiness")
		}
	}

	// The helper holds the lock: a non-blocking attempt fails, and an
	// Update blocks.
	if err := tryLock(filepath.Join(dir, "lock")); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("flock while the helper holds it: %v, want EWOULDBLOCK", err)
	}
	p, err := dualPool()
	if err != nil {
		t.Fatal(err)
	}
	var seen []ipam.Key
	var onDisk []byte
	updated := make(chan error, 1)
	go func() {
		updated <- s.Update(func(st *ipam.State) error {
			seen = st.Keys()
			onDisk, _ = os.ReadFile(s.StatePath())
			_, err := p.Allocate(st, key("after"))
			return err
		})
	}()
	select {
	case err := <-updated:
		t.Fatalf("Update finished while another process held the lock: %v", err)
	case <-time.After(200 * time.Millisecond):
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = <-exited
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("helper ended with %v, want killed by SIGKILL\n%s", err, out)
	}

	select {
	case err := <-updated:
		if err != nil {
			t.Fatalf("Update after the holder died: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lock not released after the holder was killed")
	}
	if want := []ipam.Key{key("before-1"), key("before-2")}; !slices.Equal(seen, want) {
		t.Errorf("state seen after the crash has keys %v, want %v", seen, want)
	}

	if !bytes.Equal(onDisk, prior) || !json.Valid(onDisk) {
		t.Errorf("state.json after the crash:\n%s\nwant the prior state\n%s", onDisk, prior)
	}
	checkDistinct(t, dir, []string{"before-1", "before-2", "after"})
}

func tryLock(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
}
