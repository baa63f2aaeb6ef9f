package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/test/bench/benchlab"
)

// The data path measurement (-conn): in each proxy's box, a client pod and
// a server pod, each on a veth to the box with a /32 route (the box
// forwards between them, as a node between two of its pods), and a
// Service conn-target whose one endpoint is the server. The client, a
// child process started in the client pod's namespace and in the bench's
// cgroup (where weft-ebpf attaches its socket programs; no program is
// attached there while another proxy runs), opens TCP connections in a
// loop, each connect() then close() with SO_LINGER 0 (a reset: no
// TIME_WAIT to run out of ports), to the ClusterIP and, alternately, to
// the server's address directly.
const (
	connSvc    = "conn-target"
	connPort   = 9090                   // not endpointPort: the ruleset checks count only the seeded endpoints
	connRounds = 20                     // rounds to each address, alternating
	connRound  = 250 * time.Millisecond // one round
	connMax    = 100000                 // connections per round at most
	connEnv    = "PROXYBENCH_CONN_CLIENT"
)

var (
	connGateway = netip.MustParseAddr("10.244.250.1") // the box's side of each pod's veth
	connClient  = netip.MustParseAddr("10.244.250.2")
	connServer  = netip.MustParseAddr("10.244.250.3")
)

// connResult is one proxy's connection rates (per second, medians of the
// rounds) and the medians of the ratios of each ClusterIP round to the
// direct round before it (the two ran under about the same load), by the
// clock and by the client thread's CPU time (what a connection costs the
// client, its kernel side included: on these veths the handshake and the
// forwarding run in the client's softirq context; being descheduled
// costs none).
type connResult struct {
	vip, direct, ratio, cpuRatio float64
	err                          error
}

// connRate is what one round gave: connections per second of the clock
// and of the client's CPU time.
type connRate struct{ wall, cpu float64 }

// seedTarget creates a Service name (port 80, TCP) and its EndpointSlice
// (targetSlice) and returns its ClusterIP.
func seedTarget(ctx context.Context, c kubernetes.Interface, name string, port int32, server netip.Addr) (string, error) {
	if err := benchlab.EnsureNamespace(ctx, c, benchNS); err != nil {
		return "", err
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP,
		Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(port)}}}}
	created, err := c.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = c.CoreV1().Services(benchNS).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return "", fmt.Errorf("creating %s: %w", name, err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, targetSlice(name, port, server), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("creating %s's EndpointSlice: %w", name, err)
	}
	return created.Spec.ClusterIP, nil
}

// targetSlice is the EndpointSlice of Service name: server, ready, on
// the bench's node, at port.
func targetSlice(name string, port int32, server netip.Addr) *discoveryv1.EndpointSlice {
	ready, portName, proto, node := true, "tcp", corev1.ProtocolTCP, nodeName
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-bench", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "proxybench.weft.dev"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{server.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node}},
	}
}

