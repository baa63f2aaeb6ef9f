package ebpf_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab/workload"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/proxytest"
)

func TestMain(m *testing.M) {
	if os.Getenv(outsideEnv) != "" {
		os.Exit(outsideMain())
	}
	os.Exit(netnsutil.RunTests(m))
}

// backend is the eBPF backend as the shared scenario table runs it.
var backend = proxytest.Backend{
	Mode:  "ebpf",
	Setup: setup,
	// A connected UDP socket is connected to the backend itself: when the
	// backend leaves, the socket is destroyed (bpf/udpdestroy.c).
	TerminatesUDP: true,
	Outside:       outsideGet,
	OutsideDialer: func(ns string) func(context.Context, string, string) (net.Conn, error) {
		return netnsutil.CgroupDialer(ns, outsideCgroup)
	},
}

// TestScenarios runs the backend-neutral real-traffic scenario table.
func TestScenarios(t *testing.T) { proxytest.Run(t, backend) }

// TestScenariosDSR runs the table in dsr mode: on one node every backend
// is local, so direct server return must change nothing.
func TestScenariosDSR(t *testing.T) {
	dsr := backend
	dsr.Setup = func(t *testing.T, c *proxy.Config) {
		setup(t, c)
		c.BPFLBMode = "dsr"
	}
	proxytest.Run(t, dsr)
}

// TestScenariosXDP runs the whole table with weft_nodeport_xdp on the
// uplinks: generic XDP, and auto (native XDP on the plain uplink, a veth;
// the tc path on a VLAN uplink, whose device has no native XDP): the
// translation at XDP must change nothing the clients and backends see.
// (That XDP, not tc, translated the flows is TestXDPRealTraffic's.)
func TestScenariosXDP(t *testing.T) {
	for _, mode := range []string{"generic", "auto"} {
		t.Run(mode, func(t *testing.T) {
			x := backend
			x.Setup = func(t *testing.T, c *proxy.Config) {
				setup(t, c)
				c.BPFXDP = mode
			}
			proxytest.Run(t, x)
		})
	}
}

// env is what setup made for one test.
type env struct {
	cgroup string // the cgroup the test process runs in, programs attach to
	pin    string // the backend's pin path, on a bpffs the test mounted
}

var envs = map[*testing.T]env{}

// setup mounts cgroup2 and bpffs privately (the test runs in its own mount
// namespace), creates a cgroup under the cgroup v2 root, moves the test
// process into it (so that the sockets of the node and of its pods, which
// are the test's own goroutines, go through the programs) and points the
// backend at them. The cleanup moves the process back and removes the
// cgroup, which detaches anything left on it.
func setup(t *testing.T, c *proxy.Config) {
	t.Helper()
	cg2 := mount(t, "cgroup2")
	self, err := ownCgroup()
	if err != nil {
		t.Fatal(err)
	}
	if err := sweepCgroups(cg2); err != nil {
		t.Fatal(err)
	}
	cg, err := os.MkdirTemp(cg2, fmt.Sprintf("%s%d-", cgroupPrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := removeCgroup(cg, filepath.Join(cg2, self)); err != nil {
			t.Errorf("removing the test cgroup: %v", err)
		}
	})
	if err := join(cg, os.Getpid()); err != nil {
		t.Fatal(err)
	}
	// The outside host's clients run in a cgroup of their own, beside the
	// node's: no program is attached there, as on a real outside host.
	out, err := os.MkdirTemp(cg2, fmt.Sprintf("%s%d-outside-", cgroupPrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	outsideCgroup = out
	t.Cleanup(func() {
		if outside != nil {
			outside.stop()
			outside = nil
		}
		if err := removeCgroup(out, filepath.Join(cg2, self)); err != nil {
			t.Errorf("removing the outside cgroup: %v", err)
		}
	})
	bpffs := mount(t, "bpf")
	c.CgroupRoot, c.BPFPinPath = cg, filepath.Join(bpffs, "weft")
	envs[t] = env{cgroup: cg, pin: c.BPFPinPath}
	t.Cleanup(func() { delete(envs, t) })
}

// outsideCgroup is the current test's cgroup for outside clients, and
// outside the client process running there (started by the test's first
// outside request, stopped by its cleanup).
var (
	outsideCgroup string
	outside       *outsideClient
)

// outsideEnv makes the test binary an outside client: it reads requests
// from its standard input and writes the answers to its standard output,
// one JSON object a line.
const outsideEnv = "WEFT_EBPF_TEST_OUTSIDE"

// outsideRequest is an HTTP GET of URL, or with Addr set a line sent on
// the client's TCP connection to Addr (dialled by the first such request,
// kept open), which an echo server answers with a line; with Short set,
// Short connections to Addr one after another, each opened, asked a
// line and closed.
type outsideRequest struct {
	NS, Src, URL, Addr, Line string
	Short                    int
}

type outsideAnswer struct {
	Reply workload.Reply
	Line  string
	Err   string
}

// outsideClient is a child process born in the outside cgroup (the test
// process's own sockets are translated by the socket programs, as a
// node's are, and a process cannot take its threads elsewhere).
type outsideClient struct {
	cmd *exec.Cmd
	in  *json.Encoder
	out *json.Decoder
}

func startOutside() (*outsideClient, error) {
	f, err := os.Open(outsideCgroup)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), outsideEnv+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the outside client: %w", err)
	}
	return &outsideClient{cmd: cmd, in: json.NewEncoder(in), out: json.NewDecoder(out)}, nil
}

