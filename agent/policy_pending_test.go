package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	dto "github.com/prometheus/client_model/go"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

// The pending bed's address plan: one node (the test's private namespace),
// its pods on one bridge with a dual-stack range.
const (
	pendBridge   = "wpend0"
	pendSubnet   = "10.244.1.0/24"
	pendSubnet6  = "fd00:10:244:1::/64"
	pendPort     = 80
	pendNode     = "node1"
	pendTimeout  = 3 * time.Second // the bound, for the attachment no Pod names
	pendHammered = 8               // addresses after the gateway the prober hammers: every pod of the bed
)

// pendBed is a node running the real CNI plugin through libcni and a
// policy controller fed by hand (the API server's part).
type pendBed struct {
	t    *testing.T
	rt   *cnitest.Runtime
	list *libcni.NetworkConfigList
	c    *PolicyController
	seq  int
}

func newPendBed(t *testing.T, mode string) *pendBed {
	t.Helper()
	if testing.Short() {
		t.Skip("kernel test: skipped with -short")
	}
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	bin, err := cnitest.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "ipam")
	list, err := cnitest.Conflist("1.1.0", CNINetwork, map[string]any{
		"type": "weft", "bridge": pendBridge,
		"ipam": map[string]any{"dataDir": dataDir, "ranges": [][]map[string]any{{{"subnet": pendSubnet}}, {{"subnet": pendSubnet6}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b := &pendBed{t: t, rt: cnitest.NewRuntime(bin, filepath.Join(dir, "cache")), list: list}
	b.c, err = NewPolicyController(PolicyOptions{NodeName: pendNode, Mode: mode, IPAMDataDir: dataDir, Bridge: pendBridge,
		MinSyncPeriod: 20 * time.Millisecond, PendingTimeout: pendTimeout, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-done
		if err := b.c.Cleanup(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if l, err := netlink.LinkByName(pendBridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	for _, ns := range []string{"x", "y"} {
		b.c.OnNamespace(nil, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{nt.NSLabel: ns}}})
	}
	// x/target admits only x/allowed, on the bed's port.
	b.c.OnNetworkPolicy(nil, nt.Policy("x", "target", nt.L("app", "target"),
		nt.Ingress(nt.From(nt.Peers(nt.PodPeer(nt.L(nt.PodLabel, "allowed"))), nt.Port(corev1.ProtocolUDP, pendPort), nt.Port(corev1.ProtocolTCP, pendPort)))))
	b.c.OnPolicySynced()
	go func() { defer close(done); b.c.Run(ctx) }()
	// Pods present at the first sync are not new: wait for it.
	testutil.Eventually(t, 20*time.Second, "the first policy sync", func() bool {
		return counterValue(t, b.c, "weft_policy_syncs_total") > 0
	})
	return b
}

// remote is a host off the node (another node's pod, say), on a veth to
// the node, routed to the pods: its packets reach a new pod as soon as
// the pod has its address (the plugin gives the node the pod's neighbour
// entry), with no neighbour discovery of its own to wait for.
func (b *pendBed) remote() (path string, v4, v6 netip.Addr) {
	b.t.Helper()
	path = b.netns()
	v4, v6 = netip.MustParseAddr("172.18.0.100"), netip.MustParseAddr("fd00:18::100")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pendremote"}, PeerName: "eth0"}
	if err := netlink.LinkAdd(veth); err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	addrs := func(l netlink.Link, h *netlink.Handle, a4, a6 string) error {
		for _, a := range []string{a4, a6} {
			addr, _ := netlink.ParseAddr(a)
			addr.Flags = unix.IFA_F_NODAD
			if err := h.AddrAdd(l, addr); err != nil {
				return err
			}
		}
		return h.LinkSetUp(l)
	}
	peer, err := netlink.LinkByName("eth0")
	if err != nil {
		b.t.Fatal(err)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer ns.Close()
	if err := netlink.LinkSetNsFd(peer, int(ns)); err != nil {
		b.t.Fatal(err)
	}
	host, _ := netlink.LinkByName("pendremote")
	if err := addrs(host, &netlink.Handle{}, "172.18.0.1/24", "fd00:18::1/64"); err != nil {
		b.t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		b.t.Fatal(err)
	}
	defer h.Close()
	in, err := h.LinkByName("eth0")
	if err != nil {
		b.t.Fatal(err)
	}
	if err := addrs(in, h, v4.String()+"/24", v6.String()+"/64"); err != nil {
		b.t.Fatal(err)
	}
	for _, r := range []struct{ dst, gw string }{{pendSubnet, "172.18.0.1"}, {pendSubnet6, "fd00:18::1"}} {
		dst := netip.MustParsePrefix(r.dst)
		if err := h.RouteAdd(&netlink.Route{LinkIndex: in.Attrs().Index, Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}, Gw: net.ParseIP(r.gw)}); err != nil {
			b.t.Fatal(err)
		}
	}
	return path, v4, v6
}

// pod is a pod object scheduled on the node, without an address: the
// API server has it before its sandbox exists.
func pendPod(ns, name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name), Labels: labels},
		Spec:       corev1.PodSpec{NodeName: pendNode},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// netns makes a pod network namespace, removed when the test ends.
func (b *pendBed) netns() string {
	b.t.Helper()
	b.seq++
	name := fmt.Sprintf("pend-%d", b.seq)
	path, err := netnsutil.NewNamed(name)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = netnsutil.Delete(name) })
	return path
}

// add runs the plugin's ADD for a pod namespace (pod nil: the runtime
// names no pod) and returns its IPv4 and IPv6 addresses.
func (b *pendBed) add(path string, pod *corev1.Pod) (netip.Addr, netip.Addr) {
	b.t.Helper()
	a := cnitest.Attachment{ContainerID: "ctr-" + filepath.Base(path), NetNS: path, IfName: "eth0"}
	if pod != nil {
		a.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", pod.Namespace}, {"K8S_POD_NAME", pod.Name}, {"K8S_POD_UID", string(pod.UID)}}
	}
	res, err := b.rt.Add(context.Background(), b.list, a)
	if err != nil {
		b.t.Fatalf("ADD %s: %v", path, err)
	}
	b.t.Cleanup(func() { _ = b.rt.Del(context.Background(), b.list, a) })
	var v4, v6 netip.Addr
	for _, ip := range res.IPs {
		addr, _ := netip.AddrFromSlice(ip.Address.IP)
		if addr = addr.Unmap(); addr.Is4() {
			v4 = addr
		} else {
			v6 = addr
		}
	}
	return v4, v6
}

// waitReady waits until the agent marked addrs programmed.
func (b *pendBed) waitReady(addrs ...netip.Addr) {
	b.t.Helper()
	testutil.Eventually(b.t, 20*time.Second, fmt.Sprintf("%v marked programmed", addrs), func() bool {
		m, err := b.c.backend.readyMembers(true)
		for _, a := range addrs {
			if err != nil || !m[a] {
				return false
			}
		}
		return true
	})
}

// sink records the sources of every UDP datagram and TCP connection that
// reaches a pod, from the moment it is opened (before the pod has an
// interface) on.
type sink struct {
	mu   sync.Mutex
	from map[netip.Addr]int
}

func (s *sink) record(a netip.Addr) {
	s.mu.Lock()
	s.from[a.Unmap()]++
	s.mu.Unlock()
}

func (s *sink) count(a netip.Addr) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.from[a]
}

func listenAll(t *testing.T, path string) *sink {
	t.Helper()
	s := &sink{from: map[netip.Addr]int{}}
	err := netnsutil.Do(path, func() error {
		u, err := net.ListenUDP("udp", &net.UDPAddr{Port: pendPort})
		if err != nil {
			return err
		}
		t.Cleanup(func() { u.Close() })
		go func() {
			buf := make([]byte, 512)
			for {
				_, from, err := u.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				s.record(from.Addr())
			}
		}()
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(pendPort))
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				s.record(c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr())
				c.Close()
			}
		}()
		return nil
	})
	if err != nil {
		t.Fatalf("listening in %s: %v", path, err)
	}
	return s
}