// connRates measures the connection rates in box b, whose proxy has
// programmed every Service.
func (e *env) connRates(ctx context.Context, b *box) connResult {
	client, stop, err := b.clientServer("client", connClient, "server", connServer, "server")
	if err != nil {
		return connResult{err: err}
	}
	defer stop()
	vip := net.JoinHostPort(e.connVIP, "80")
	direct := netip.AddrPortFrom(connServer, connPort).String()
	// The proxy may still be writing the Service: a short run until the
	// ClusterIP connects.
	for start := time.Now(); ; {
		if _, err := e.connRun(client, []string{vip}, 100*time.Millisecond, 1); err == nil {
			break
		} else if time.Since(start) > 10*time.Second {
			return connResult{err: fmt.Errorf("ClusterIP %s: %w", vip, err)}
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return connResult{err: err}
		}
	}
	rates, err := e.connRun(client, []string{direct, vip}, connRound, connRounds)
	if err != nil {
		return connResult{err: err}
	}
	var directs, vips, ratios, cpuRatios []float64
	for i := range rates[0] {
		d, v := rates[0][i], rates[1][i]
		directs, vips = append(directs, d.wall), append(vips, v.wall)
		ratios, cpuRatios = append(ratios, v.wall/d.wall), append(cpuRatios, v.cpu/d.cpu)
	}
	return connResult{direct: medianOf(directs), vip: medianOf(vips), ratio: medianOf(ratios), cpuRatio: medianOf(cpuRatios)}
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// connRun runs the client in the client pod (namespace path ns): rounds
// times, for d to each address in turn. It returns the rates of every
// round, per address.
func (e *env) connRun(ns string, addrs []string, d time.Duration, rounds int) ([][]connRate, error) {
	var out, errb strings.Builder
	cmd, err := e.startClient(ns, fmt.Sprintf("%s;%d;%d", strings.Join(addrs, ","), d, rounds), &out, &errb)
	if err != nil {
		return nil, err
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("client: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	rates := make([][]connRate, len(addrs))
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var i, n int
		var wall, cpu int64
		if _, err := fmt.Sscan(line, &i, &n, &wall, &cpu); err != nil || i < 0 || i >= len(addrs) || n == 0 || wall <= 0 || cpu <= 0 {
			return nil, fmt.Errorf("client printed %q", line)
		}
		rates[i] = append(rates[i], connRate{wall: float64(n) / time.Duration(wall).Seconds(), cpu: float64(n) / time.Duration(cpu).Seconds()})
	}
	for i, r := range rates {
		if len(r) != rounds {
			return nil, fmt.Errorf("client: %d rounds to %s, want %d", len(r), addrs[i], rounds)
		}
	}
	return rates, nil
}

// startClient starts this program as a client process (connEnv=spec) in
// the pod at ns and in the bench's cgroup, writing to stdout and stderr.
func (e *env) startClient(ns, spec string, stdout, stderr io.Writer) (*exec.Cmd, error) {
	cg, err := os.Open(e.ebpf.cgroup)
	if err != nil {
		return nil, err
	}
	defer cg.Close()
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	// No asynchronous preemption: fewer signals interrupting connect().
	cmd.Env = []string{connEnv + "=" + spec, "GODEBUG=asyncpreemptoff=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := netnsutil.Do(ns, cmd.Start); err != nil {
		return nil, fmt.Errorf("starting the client: %w", err)
	}
	return cmd, nil
}

// clientServer makes a client pod and a server pod in b (names and
// addresses) and starts the server process (connEnv=mode) in its pod; it
// returns the client pod's namespace path and what stops the server.
func (b *box) clientServer(client string, clientIP netip.Addr, server string, serverIP netip.Addr, mode string) (string, func(), error) {
	cns, err := b.pod(client, clientIP)
	if err != nil {
		return "", nil, err
	}
	sns, err := b.pod(server, serverIP)
	if err != nil {
		return "", nil, err
	}
	stop, err := startServer(sns, mode)
	return cns, stop, err
}

// startServer starts the server process (connEnv=mode) in the server
// pod (namespace path ns) and waits until it listens; stop ends it.
func startServer(ns, mode string) (stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = []string{connEnv + "=" + mode, "GODEBUG=asyncpreemptoff=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := netnsutil.Do(ns, cmd.Start); err != nil {
		return nil, fmt.Errorf("starting the server: %w", err)
	}
	stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	line := make([]byte, 16)
	if n, err := out.Read(line); err != nil || !strings.HasPrefix(string(line[:n]), "listening") {
		stop()
		return nil, fmt.Errorf("the server did not start listening: %q %v", line[:n], err)
	}
	return stop, nil
}

// connServerMain is the server process: accept and close, until killed
// (one thread, no Go network poller, so that it keeps up with a client
// like it).
func connServerMain() int {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		err = unix.Bind(fd, &unix.SockaddrInet4{Port: connPort})
	}
	if err == nil {
		err = unix.Listen(fd, 4096)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		return 1
	}
	fmt.Println("listening")
	for {
		c, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
		if err == nil {
			_ = unix.Close(c)
		}
	}
}

// connClientMain is the client process: rounds times, to each address in
// turn for the round's duration, connect and reset in a loop; it prints a
// line per address and round: the address's index, the connections made,
// the nanoseconds they took and the thread's CPU nanoseconds.
func connClientMain(spec string) int {
	runtime.LockOSThread() // the thread's CPU time is the loop's
	f := strings.Split(spec, ";")
	if len(f) != 3 {
		fmt.Fprintln(os.Stderr, "bad client spec", spec)
		return 2
	}
	d, err := strconv.ParseInt(f[1], 10, 64)
	rounds, err2 := strconv.Atoi(f[2])
	if err := errors.Join(err, err2); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var targets []*unix.SockaddrInet4
	for _, a := range strings.Split(f[0], ",") {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		targets = append(targets, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	}
	for range rounds {
		for i, sa := range targets {
			cpu0, err := threadCPU()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			n, took, err := connLoop(sa, time.Duration(d))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			cpu1, _ := threadCPU()
			fmt.Println(i, n, took.Nanoseconds(), (cpu1 - cpu0).Nanoseconds())
		}
	}
	return 0
}

// threadCPU is the calling thread's user and system CPU time.
func threadCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// connLoop connects to sa and resets, one connection at a time, for d (at
// most connMax connections).
func connLoop(sa *unix.SockaddrInet4, d time.Duration) (int, time.Duration, error) {
	linger := &unix.Linger{Onoff: 1, Linger: 0}
	start := time.Now()
	n := 0
	for n < connMax && time.Since(start) < d {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return 0, 0, fmt.Errorf("socket: %w", err)
		}
		// A dropped SYN must not hang the loop (a retransmission waits 1 s).
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 5})
		err = unix.Connect(fd, sa)
		// Interrupted (a signal of the Go runtime), the handshake goes
		// on: connect again until it says how it ended.
		for err == unix.EINTR || err == unix.EALREADY {
			err = unix.Connect(fd, sa)
		}
		if err == unix.EISCONN {
			err = nil
		}
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, linger)
		_ = unix.Close(fd)
		if err != nil {
			return 0, 0, fmt.Errorf("connect: %w", err)
		}
		n++
	}
	return n, time.Since(start), nil
}

