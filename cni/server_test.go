package cni_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/ipam"
)

// The node's resident plugin server (cni/server.go) behind the shim the
// runtime executes (cmd/weft-cni/shim). Each test works on a bin dir of
// its own holding copies of the shim and the Go plugin, so that it knows
// which file a server runs. The server belongs to the network namespace:
// these tests share the package's, one at a time.

const serverName = cnitest.ServerSocket

// serverEnv is a test's world with its own copies of weft and weft-plugin.
type serverEnv struct {
	*env
	log *bytes.Buffer // the plugins' stderr, for their traces
	mu  *sync.Mutex
}

func newServerEnv(t *testing.T) *serverEnv {
	t.Helper()
	e := newEnv(t)
	bin := t.TempDir()
	for _, n := range []string{"weft", "weft-plugin"} {
		copyExe(t, filepath.Join(e.rt.BinDir, n), filepath.Join(bin, n))
	}
	var mu sync.Mutex
	var log bytes.Buffer
	e.rt = cnitest.NewRuntimeStderr(bin, e.rt.CacheDir, lockedWriter{&mu, &log})
	t.Setenv(cni.TraceEnv, "1")
	stopServer(t)
	t.Cleanup(func() { stopServer(t) })
	return &serverEnv{env: e, log: &log, mu: &mu}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// copyExe installs a copy of src at dst by rename, as make build does: a
// new inode.
func copyExe(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst+".tmp", b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dst+".tmp", dst); err != nil {
		t.Fatal(err)
	}
}

// tracePIDs returns, per command, the pids that served the traced commands
// logged since the last call.
func (s *serverEnv) tracePIDs() map[string][]int {
	s.mu.Lock()
	text := s.log.String()
	s.log.Reset()
	s.mu.Unlock()
	out := map[string][]int{}
	for line := range strings.SplitSeq(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != cni.TracePrefix {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimPrefix(f[len(f)-1], "pid=")); err == nil {
			out[f[1]] = append(out[f[1]], pid)
		}
	}
	return out
}