// hammer sends UDP datagrams and opens TCP connections from the pod at
// path to the first pendHammered addresses of both families, over and
// over, until stop is closed, counting its rounds.
func hammer(path string, stop <-chan struct{}, rounds *atomic.Int64) {
	var targets []string
	for _, subnet := range []string{pendSubnet, pendSubnet6} {
		a := netip.MustParsePrefix(subnet).Addr().Next() // the gateway
		for range pendHammered {
			a = a.Next()
			targets = append(targets, net.JoinHostPort(a.String(), strconv.Itoa(pendPort)))
		}
	}
	dial := netnsutil.Dialer(path, nil)
	var udp []net.Conn
	defer func() {
		for _, c := range udp {
			c.Close()
		}
	}()
	for _, addr := range targets {
		if c, err := dial(context.Background(), "udp", addr); err == nil {
			udp = append(udp, c)
		}
	}
	for {
		select {
		case <-stop:
			return
		default:
		}
		for _, c := range udp {
			_, _ = c.Write([]byte("probe"))
		}
		var wg sync.WaitGroup
		for _, addr := range targets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
				defer cancel()
				if c, err := dial(ctx, "tcp", addr); err == nil {
					c.Close()
				}
			}()
		}
		wg.Wait()
		rounds.Add(1)
	}
}