// pod creates a pod namespace with address ip, on a veth to the box
// (the box's side has connGateway; each side routes the other's /32). Its
// name starts with the box's, so lab.Down removes it too.
func (b *box) pod(name string, ip netip.Addr) (string, error) {
	nsName := b.name + "-" + name
	path, err := netnsutil.NewNamed(nsName)
	if err != nil {
		return "", err
	}
	podNS, err := netns.GetFromPath(path)
	if err != nil {
		return "", err
	}
	defer podNS.Close()
	host := "p-" + name
	gw := &net.IPNet{IP: connGateway.AsSlice(), Mask: net.CIDRMask(32, 32)}
	self := &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}
	err = netnsutil.Do(b.path, func() error {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host, Flags: net.FlagUp},
			PeerName: "eth0", PeerNamespace: netlink.NsFd(int(podNS))}); err != nil {
			return err
		}
		l, err := netlink.LinkByName(host)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: gw}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: self, Scope: netlink.SCOPE_LINK})
	})
	if err != nil {
		return "", fmt.Errorf("pod %s: wiring the box side: %w", name, err)
	}
	err = netnsutil.Do(path, func() error {
		for _, n := range []string{"lo", "eth0"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, _ := netlink.LinkByName("eth0")
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: self}); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: gw, Scope: netlink.SCOPE_LINK}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.IP})
	})
	if err != nil {
		return "", fmt.Errorf("pod %s: wiring the pod side: %w", name, err)
	}
	b.pods = append(b.pods, nsName)
	return path, nil
}
