package wireguard_test

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/capture"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/routing/wireguard"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// A small cluster of namespaces: an underlay bridge, and per node a
// namespace on it (eth0, 192.168.77.i/24, host-gw routes to the other
// nodes' podCIDRs in the main table, as the routing mode would leave them)
// with a bridge holding 10.244.i.1/24 and one pod, 10.244.i.2, that
// answers each line with "pod-i saw <client> <line>".
const (
	podPort = 8080
	mtu     = 1500
)

func nodeIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{192, 168, 77, byte(i)}) }
func podCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}
func podIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i), 2}) }

type cluster struct {
	t        testing.TB // a test's or a benchmark's
	impl     wireguard.Implementation
	underlay string
	nodes    []*node // nodes[0] is node 1
}

type node struct {
	i      int
	ns     string
	pod    string
	rec    *wireguard.Reconciler
	strict bool
	off    bool // runs no encryption (yet)
	// published is what the node's annotations say; a test may spoil them.
	published wireguard.Node
}

var seq atomic.Int32

// eachImplementation runs test once per implementation: the userspace one
// where /dev/net/tun exists, the kernel's where the kernel has WireGuard
// (the VM suite, test/vm: this machine's kernel has none).
func eachImplementation(t *testing.T, test func(t *testing.T, impl wireguard.Implementation)) {
	if testing.Short() {
		t.Skip("kernel test: skipped with -short")
	}
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	for _, impl := range []wireguard.Implementation{wireguard.Kernel, wireguard.Userspace} {
		t.Run(string(impl), func(t *testing.T) {
			if why := unavailable(impl); why != "" {
				if impl == wireguard.Kernel && os.Getenv("WEFT_WIREGUARD_KERNEL") == "required" {
					t.Fatal(why) // the VM suite's kernel has it
				}
				t.Skip(why)
			}
			test(t, impl)
		})
	}
}

// unavailable says why impl cannot run here ("" if it can).
func unavailable(impl wireguard.Implementation) string {
	if impl == wireguard.Userspace {
		if _, err := os.Stat("/dev/net/tun"); err != nil {
			return "no /dev/net/tun for the userspace implementation"
		}
		return ""
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "wg-probe"
	link := &netlink.Wireguard{LinkAttrs: attrs}
	if err := netlink.LinkAdd(link); err != nil {
		return fmt.Sprintf("this kernel cannot make a WireGuard link (%v); the VM suite (test/vm) runs the tests on a kernel with it", err)
	}
	_ = netlink.LinkDel(link)
	return ""
}

func newCluster(t testing.TB, impl wireguard.Implementation, n int) *cluster {
	t.Helper()
	prefix := fmt.Sprintf("wg%d", seq.Add(1))
	c := &cluster{t: t, impl: impl}
	c.underlay = c.netns(prefix + "-underlay")
	c.do(c.underlay, func() error { return addBridge("underlay0", netip.Prefix{}) })
	for i := 1; i <= n; i++ {
		nd := &node{i: i, ns: c.netns(fmt.Sprintf("%s-node%d", prefix, i)), pod: c.netns(fmt.Sprintf("%s-pod%d", prefix, i))}
		c.nodes = append(c.nodes, nd)
		c.do(c.underlay, func() error { return netnsutil.BridgedVeth(fmt.Sprintf("node%d", i), "underlay0", nd.ns, "eth0", mtu) })
		c.do(nd.ns, func() error { return setupNode(i, n, nd.pod) })
		c.do(nd.pod, func() error { return setupPod(i) })
		c.serve(nd)
	}
	for _, nd := range c.nodes {
		c.start(nd)
	}
	return c
}

func (c *cluster) netns(name string) string {
	c.t.Helper()
	path, err := netnsutil.NewNamed(name)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = netnsutil.Delete(name) })
	return path
}

func (c *cluster) do(ns string, fn func() error) {
	c.t.Helper()
	if err := netnsutil.Do(ns, fn); err != nil {
		c.t.Fatalf("in %s: %v", ns, err)
	}
}

func (c *cluster) node(i int) *node { return c.nodes[i-1] }