// serverPID returns the pid of the process listening on the server's
// socket in this network namespace, 0 if none.
func serverPID(t *testing.T) int {
	t.Helper()
	pid, err := cnitest.ServerPID()
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitServer waits for a server to listen and returns its pid.
func waitServer(t *testing.T) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if pid := serverPID(t); pid != 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatal("no plugin server listens 10 s after a command through the shim")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stopServer kills the node's server, if one runs, and waits until it is
// gone.
func stopServer(t *testing.T) {
	t.Helper()
	for range 100 {
		pid := serverPID(t)
		if pid == 0 {
			return
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		waitGone(t, pid)
	}
	t.Fatal("the plugin server keeps coming back")
}

// waitGone waits for process pid to exit (a zombie counts as gone).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if _, rest, ok := strings.Cut(string(b), ") "); ok && strings.HasPrefix(rest, "Z") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs 10 s later", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// outcome is what a runtime gets from one command, with what varies from
// pod to pod (MACs, addresses) left out.
type outcome struct {
	Err        string
	Interfaces []string
	IPs        int
	Gateways   []string
	Routes     []string
}

// lifecycle runs ADD, CHECK, a failing CHECK, STATUS, GC and DEL of one
// pod through libcni, and returns what each gave.
func (s *serverEnv) lifecycle(t *testing.T, list *libcni.NetworkConfigList) []outcome {
	t.Helper()
	ctx := context.Background()
	a := s.pod()
	var out []outcome
	res, err := s.rt.Add(ctx, list, a)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	o := outcome{IPs: len(res.IPs)}
	for _, i := range res.Interfaces {
		sb := ""
		if i.Sandbox != "" {
			sb = "@pod"
		}
		name := i.Name
		if name == cni.HostVethName(a.ContainerID, a.IfName) {
			name = "the host veth"
		}
		o.Interfaces = append(o.Interfaces, name+sb)
	}
	for _, ip := range res.IPs {
		o.Gateways = append(o.Gateways, ip.Gateway.String())
	}
	for _, r := range res.Routes {
		o.Routes = append(o.Routes, r.Dst.String())
	}
	out = append(out, o)
	errOutcome := func(err error) outcome {
		if err != nil {
			r := strings.NewReplacer(cni.HostVethName(a.ContainerID, a.IfName), "<veth>", a.ContainerID, "<id>", a.NetNS, "<netns>")
			return outcome{Err: r.Replace(err.Error())}
		}
		return outcome{}
	}
	out = append(out, errOutcome(s.rt.Check(ctx, list, a)))
	breakDefaultRoute(t, a.NetNS)
	out = append(out, errOutcome(s.rt.Check(ctx, list, a)))
	if list.CNIVersion == "1.1.0" {
		out = append(out, errOutcome(s.rt.Status(ctx, list)))
		out = append(out, errOutcome(s.rt.GC(ctx, list, []cnitest.Attachment{a})))
	}
	out = append(out, errOutcome(s.rt.Del(ctx, list, a)))
	out = append(out, errOutcome(s.rt.Del(ctx, list, a)))
	if k := s.allocations(list.Name); len(k) != 0 {
		t.Fatalf("allocations left after DEL: %v", k)
	}
	return out
}

// shim runs the shim once with that environment and stdin, as a runtime
// does, and returns its stdout, stderr and exit status.
func (s *serverEnv) shim(t *testing.T, env []string, stdin string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.rt.BinDir, "weft"))
	cmd.Env = env
	if v, ok := os.LookupEnv("WEFT_CNI_DIRECT"); ok {
		cmd.Env = append(slices.Clone(env), "WEFT_CNI_DIRECT="+v)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	status := 0
	if ee, ok := err.(*exec.ExitError); ok {
		status = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), status
}

// badInputs are commands with bad environments or configurations.
func (s *serverEnv) badInputs(t *testing.T, version string) []string {
	t.Helper()
	good := string(pluginConf(t, version, "bad", s.weft(subnet(podCIDR))))
	base := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_NETNS=/proc/1/ns/net", "CNI_IFNAME=eth0", "CNI_PATH=" + s.rt.BinDir}
	var got []string
	for _, c := range []struct {
		env   []string
		stdin string
	}{
		{base, `{"cniVersion":`},                   // malformed JSON
		{base, `{"cniVersion":"` + version + `"}`}, // no name
		{base, strings.Replace(good, version, "0.3.1", 1)},
		// The first definition of a name counts, for getenv as for the server.
		{append([]string{"CNI_CONTAINERID=-bad/"}, base...), good},
		{append([]string{"CNI_IFNAME=a/b"}, base...), good},
		{append([]string{"CNI_COMMAND=FOO"}, base...), good},
		{[]string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_IFNAME=eth0", "CNI_PATH=/x"}, good}, // no CNI_NETNS
		{[]string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_NETNS=/nonexistent", "CNI_IFNAME=eth0", "CNI_PATH=/x"}, good},
		{[]string{"CNI_COMMAND=DEL", "CNI_CONTAINERID=c1", "CNI_IFNAME=eth0", "CNI_PATH=/x"}, `{"name":"x","cniVersion":"` + version + `","ipam":{}}`},
	} {
		stdout, stderr, status := s.shim(t, c.env, c.stdin)
		got = append(got, fmt.Sprintf("%d %q %q", status, stdout, stderr))
	}
	return got
}

// TestServerMatchesExec: every command gives the runtime the same answer
// through the resident server as through the Go plugin executed by the
// shim, for each spec version; with no server running, the first command
// is executed and starts one, which serves the next.
func TestServerMatchesExec(t *testing.T) {
	for _, version := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(version, func(t *testing.T) {
			s := newServerEnv(t)
			list := s.list(version, "same", s.weft(subnet(podCIDR)))

			t.Setenv("WEFT_CNI_DIRECT", "1")
			direct := s.lifecycle(t, list)
			directBad := s.badInputs(t, version)
			if pids := s.tracePIDs(); len(pids["ADD"]) != 1 || len(pids["DEL"]) != 2 {
				t.Fatalf("traced commands %v, want one ADD and two DELs", pids)
			}
			if pid := serverPID(t); pid != 0 {
				t.Fatalf("a server (pid %d) runs after commands with WEFT_CNI_DIRECT", pid)
			}

			os.Unsetenv("WEFT_CNI_DIRECT")
			first := s.lifecycle(t, list) // its ADD starts the server
			server := waitServer(t)
			resident := s.lifecycle(t, list)
			residentBad := s.badInputs(t, version)
			pids := s.tracePIDs()
			if len(pids["ADD"]) != 2 || pids["ADD"][0] == server || pids["ADD"][1] != server {
				t.Fatalf("ADDs served by %v, want a process of their own then the server %d", pids["ADD"], server)
			}
			for _, pid := range pids["DEL"][2:] {
				if pid != server {
					t.Fatalf("DELs served by %v, want the server %d for the last two", pids["DEL"], server)
				}
			}
			for i, want := range direct {
				for name, got := range map[string][]outcome{"first": first, "resident": resident} {
					if fmt.Sprint(got[i]) != fmt.Sprint(want) {
						t.Errorf("%s step %d: %+v, executed plugin gave %+v", name, i, got[i], want)
					}
				}
			}
			if direct[2].Err == "" {
				t.Error("CHECK passed without the pod's default route")
			}
			for i := range directBad {
				if residentBad[i] != directBad[i] {
					t.Errorf("bad input %d: resident answered %s, executed plugin %s", i, residentBad[i], directBad[i])
				}
			}
		})
	}
}

// TestServerStale: once weft-plugin is replaced, the server that runs the
// old one serves no more commands and exits; the command runs in the new
// binary, which starts a new server.
func TestServerStale(t *testing.T) {
	s := newServerEnv(t)
	list := s.list("1.1.0", "stale", s.weft(subnet(podCIDR)))
	a, b := s.pod(), s.pod()
	s.add(list, a)
	old := waitServer(t)
	s.del(list, a)
	if pids := s.tracePIDs(); pids["DEL"][0] != old {
		t.Fatalf("DEL served by %v, want the server %d", pids["DEL"], old)
	}

	copyExe(t, filepath.Join(s.rt.BinDir, "weft-plugin"), filepath.Join(s.rt.BinDir, "weft-plugin"))
	s.add(list, b)
	waitGone(t, old)
	pids := s.tracePIDs()
	if pids["ADD"][0] == old {
		t.Fatalf("the stale server %d served ADD", old)
	}
	now := waitServer(t)
	if now == old {
		t.Fatal("the stale server still listens")
	}
	s.del(list, b)
	if pids := s.tracePIDs(); pids["DEL"][0] != now {
		t.Fatalf("DEL served by %v, want the new server %d", pids["DEL"], now)
	}
}

// TestServerKilledMidCommand: a server that dies after it accepted a
// command gives the runtime a CNI error, and the command is not run again
// by the shim.
func TestServerKilledMidCommand(t *testing.T) {
	s := newServerEnv(t)
	list := s.list("1.1.0", "killed", s.weft(subnet(podCIDR)))
	s.add(list, s.pod()) // the bridge, and a server
	server := waitServer(t)
	before := s.allocations("killed")
	// Hold the network's IPAM lock, so that the next ADD waits in the
	// server.
	dir, err := ipam.NetworkDir(s.dataDir, "killed")
	if err != nil {
		t.Fatal(err)
	}
	store, err := ipam.NewDiskStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	locked, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = store.Update(func(*ipam.State) error {
			close(locked)
			<-release
			return nil
		})
	}()
	<-locked

	a := s.pod()
	conf := pluginConf(t, "1.1.0", "killed", s.weft(subnet(podCIDR)))
	cmd, out := runPlugin(t, s.env, "ADD", a, conf)
	// The server has accepted the ADD once it waits for the lock.
	deadline := time.Now().Add(10 * time.Second)
	for !waitsForLock(t, server) {
		if time.Now().After(deadline) {
			t.Fatal("the ADD did not reach the server's IPAM lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = syscall.Kill(server, syscall.SIGKILL)
	err = cmd.Wait()
	close(release)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("the shim exited with %v, want status 1", err)
	}
	var cniErr struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if err := json.Unmarshal(out.Bytes(), &cniErr); err != nil || cniErr.Code == 0 || !strings.Contains(cniErr.Msg, "server") {
		t.Fatalf("the shim printed %q, want a CNI error about the server", out)
	}
	waitGone(t, server)
	if now := s.allocations("killed"); len(now) != len(before) {
		t.Fatalf("allocations %v after the killed ADD, before it %v: the ADD ran again", now, before)
	}
}

// waitsForLock reports whether process pid waits for a file lock.
func waitsForLock(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		// "1: -> FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"
		if f := strings.Fields(line); len(f) > 5 && f[1] == "->" && f[5] == strconv.Itoa(pid) {
			return true
		}
	}
	return false
}

// request encodes a command for the server as the shim does.
func request(t *testing.T, plugin string, env []string, stdin string) []byte {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(plugin, &st); err != nil {
		t.Fatal(err)
	}
	envBytes := []byte(strings.Join(env, "\x00") + "\x00")
	b := []byte("WFT1")
	for _, v := range []uint64{st.Dev, st.Ino, uint64(st.Mtim.Sec), uint64(st.Mtim.Nsec)} {
		b = binary.NativeEndian.AppendUint64(b, v)
	}
	b = binary.NativeEndian.AppendUint32(b, uint32(len(envBytes)))
	b = binary.NativeEndian.AppendUint32(b, uint32(len(stdin)))
	return append(append(b, envBytes...), stdin...)
}

// asUID runs fn on a thread whose effective uid is uid, then restores
// root. Only that thread changes: the raw system call, not the runtime's
// wrapper that changes every thread's.
func asUID(uid int, fn func() error) error {
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			err = e
			runtime.UnlockOSThread()
			return
		}
		err = fn()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e == 0 {
			runtime.UnlockOSThread()
		} // else the thread dies with this goroutine
	}()
	<-done
	return err
}