// stop ends the client (its input closes) and waits for it.
func (c *outsideClient) stop() {
	if in, ok := c.cmd.Stdin.(io.Closer); ok {
		_ = in.Close()
	}
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

// outsideDo has the outside client (started by the test's first request)
// carry out req.
func outsideDo(req outsideRequest) (outsideAnswer, error) {
	var a outsideAnswer
	if outside == nil {
		c, err := startOutside()
		if err != nil {
			return a, err
		}
		outside = c
	}
	if err := outside.in.Encode(req); err != nil {
		return a, fmt.Errorf("asking the outside client: %w", err)
	}
	if err := outside.out.Decode(&a); err != nil {
		return a, fmt.Errorf("reading the outside client's answer: %w", err)
	}
	if a.Err != "" {
		return a, errors.New(a.Err)
	}
	return a, nil
}

// outsideGet is proxytest.Get run by the outside client.
func outsideGet(ns, src, url string) (workload.Reply, error) {
	a, err := outsideDo(outsideRequest{NS: ns, Src: src, URL: url})
	return a.Reply, err
}

// outsideEcho sends line on the outside client's connection to addr and
// returns the answer.
func outsideEcho(ns, addr, line string) (string, error) {
	a, err := outsideDo(outsideRequest{NS: ns, Addr: addr, Line: line})
	return a.Line, err
}

// outsideMain is the outside client's process.
func outsideMain() int {
	in, out := json.NewDecoder(os.Stdin), json.NewEncoder(os.Stdout)
	conns, deadlines := map[string]*bufio.ReadWriter{}, map[string]net.Conn{}
	for {
		var req outsideRequest
		if err := in.Decode(&req); err != nil {
			return 0
		}
		var a outsideAnswer
		var err error
		switch {
		case req.Addr == "":
			a.Reply, err = proxytest.Get(req.NS, req.Src, req.URL)
		case req.Short > 0:
			err = shortConnections(req)
		default:
			a.Line, err = echo(conns, deadlines, req)
		}
		if err != nil {
			a.Err = err.Error()
		}
		if err := out.Encode(a); err != nil {
			return 1
		}
	}
}

// echo sends req.Line on the connection to req.Addr, dialling it first if
// needed, and reads the answer.
func echo(conns map[string]*bufio.ReadWriter, deadlines map[string]net.Conn, req outsideRequest) (string, error) {
	rw := conns[req.Addr]
	if rw == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := netnsutil.Dialer(req.NS, nil)(ctx, "tcp", req.Addr)
		if err != nil {
			return "", err
		}
		rw = bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
		conns[req.Addr], deadlines[req.Addr] = rw, c
	}
	_ = deadlines[req.Addr].SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := rw.WriteString(req.Line + "\n"); err != nil {
		return "", err
	}
	if err := rw.Flush(); err != nil {
		return "", err
	}
	line, err := rw.ReadString('\n')
	return strings.TrimSpace(line), err
}

// cgroupPrefix starts the name of every cgroup these tests create, followed
// by the test process's pid.
const cgroupPrefix = "weft-ebpf-test-"

// removeCgroup moves every process of cg to parent and removes cg, which
// detaches the programs attached to it. Processes the test started leave
// with it (the CNI plugin's veth reaper outlives a DEL); one that was being
// forked while they moved joins cg after the move, so a busy cgroup is
// emptied again, a bounded number of times.
func removeCgroup(cg, parent string) error {
	var err error
	for range 50 {
		if err = moveAll(cg, parent); err != nil {
			return fmt.Errorf("leaving %s: %w", cg, err)
		}
		if err = os.Remove(cg); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// sweepCgroups removes the empty cgroups that earlier runs of these tests
// left under root when they were killed before their cleanup: those whose
// creating process is gone. A cgroup with processes cannot be removed and
// stays.
func sweepCgroups(root string) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), cgroupPrefix)
		if !e.IsDir() || !ok {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || unix.Kill(pid, 0) == nil {
			continue // not ours, or its run is still going
		}
		if err := os.Remove(filepath.Join(root, e.Name())); err != nil && !errors.Is(err, unix.EBUSY) && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing a cgroup left by an earlier run: %w", err)
		}
	}
	return nil
}

// mount mounts a file system of type fs on a new temporary directory.
func mount(t *testing.T, fs string) string {
	t.Helper()
	if !netnsutil.Isolated() {
		t.Fatal("mounting outside a private mount namespace")
	}
	dir := t.TempDir()
	if err := unix.Mount(fs, dir, fs, 0, ""); err != nil {
		t.Fatalf("mounting %s: %v", fs, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// ownCgroup is the test process's cgroup v2 path.
func ownCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 line in /proc/self/cgroup")
}

func join(cgroup string, pid int) error {
	return os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// moveAll moves every process of cgroup from to cgroup to.
func moveAll(from, to string) error {
	b, err := os.ReadFile(filepath.Join(from, "cgroup.procs"))
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err == nil {
			err = join(to, pid)
		}
		if err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("moving process %s: %w", f, err))
		}
	}
	return errors.Join(errs...)
}

// shortConnections opens req.Short connections to req.Addr one after
// another, each asked a line and closed (an orderly close: FIN both ways).
func shortConnections(req outsideRequest) error {
	dial := netnsutil.Dialer(req.NS, nil)
	for i := range req.Short {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := dial(ctx, "tcp", req.Addr)
		cancel()
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_, err = fmt.Fprintln(c, "short")
		if err == nil {
			_, err = bufio.NewReader(c).ReadString('\n')
		}
		c.Close()
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
	}
	return nil
}