// start gives nd a new Reconciler (what an agent's start does: a new key,
// published with the endpoint).
func (c *cluster) start(nd *node) {
	c.t.Helper()
	rec, err := wireguard.NewReconciler(wireguard.Options{
		MTU: mtu - wireguard.OverheadIPv4, Impl: c.impl,
		In:   func(fn func() error) error { return netnsutil.Do(nd.ns, fn) },
		Logf: c.t.Logf,
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { rec.Close() })
	nd.rec = rec
	nd.published = wireguard.Node{
		Name: fmt.Sprintf("node-%d", nd.i), PodCIDRs: []netip.Prefix{podCIDR(nd.i)},
		PublicKey: rec.PublicKey().String(), Endpoint: netip.AddrPortFrom(nodeIP(nd.i), uint16(rec.Port())).String(),
	}
}

// sync is every node's agent reading every node's annotations.
func (c *cluster) sync() {
	c.t.Helper()
	for _, nd := range c.nodes {
		c.syncNode(nd)
	}
}

// syncNode is one node's agent's sync.
func (c *cluster) syncNode(nd *node) {
	c.t.Helper()
	if nd.off {
		return
	}
	var all []wireguard.Node
	for _, n := range c.nodes {
		all = append(all, n.published)
	}
	d, _ := wireguard.Compute(wireguard.Config{Self: nd.published, Strict: nd.strict}, all)
	if err := nd.rec.Apply(d); err != nil {
		c.t.Fatalf("node-%d: %v", nd.i, err)
	}
}

func setupNode(i, n int, podNS string) error {
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(eth0, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(nodeIP(i), 24))}); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(eth0); err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return err
	}
	if err := addBridge("weft0", netip.PrefixFrom(podCIDR(i).Addr().Next(), 24)); err != nil {
		return err
	}
	for j := 1; j <= n; j++ {
		if j != i {
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipnet(podCIDR(j)), Gw: nodeIP(j).AsSlice()}); err != nil {
				return fmt.Errorf("host-gw route to %s: %w", podCIDR(j), err)
			}
		}
	}
	return netnsutil.BridgedVeth("vpod", "weft0", podNS, "eth0", mtu)
}

func setupPod(i int) error {
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(eth0, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(podIP(i), 24))}); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(eth0); err != nil {
		return err
	}
	return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: podCIDR(i).Addr().Next().AsSlice()})
}

func addBridge(name string, addr netip.Prefix) error {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	br := &netlink.Bridge{LinkAttrs: attrs}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("bridge %s: %w", name, err)
	}
	if addr.IsValid() {
		if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: ipnet(addr)}); err != nil {
			return err
		}
	}
	return netlink.LinkSetUp(br)
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// serve runs nd's pod's line server.
func (c *cluster) serve(nd *node) {
	c.listen(nd, podPort, func(conn net.Conn) {
		r := bufio.NewReader(conn)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
			fmt.Fprintf(conn, "pod-%d saw %s %s", nd.i, host, line)
		}
	})
}

// listen serves each TCP connection to port in nd's pod with handle, which
// the connection is closed after, until the test ends.
func (c *cluster) listen(nd *node, port int, handle func(net.Conn)) {
	var ln net.Listener
	c.do(nd.pod, func() (err error) { ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); return err })
	c.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				handle(conn)
			}()
		}
	}()
}

// ask sends line from namespace ns to pod `to` on a new connection and
// returns the answer.
func ask(ns string, to int, line string, timeout time.Duration) (string, error) {
	var conn net.Conn
	dst := netip.AddrPortFrom(podIP(to), podPort).String()
	if err := netnsutil.Do(ns, func() (err error) { conn, err = net.DialTimeout("tcp", dst, timeout); return err }); err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintln(conn, line); err != nil {
		return "", err
	}
	ans, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(ans), err
}

// capture records every frame crossing node i's port on the underlay.
func (c *cluster) capture(i int) *wire {
	c.t.Helper()
	cp, err := capture.Start(c.underlay, fmt.Sprintf("node%d", i))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cp.Stop() })
	return &wire{cp}
}

type wire struct{ *capture.Capture }

// check ends the capture and reports the IPv4 packets to or from a pod
// address, whether any frame holds secret, and how many tunnel packets
// (UDP to or from wireguard.DefaultPort) crossed.
func (w *wire) check(secret string) (clear []string, leaked bool, tunnel int) {
	frames := w.Stop()
	pods := netip.MustParsePrefix("10.244.0.0/16")
	for _, f := range frames {
		p, ok := capture.IPv4(f)
		switch {
		case !ok:
		case p.Proto == unix.IPPROTO_UDP && (p.SrcPort == wireguard.DefaultPort || p.DstPort == wireguard.DefaultPort):
			tunnel++
		case pods.Contains(p.Src) || pods.Contains(p.Dst):
			clear = append(clear, fmt.Sprintf("%s > %s proto %d", p.Src, p.Dst, p.Proto))
		}
	}
	return clear, capture.Contains(frames, []byte(secret)), tunnel
}