// exchangeAs sends req to the server from a socket connected with that
// effective uid, and returns the answer.
func exchangeAs(t *testing.T, uid int, req []byte) []byte {
	t.Helper()
	var conn net.Conn
	if err := asUID(uid, func() (err error) {
		conn, err = net.Dial("unix", serverName)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	// A server refusing the peer answers and closes without reading the
	// request: the write may then fail, the answer is still there to read.
	if _, err := conn.Write(req); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	ans, _ := io.ReadAll(conn)
	return ans
}

// TestServerRootOnly: the server answers root peers only; anyone else is
// sent to the plugin binary, which runs with their privileges.
func TestServerRootOnly(t *testing.T) {
	s := newServerEnv(t)
	list := s.list("1.1.0", "root", s.weft(subnet(podCIDR)))
	s.add(list, s.pod())
	waitServer(t)
	req := request(t, filepath.Join(s.rt.BinDir, "weft-plugin"), []string{"CNI_COMMAND=VERSION"}, "")
	if ans := exchangeAs(t, 0, req); len(ans) < 13 || ans[0] != 'A' || !bytes.Contains(ans, []byte("supportedVersions")) {
		t.Fatalf("root asking VERSION got %q", ans)
	}
	if ans := exchangeAs(t, 65534, req); string(ans) != "R" {
		t.Fatalf("uid 65534 got %q, want a refusal", ans)
	}
}

// TestShimTrustsRootServerOnly: a process that is not root listening on
// the server's name first (abstract names have no permissions) gets no
// command: the shim executes the plugin, and the pod gets a real address,
// not the squatter's answer.
func TestShimTrustsRootServerOnly(t *testing.T) {
	s := newServerEnv(t)
	// The socket's credentials are those of the thread that listens.
	var ln net.Listener
	if err := asUID(65534, func() (err error) {
		ln, err = net.Listen("unix", serverName)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fake := `{"cniVersion":"1.1.0","ips":[{"address":"203.0.113.9/24"}]}`
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			head := make([]byte, 12)
			binary.NativeEndian.PutUint32(head[4:], uint32(len(fake)))
			_, _ = conn.Write(append(append([]byte{'A'}, head...), fake...))
			_ = conn.Close()
		}
	}()
	list := s.list("1.1.0", "squat", s.weft(subnet(podCIDR)))
	ip := s.add(list, s.pod())
	if _, cidr, _ := net.ParseCIDR(podCIDR); !cidr.Contains(ip) {
		t.Errorf("ADD got %s, not an address of %s: the squatter answered", ip, podCIDR)
	}
}

// TestServerParallel: 40 ADDs then 40 DELs at once, all served by the
// resident server.
func TestServerParallel(t *testing.T) {
	const n = 40
	s := newServerEnv(t)
	list := s.list("1.1.0", "par", s.weft(subnet(podCIDR)))
	warm := s.pod()
	s.add(list, warm)
	server := waitServer(t)
	s.del(list, warm)
	s.tracePIDs()
	pods := make([]cnitest.Attachment, n)
	for i := range pods {
		pods[i] = s.pod()
	}
	ips := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() {
			res, err := s.rt.Add(context.Background(), list, p)
			errs[i] = err
			if err == nil && len(res.IPs) > 0 {
				ips[i] = res.IPs[0].Address.IP.String()
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
	}
	if slices.Sort(ips); len(slices.Compact(ips)) != n {
		t.Fatalf("40 ADDs got %d distinct addresses", len(slices.Compact(ips)))
	}
	for i, p := range pods {
		wg.Go(func() { errs[i] = s.rt.Del(context.Background(), list, p) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("DEL %d: %v", i, err)
		}
	}
	pids := s.tracePIDs()
	for _, cmd := range []string{"ADD", "DEL"} {
		if len(pids[cmd]) != n || slices.ContainsFunc(pids[cmd], func(pid int) bool { return pid != server }) {
			t.Fatalf("%s served by %v, want the server %d %d times", cmd, pids[cmd], server, n)
		}
	}
	if k := s.allocations("par"); len(k) != 0 {
		t.Fatalf("allocations left: %v", k)
	}
	if v := s.armedVeths(); len(v) != 0 {
		t.Fatalf("attachments still up after DEL: %v", v)
	}
}
