package workload

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinary builds cmd/weft-workload and runs it as the lab does: wait for
// its ready file, talk to every listener, SIGTERM it, expect exit 0.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "weft-workload")
	build := exec.Command(goTool, "build", "-o", bin, "github.com/weftnet/weft/cmd/weft-workload")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	t.Run("serve", func(t *testing.T) {
		ready := filepath.Join(dir, "ready")
		// A stale file from an earlier run must not pass for readiness.
		os.WriteFile(ready, []byte("stale\n"), 0o644)
		cmd := exec.Command(bin,
			"--http", "127.0.0.1:0", "--http", "[::1]:0",
			"--tcp-echo", "127.0.0.1:0",
			"--udp-echo", "127.0.0.1:0,[::1]:0",
			"--ready-file", ready)
		// No --name: the name comes from $POD_NAME.
		cmd.Env = append(os.Environ(), "POD_NAME=from-env")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var exitErr error
		exited := make(chan struct{})
		go func() { exitErr = cmd.Wait(); close(exited) }()
		defer func() {
			select {
			case <-exited:
			default:
				cmd.Process.Kill()
				<-exited
			}
			if t.Failed() {
				t.Logf("workload stderr:\n%s", stderr.String())
			}
		}()

		addrs := waitReady(t, ready, exited)
		want := map[string]int{KindHTTP: 2, KindTCPEcho: 1, KindUDPEcho: 2}
		for k, n := range want {
			if len(addrs[k]) != n {
				t.Fatalf("ready file lists %v, want %v listeners per kind", addrs, want)
			}
		}

		for i, client := range []string{"127.0.0.1", "::1"} {
			r, err := HTTPGet(testCtx(t), "http://"+addrs[KindHTTP][i]+"/")
			if err != nil || r.Pod != "from-env" || r.Client != client {
				t.Errorf("HTTPGet %s = %+v, %v", addrs[KindHTTP][i], r, err)
			}
			wantUDP := "from-env saw " + client + ": ping"
			if got, err := UDPExchange(testCtx(t), addrs[KindUDPEcho][i], "ping"); err != nil || got != wantUDP {
				t.Errorf("UDPExchange %s = %q, %v; want %q", addrs[KindUDPEcho][i], got, err, wantUDP)
			}
		}
		if got, err := TCPExchange(testCtx(t), addrs[KindTCPEcho][0]); err != nil || got != "from-env saw 127.0.0.1" {
			t.Errorf("TCPExchange = %q, %v", got, err)
		}

		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
			if exitErr != nil {
				t.Errorf("after SIGTERM: %v, want exit 0", exitErr)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("still running 10s after SIGTERM")
		}
		if _, err := os.Stat(ready); !os.IsNotExist(err) {
			t.Errorf("ready file left behind after exit (stat: %v)", err)
		}
	})

	t.Run("bind-error", func(t *testing.T) {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		cmd := exec.Command(bin, "--name", "x", "--http", taken.Addr().String(), "--tcp-echo=", "--udp-echo=")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), taken.Addr().String()) {
			t.Errorf("with a taken port: %v, output:\n%s\nwant exit 1 naming %s", err, out, taken.Addr())
		}
	})
}

// waitReady waits for the ready file and parses its "<kind> <addr>" lines.
func waitReady(t *testing.T, path string, exited <-chan struct{}) map[string][]string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(path)
		if err == nil && !strings.HasPrefix(string(data), "stale") {
			addrs := map[string][]string{}
			for line := range strings.Lines(string(data)) {
				kind, addr, ok := strings.Cut(strings.TrimSpace(line), " ")
				if !ok {
					t.Fatalf("ready file line %q", line)
				}
				addrs[kind] = append(addrs[kind], addr)
			}
			return addrs
		}
		select {
		case <-exited:
			t.Fatal("workload exited before ready")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready file %s after 30s", path)
		}
	}
}