// eventually retries ask until the answer is want; the bound only stops a
// hang.
func eventually(t testing.TB, ns string, to int, line, want string) {
	t.Helper()
	var ans string
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ans, err = ask(ns, to, line, time.Second); err == nil && ans == want {
			return
		}
	}
	t.Fatalf("from %s to pod-%d: %q, %v; want %q", ns, to, ans, err, want)
}

func TestPodTrafficCrossesTheUnderlayEncrypted(t *testing.T) {
	eachImplementation(t, func(t *testing.T, impl wireguard.Implementation) {
		c := newCluster(t, impl, 3)
		// Before encryption the routing mode carries pod traffic in clear: the
		// capture must see it, or it proves nothing afterwards.
		cp := c.capture(1)
		if ans, err := ask(c.node(1).pod, 2, "plain-before", 2*time.Second); err != nil || ans != "pod-2 saw 10.244.1.2 plain-before" {
			t.Fatalf("host-gw before encryption: %q, %v", ans, err)
		}
		if _, leaked, _ := cp.check("plain-before"); !leaked {
			t.Fatal("the capture did not see the clear payload: it cannot see a leak either")
		}

		c.sync()
		cp = c.capture(1)
		eventually(t, c.node(1).pod, 2, "secret-pod", "pod-2 saw 10.244.1.2 secret-pod")
		eventually(t, c.node(3).pod, 1, "secret-back", "pod-1 saw 10.244.3.2 secret-back")
		// The node's own traffic leaves from its podCIDR's network address on
		// the device, so the answer comes back through the tunnel too.
		eventually(t, c.node(1).ns, 2, "secret-node", "pod-2 saw 10.244.1.0 secret-node")
		for _, s := range []string{"secret-pod", "secret-back", "secret-node"} {
			clear, leaked, tunnel := cp.check(s)
			if leaked || len(clear) > 0 || tunnel == 0 {
				t.Fatalf("underlay of node-1 for %q: leaked %v, packets in clear %v, tunnel packets %d", s, leaked, clear, tunnel)
			}
		}
	})
}

func TestBadAnnotationSkipsOnlyThatPeer(t *testing.T) {
	eachImplementation(t, func(t *testing.T, impl wireguard.Implementation) {
		c := newCluster(t, impl, 3)
		// node-3 runs no encryption, and its annotation is garbage.
		c.node(3).off = true
		c.node(3).published.PublicKey = "not-a-key"
		var all []wireguard.Node
		for _, nd := range c.nodes {
			all = append(all, nd.published)
		}
		_, errs := wireguard.Compute(wireguard.Config{Self: c.node(1).published}, all)
		if len(errs) != 1 || errs[0].Node != "node-3" || !strings.Contains(errs[0].Error(), wireguard.PublicKeyAnnotation) {
			t.Fatalf("errors %v, want one naming node-3 and %s", errs, wireguard.PublicKeyAnnotation)
		}
		c.sync()
		eventually(t, c.node(1).pod, 2, "to-2", "pod-2 saw 10.244.1.2 to-2")
		// Outside strict mode node-3's pods are reached in clear (the routing
		// mode's route); in strict mode they are not reached at all.
		eventually(t, c.node(1).pod, 3, "to-3", "pod-3 saw 10.244.1.2 to-3")
		c.node(1).strict = true
		c.sync()
		if ans, err := ask(c.node(1).pod, 3, "strict", time.Second); err == nil {
			t.Fatalf("strict mode reached a node without a tunnel: %q", ans)
		}
		eventually(t, c.node(1).pod, 2, "still-2", "pod-2 saw 10.244.1.2 still-2")
		// Once node-3 publishes a good key, the tunnel carries its traffic.
		c.node(3).off = false
		c.start(c.node(3))
		c.sync()
		eventually(t, c.node(1).pod, 3, "to-3-encrypted", "pod-3 saw 10.244.1.2 to-3-encrypted")
	})
}

func TestStrictModeHoldsWhileTheDeviceIsGone(t *testing.T) {
	eachImplementation(t, func(t *testing.T, impl wireguard.Implementation) {
		c := newCluster(t, impl, 2)
		c.node(1).strict = true
		c.sync()
		eventually(t, c.node(1).pod, 2, "up", "pod-2 saw 10.244.1.2 up")
		c.do(c.node(1).ns, func() error {
			l, err := netlink.LinkByName(wireguard.DefaultDevice)
			if err != nil {
				return err
			}
			return netlink.LinkDel(l)
		})
		cp := c.capture(1)
		if ans, err := ask(c.node(1).pod, 2, "secret-gone", time.Second); err == nil {
			t.Fatalf("strict mode without the device reached the peer: %q", ans)
		}
		if clear, leaked, _ := cp.check("secret-gone"); leaked {
			t.Fatalf("strict mode without the device sent the payload in clear: %v", clear)
		}
	})
}