func histogram(t *testing.T, c *PolicyController, name string) *dto.Histogram {
	t.Helper()
	mfs, err := c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// A new pod whose policy admits only some peers never receives a packet
// from the others, from before its ADD returns on, over IPv4 and IPv6,
// although the API server reports its address only later; the peers it
// admits reach it once it is programmed. Pods no policy selects become
// reachable too, and an attachment no Pod names is released at the bound
// and counted. Both policy modes; the nftables one on a node without
// iptables or ipset tools (PATH holds nft alone).
func TestNewPodDefaultDeny(t *testing.T) {
	for _, mode := range []string{PolicyModeIPTables, PolicyModeNFTables} {
		t.Run(mode, func(t *testing.T) {
			if mode == PolicyModeNFTables {
				nftOnlyPath(t)
			}
			testNewPodDefaultDeny(t, mode)
		})
	}
}

// nftOnlyPath makes PATH hold the nft tool alone for the rest of the
// test: what the code under test runs of iptables or ipset is not found.
func nftOnlyPath(t *testing.T) {
	t.Helper()
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Fatalf("nftables mode needs the nft tool: %v", err)
	}
	dir := t.TempDir()
	if err := os.Symlink(nft, filepath.Join(dir, "nft")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	for _, tool := range []string{"iptables", "ip6tables", "iptables-restore", "ipset"} {
		if _, err := exec.LookPath(tool); err == nil {
			t.Fatalf("%s still found", tool)
		}
	}
}

func testNewPodDefaultDeny(t *testing.T, mode string) {
	b := newPendBed(t, mode)
	allowed, denied := pendPod("x", "allowed", map[string]string{nt.PodLabel: "allowed"}), pendPod("y", "denied", map[string]string{nt.PodLabel: "denied"})
	target := pendPod("x", "target", map[string]string{"app": "target"})
	for _, p := range []*corev1.Pod{allowed, denied, target} {
		b.c.OnPolicyPod(nil, p)
	}
	allowedNS, deniedNS := b.netns(), b.netns()
	al4, al6 := b.add(allowedNS, allowed)
	de4, de6 := b.add(deniedNS, denied)
	b.waitReady(al4, al6, de4, de6) // pods no policy selects, programmed from their allocation alone
	remoteNS, re4, re6 := b.remote()

	targetNS := b.netns()
	got := listenAll(t, targetNS)
	stop := make(chan struct{})
	var rounds atomic.Int64
	var hammers sync.WaitGroup
	for _, ns := range []string{allowedNS, deniedNS, remoteNS} {
		hammers.Add(1)
		go func() { defer hammers.Done(); hammer(ns, stop, &rounds) }()
	}
	stopHammers := sync.OnceFunc(func() { close(stop); hammers.Wait() })
	defer stopHammers()
	waitRounds := func(n int64) {
		mark := rounds.Load() + n
		testutil.Eventually(t, time.Minute, fmt.Sprintf("%d rounds of probes", n), func() bool { return rounds.Load() >= mark })
	}
	waitRounds(4) // hammering before the sandbox exists
	t4, t6 := b.add(targetNS, target)
	// The kubelet reports the address only after many more rounds: until
	// then the agent knows the pod only from its allocation.
	waitRounds(100)
	reported := target.DeepCopy()
	reported.Status.Phase = corev1.PodRunning
	reported.Status.PodIPs = []corev1.PodIP{{IP: t4.String()}, {IP: t6.String()}}
	reported.Status.PodIP = t4.String()
	b.c.OnPolicyPod(target, reported)
	testutil.Eventually(t, 20*time.Second, "the admitted peer reaching the new pod over IPv4 and IPv6", func() bool {
		return got.count(al4) > 0 && got.count(al6) > 0
	})
	waitRounds(10)
	stopHammers()
	t.Logf("target %s %s: %d datagrams or connections from the admitted peer", t4, t6, got.count(al4)+got.count(al6))
	for _, forbidden := range [][2]netip.Addr{{de4, de6}, {re4, re6}} {
		if n4, n6 := got.count(forbidden[0]), got.count(forbidden[1]); n4+n6 > 0 {
			t.Errorf("the new pod received %d IPv4 and %d IPv6 datagrams or connections from %s that its policy forbids", n4, n6, forbidden)
		}
	}

	// An attachment no Pod names stays default-deny until the bound, then
	// is released as a pod no policy selects, and counted.
	unknownNS := b.netns()
	unknown := listenAll(t, unknownNS)
	u4, _ := b.add(unknownNS, nil)
	send := func() {
		if c, err := netnsutil.Dialer(deniedNS, nil)(context.Background(), "udp", net.JoinHostPort(u4.String(), strconv.Itoa(pendPort))); err == nil {
			_, _ = c.Write([]byte("probe"))
			c.Close()
		}
	}
	for range 5 {
		send()
		time.Sleep(20 * time.Millisecond)
	}
	if n := unknown.count(de4); counterValue(t, b.c, "weft_policy_pending_expired_total") == 0 && n > 0 {
		t.Errorf("an attachment not tied to a Pod received %d datagrams before its bound", n)
	}
	testutil.Eventually(t, 20*time.Second, "the released attachment reachable", func() bool {
		send()
		time.Sleep(20 * time.Millisecond)
		return unknown.count(de4) > 0
	})
	if n := counterValue(t, b.c, "weft_policy_pending_expired_total"); n != 1 {
		t.Errorf("weft_policy_pending_expired_total = %v, want 1", n)
	}
	h := histogram(t, b.c, "weft_policy_pending_seconds")
	t.Logf("weft_policy_pending_seconds: %d new attachments programmed, %.1f ms on average", h.GetSampleCount(), 1000*h.GetSampleSum()/float64(h.GetSampleCount()))
	if h.GetSampleCount() != 3 {
		t.Errorf("weft_policy_pending_seconds counted %d attachments, want the 3 pods (the released one counts as expired)", h.GetSampleCount())
	}
}

// counterValue sums a counter's series (0 before any).
func counterValue(t *testing.T, c *PolicyController, name string) float64 {
	t.Helper()
	mfs, err := c.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