// TestRestartRotatesTheKey restarts node-2's side (a new process would do
// the same: the persistent device stays, a new key is made and published)
// and logs how long pod traffic was interrupted.
func TestRestartRotatesTheKey(t *testing.T) {
	eachImplementation(t, func(t *testing.T, impl wireguard.Implementation) {
		c := newCluster(t, impl, 2)
		for _, nd := range c.nodes {
			nd.strict = true
		}
		c.sync()
		eventually(t, c.node(1).pod, 2, "before", "pod-2 saw 10.244.1.2 before")
		old := c.node(2).published.PublicKey
		cp := c.capture(1)
		c.node(2).rec.Close()
		start := time.Now()
		// The new agent applies, then publishes; the others read the key.
		c.start(c.node(2))
		c.syncNode(c.node(2))
		c.sync()
		if c.node(2).published.PublicKey == old {
			t.Fatal("the restart kept the key")
		}
		eventually(t, c.node(1).pod, 2, "secret-after", "pod-2 saw 10.244.1.2 secret-after")
		t.Logf("pod traffic resumed %v after the restart", time.Since(start).Round(time.Millisecond))
		if clear, leaked, _ := cp.check("secret-after"); leaked || len(clear) > 0 {
			t.Fatalf("across the restart: leaked %v, in clear %v", leaked, clear)
		}
		// Rotation on request: the same, without a restart.
		pub, err := c.node(1).rec.Rotate()
		if err != nil {
			t.Fatal(err)
		}
		c.node(1).published.PublicKey = pub.String()
		start = time.Now()
		c.sync()
		eventually(t, c.node(1).pod, 2, "rotated", "pod-2 saw 10.244.1.2 rotated")
		t.Logf("pod traffic resumed %v after a rotation", time.Since(start).Round(time.Millisecond))
	})
}

// TestReapplyChangesNothing: a sync over the same Nodes sends the kernel no
// change to what encryption owns (its routes, rules, the device's
// addresses), so a resync never disturbs the tunnel.
func TestReapplyChangesNothing(t *testing.T) {
	eachImplementation(t, func(t *testing.T, impl wireguard.Implementation) {
		c := newCluster(t, impl, 2)
		for _, nd := range c.nodes {
			nd.strict = true
		}
		c.sync()
		var sock *nl.NetlinkSocket
		c.do(c.node(1).ns, func() (err error) {
			sock, err = nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
				unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE, unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE)
			if err == nil {
				err = sock.SetReceiveTimeout(&unix.Timeval{Sec: 10})
			}
			return err
		})
		defer sock.Close()
		c.syncNode(c.node(1))
		// A marker route, added last, ends what the sync may have sent.
		const markerProto = 0x59
		marker := &netlink.Route{Dst: ipnet(netip.MustParsePrefix("192.0.2.0/24")), Type: unix.RTN_BLACKHOLE, Protocol: markerProto}
		c.do(c.node(1).ns, func() error { return netlink.RouteAdd(marker) })
		var changes []string
		for done := false; !done; {
			msgs, _, err := sock.Receive()
			if err != nil {
				t.Fatalf("reading notifications: %v", err)
			}
			for _, m := range msgs {
				switch m.Header.Type {
				case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
					switch nl.DeserializeRtMsg(m.Data).Protocol {
					case markerProto:
						done = true
					case wireguard.RouteProtocol:
						changes = append(changes, fmt.Sprintf("route message %d", m.Header.Type))
					}
				case unix.RTM_NEWRULE, unix.RTM_DELRULE:
					changes = append(changes, fmt.Sprintf("rule message %d", m.Header.Type))
				case unix.RTM_NEWADDR, unix.RTM_DELADDR:
					if nl.DeserializeIfAddrmsg(m.Data).Scope != unix.RT_SCOPE_LINK {
						changes = append(changes, fmt.Sprintf("address message %d", m.Header.Type))
					}
				}
			}
		}
		if len(changes) > 0 {
			t.Fatalf("re-applying the same state sent %d notifications: %v", len(changes), changes)
		}
	})
}
