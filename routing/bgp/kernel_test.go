package bgp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/internal/fsutil"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/routing/bgp"
)

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		parts := strings.Split(h, ",")
		os.Exit(runHelper(parts[0], parts[1], parts[2]))
	}
	os.Exit(netnsutil.RunTests(m))
}

// The address plan of the kernel tests: one L2 fabric 172.18.0.0/24 and
// fd00:18::/64; node i is .1i, router j (an external peer) is .j; node i's
// podCIDRs are 10.244.i.0/24 and fd00:10:244:i::/64, its "pod" is the
// first address of each, on its loopback.
var (
	clusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
	serviceCIDR  = netip.MustParsePrefix("10.96.0.0/16")
	external     = netip.MustParsePrefix("203.0.113.0/24") // announced by routers 1 and 2: ECMP
	md5Refused   = netip.MustParsePrefix("192.0.2.0/24")   // announced by router 3, whose password is wrong
	outside      = netip.MustParsePrefix("198.51.100.0/24")
	lbIP         = netip.MustParseAddr("172.20.0.10")
)

const (
	clusterASN = 64512
	routerASN  = 65000
)

func nodeName(i int) string      { return fmt.Sprintf("node-%d", i) }
func nodeIP4(i int) netip.Addr   { return netip.AddrFrom4([4]byte{172, 18, 0, byte(10 + i)}) }
func nodeIP6(i int) netip.Addr   { return netip.MustParseAddr(fmt.Sprintf("fd00:18::%d", 10+i)) }
func routerIP4(j int) netip.Addr { return netip.AddrFrom4([4]byte{172, 18, 0, byte(j)}) }
func podCIDR4(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}
func podCIDR6(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", i))
}
func podIP(p netip.Prefix) netip.Addr { return p.Addr().Next() }

// configYAML is the ConfigMap every node reads: three external peers (the
// second with the right MD5 password, the third with a wrong one), the
// import prefixes (10.0.0.0/8 wider than the pod CIDRs, which still win),
// the service CIDR and LB IPs announced.
func configYAML(dir string) string {
	return fmt.Sprintf(`asn: %d
peers:
- {name: tor1, address: %s, asn: %d, holdTimeSeconds: 9, keepaliveSeconds: 3}
- {name: tor2, address: %s, asn: %d, passwordFile: %s}
- {name: tor3, address: %s, asn: %d, passwordFile: %s}
import:
  prefixes: [203.0.113.0/24, 192.0.2.0/24, 10.0.0.0/8]
announce:
  serviceCIDRs: [%s]
  loadBalancerIPs: true
  communities:
    loadBalancerIP: ["64512:300"]
`, clusterASN, routerIP4(1), routerASN, routerIP4(2), routerASN, filepath.Join(dir, "right"),
		routerIP4(3), routerASN, filepath.Join(dir, "wrong"), serviceCIDR)
}

// worldSpec says what newWorld builds.
type worldSpec struct {
	size    int                       // nodes; 3 if zero
	routers int                       // external BGP routers on the fabric
	racks   bool                      // one subnet per node; the fabric namespace is the BGP router
	config  func(dir string) string   // the ConfigMap's config.yaml
	labels  map[int]map[string]string // node labels
	// podCIDRs are node i's own (default podCIDR4 and podCIDR6).
	podCIDRs func(i int) []netip.Prefix
	// router is router j's plan (default writeRouter's, for the tests).
	router func(j int) bgp.Plan
	// resync is the nodes' controller resync period (default the
	// controller's).
	resync time.Duration
}

type world struct {
	worldSpec
	t      testing.TB
	dir    string
	addr4  func(int) netip.Addr // node i's InternalIPs
	addr6  func(int) netip.Addr
	extra  map[int][]netip.Prefix // podCIDRs a node has besides its own
	fabric string
	nodes  map[int]*proc
	alive  map[int]bool // nodes present in the API
	ready  map[int]bool // nodes with a ready endpoint of the LB service
	rtrs   map[int]*proc
}

type proc struct {
	ns, state, status string
	cmd               *osexec.Cmd
}

// rackIP4 and rackIP6 are node i's addresses when every node is in a
// rack of its own (subnet 172.18.i.0/24, fd00:18:i::/64) behind one
// router at .1 of each.
func rackIP4(i int) netip.Addr { return netip.AddrFrom4([4]byte{172, 18, byte(i), byte(10 + i)}) }
func rackIP6(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd00:18:%d::%d", i, 10+i)) }
func rackGW4(i int) netip.Addr { return netip.AddrFrom4([4]byte{172, 18, byte(i), 1}) }
func rackGW6(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd00:18:%d::1", i)) }

// newWorld builds the spec's nodes (three by default), either on one L2
// fabric with its routers on it, or (racks) each in a subnet of its own
// behind one BGP router (the fabric namespace, a ToR), and starts their
// speakers.
func newWorld(t testing.TB, spec worldSpec) *world {
	if testing.Short() {
		t.Skip("kernel test: skipped with -short")
	}
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	if spec.size == 0 {
		spec.size = 3
	}
	if spec.podCIDRs == nil {
		spec.podCIDRs = func(i int) []netip.Prefix { return []netip.Prefix{podCIDR4(i), podCIDR6(i)} }
	}
	w := &world{worldSpec: spec, t: t, dir: t.TempDir(), addr4: nodeIP4, addr6: nodeIP6, nodes: map[int]*proc{}, rtrs: map[int]*proc{}, alive: map[int]bool{}, ready: map[int]bool{1: true}}
	racks := spec.racks
	for name, pw := range map[string]string{"right": "s3cret\n", "wrong": "guess"} {
		if err := os.WriteFile(filepath.Join(w.dir, name), []byte(pw), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	w.fabric = w.netns("bgp-fabric")
	w.do(w.fabric, func() error {
		if racks {
			return nil // the fabric is a router
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "fabric0"}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	})
	if racks {
		w.addr4, w.addr6 = rackIP4, rackIP6
	}
	for i := 1; i <= w.size; i++ {
		w.alive[i] = true
		ns := w.netns(nodeName(i))
		if racks {
			w.route(ns, i)
		} else {
			w.plug(ns, fmt.Sprintf("n%d", i), nodeIP4(i), nodeIP6(i))
		}
		w.do(ns, func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			for _, p := range []netip.Prefix{podCIDR4(i), podCIDR6(i)} {
				a := podIP(p)
				if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}); err != nil {
					return err
				}
			}
			return nil
		})
		w.nodes[i] = w.proc(ns, nodeName(i))
	}
	for j := 1; j <= spec.routers; j++ {
		ns := w.netns(fmt.Sprintf("tor%d", j))
		w.plug(ns, fmt.Sprintf("r%d", j), routerIP4(j), netip.MustParseAddr(fmt.Sprintf("fd00:18::%d", j)))
		w.rtrs[j] = w.proc(ns, fmt.Sprintf("tor%d", j))
		w.writeRouter(j)
		w.start(w.rtrs[j], "router")
	}
	if racks {
		w.rtrs[1] = w.proc(w.fabric, "tor")
		w.writeRouter(1)
		w.start(w.rtrs[1], "router")
	}
	for i := 1; i <= w.size; i++ {
		w.writeNode(i)
		w.start(w.nodes[i], "node")
	}
	return w
}

// proc is a helper named name in ns, its state file in a directory of its
// own (which it watches), its status file beside it.
func (w *world) proc(ns, name string) *proc {
	w.t.Helper()
	if err := os.Mkdir(filepath.Join(w.dir, name), 0o755); err != nil {
		w.t.Fatal(err)
	}
	return &proc{ns: ns, state: filepath.Join(w.dir, name, "state.json"), status: filepath.Join(w.dir, name+".status")}
}

func (w *world) netns(name string) string {
	w.t.Helper()
	path, err := netnsutil.NewNamed(name)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = netnsutil.Delete(name) })
	w.do(path, func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0o644)
	})
	return path
}

func (w *world) do(ns string, fn func() error) {
	w.t.Helper()
	if err := netnsutil.Do(ns, fn); err != nil {
		w.t.Fatalf("in %s: %v", ns, err)
	}
}

// route connects node i's namespace ns to the router in a subnet of its
// own, the router being its default gateway.
func (w *world) route(ns string, i int) {
	w.t.Helper()
	name := fmt.Sprintf("n%d", i)
	w.do(w.fabric, func() error {
		if err := addVeth(name, ns); err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return configure(l, netip.PrefixFrom(rackGW4(i), 24), netip.PrefixFrom(rackGW6(i), 64))
	})
	w.do(ns, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := configure(eth0, netip.PrefixFrom(rackIP4(i), 24), netip.PrefixFrom(rackIP6(i), 64)); err != nil {
			return err
		}
		for _, gw := range []netip.Addr{rackGW4(i), rackGW6(i)} {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		return nil
	})
}

// addVeth makes a veth name in the calling thread's namespace whose peer
// is eth0 in the namespace at path.
func addVeth(name, path string) error {
	target, err := os.Open(path)
	if err != nil {
		return err
	}
	defer target.Close()
	return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(target.Fd()))})
}

// configure turns forwarding on and gives link the addresses, up.
func configure(l netlink.Link, addrs ...netip.Prefix) error {
	for _, path := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
			return err
		}
	}
	for _, p := range addrs {
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}); err != nil {
			return err
		}
	}
	return netlink.LinkSetUp(l)
}

// plug connects ns to the fabric with a veth eth0 holding the addresses.
func (w *world) plug(ns, name string, ip4, ip6 netip.Addr) {
	w.t.Helper()
	w.do(w.fabric, func() error {
		if err := addVeth(name, ns); err != nil {
			return err
		}
		br, err := netlink.LinkByName("fabric0")
		if err != nil {
			return err
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	w.do(ns, func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return configure(eth0, netip.PrefixFrom(ip4, 24), netip.PrefixFrom(ip6, 64))
	})
}

func (w *world) apiNodes() []bgp.Node {
	var out []bgp.Node
	for i := 1; i <= w.size; i++ {
		if w.alive[i] {
			out = append(out, bgp.Node{Name: nodeName(i), Labels: w.labels[i], InternalIPs: []netip.Addr{w.addr4(i), w.addr6(i)}, PodCIDRs: append(w.podCIDRs(i), w.extra[i]...)})
		}
	}
	return out
}

// state is what node i's agent sees.
func (w *world) state(i int) nodeState {
	return nodeState{Self: nodeName(i), Nodes: w.apiNodes(), Config: w.config(w.dir), ClusterCIDRs: clusterCIDRs,
		Services: []bgp.Service{{Key: "default/lb", LBIPs: []netip.Addr{lbIP}, LocalOnly: true, LocalReady: w.ready[i]}}}
}

func (w *world) writeNode(i int) {
	w.t.Helper()
	w.writeJSON(w.nodes[i].state, w.state(i))
}

// writeRouter plans router j: it waits for every node to connect (router
// 3 with the password the nodes do not have) and announces what the
// import policy must refuse besides what it accepts.
func (w *world) writeRouter(j int) {
	w.t.Helper()
	if w.router != nil {
		w.writeJSON(w.rtrs[j].state, routerState{Plan: w.router(j)})
		return
	}
	me := routerIP4(j)
	p := bgp.Plan{ASN: routerASN, RouterID: me, RestartTime: 120}
	pw := map[int]string{2: "s3cret", 3: "right"}[j]
	for i := 1; i <= 3; i++ {
		local := me
		if w.racks {
			local = rackGW4(i)
		}
		p.Neighbors = append(p.Neighbors, bgp.Neighbor{Name: nodeName(i), Address: w.addr4(i), ASN: clusterASN, Local: local, Password: pw, External: true, IPv4: true, IPv6: true, Passive: true})
	}
	if w.racks {
		w.writeJSON(w.rtrs[j].state, routerState{Plan: p})
		return
	}
	announce := map[int][]netip.Prefix{
		1: {external, netip.MustParsePrefix("0.0.0.0/0"), clusterCIDRs[0], podCIDR4(2), outside, serviceCIDR},
		2: {external},
		3: {md5Refused},
	}[j]
	for _, a := range announce {
		p.Announcements = append(p.Announcements, bgp.Announcement{Prefix: a, NextHop: me, Kind: bgp.KindPodCIDR})
	}
	w.writeJSON(w.rtrs[j].state, routerState{Plan: p})
}

func (w *world) writeJSON(path string, v any) {
	w.t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		w.t.Fatal(err)
	}
	if err := fsutil.WriteFileAtomic(path, data, 0o644); err != nil {
		w.t.Fatal(err)
	}
}

// start runs a helper in p's namespace: the child forks from a thread
// inside it, so the whole process lives there.
func (w *world) start(p *proc, kind string) {
	w.t.Helper()
	cmd := helperCmd(kind, p.state, p.status)
	if w.resync != 0 {
		cmd.Env = append(cmd.Env, helperResyncEnv+"="+w.resync.String())
	}
	w.do(p.ns, cmd.Start)
	p.cmd = cmd
	w.t.Cleanup(func() { w.kill(p) })
}

func (w *world) kill(p *proc) {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Wait()
	}
	p.cmd = nil
}

func (w *world) status(p *proc) helperStatus {
	var st helperStatus
	data, err := os.ReadFile(p.status)
	if err == nil {
		_ = json.Unmarshal(data, &st)
	}
	return st
}

// routes reads weft's BGP routes in the kernel of ns.
func (w *world) routes(ns string) []bgp.Route {
	var rs []bgp.Route
	w.do(ns, func() (err error) {
		rs, err = bgp.FIB{}.List()
		return err
	})
	return rs
}

func show(rs []bgp.Route) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "%s via %v; ", r.Dst, r.NextHops)
	}
	return b.String()
}

func route(dst netip.Prefix, hops ...netip.Addr) bgp.Route {
	return bgp.Route{Dst: dst, NextHops: hops}
}

// wantRoutes waits until node i's kernel holds exactly want.
func (w *world) wantRoutes(i int, want ...bgp.Route) {
	w.t.Helper()
	slices.SortFunc(want, func(a, b bgp.Route) int { return strings.Compare(a.Dst.String(), b.Dst.String()) })
	got := ""
	ok := waitFor(60*time.Second, func() bool {
		have := w.routes(w.nodes[i].ns)
		slices.SortFunc(have, func(a, b bgp.Route) int { return strings.Compare(a.Dst.String(), b.Dst.String()) })
		got = show(have)
		return got == show(want)
	})
	if !ok {
		w.t.Fatalf("%s: weft BGP routes\n got %s\nwant %s", nodeName(i), got, show(want))
	}
}

// meshRoutes is what node i must hold when the nodes in others are alive.
func meshRoutes(others ...int) []bgp.Route {
	return append([]bgp.Route{route(external, routerIP4(1), routerIP4(2))}, nodeRoutes(others...)...)
}

// nodeRoutes are the routes to the podCIDRs of the nodes in others.
func nodeRoutes(others ...int) []bgp.Route {
	var rs []bgp.Route
	for _, j := range others {
		rs = append(rs, route(podCIDR4(j), nodeIP4(j)), route(podCIDR6(j), nodeIP6(j)))
	}
	return rs
}

// connect sends real packets: a TCP connection from node i's pod address
// to a listener on node j's, through the learned routes both ways.
func (w *world) connect(i, j int, v6 bool) error {
	src, dst := podIP(podCIDR4(i)), podIP(podCIDR4(j))
	if v6 {
		src, dst = podIP(podCIDR6(i)), podIP(podCIDR6(j))
	}
	var ln net.Listener
	w.do(w.nodes[j].ns, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(dst, 0).String())
		return err
	})
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("pong"))
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := netnsutil.Dialer(w.nodes[i].ns, &net.TCPAddr{IP: src.AsSlice()})(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "pong" {
		return fmt.Errorf("read %q: %v", got, err)
	}
	return nil
}

// ribPaths lists router j's paths to prefix by next hop.
func (w *world) ribPaths(j int, prefix netip.Prefix) []netip.Addr {
	var hops []netip.Addr
	for _, c := range w.status(w.rtrs[j]).RIB {
		if c.Prefix == prefix && !c.Local {
			hops = append(hops, c.NextHop)
		}
	}
	slices.SortFunc(hops, netip.Addr.Compare)
	return hops
}

func (w *world) wantRIB(j int, prefix netip.Prefix, want ...netip.Addr) {
	w.t.Helper()
	var got []netip.Addr
	if !waitFor(30*time.Second, func() bool {
		got = w.ribPaths(j, prefix)
		return slices.Equal(got, want)
	}) {
		w.t.Fatalf("tor%d: paths to %s via %v, want %v", j, prefix, got, want)
	}
}

func established(st helperStatus, a netip.Addr) bool { return slices.Contains(st.Established, a) }

// TestMeshAndPeers runs three nodes in a full iBGP mesh with three
// external routers on one fabric, and checks what users see: the kernel's
// routes, packets between pods, what the routers learn, node deletion,
// MD5, eTP=Local announcements and an agent restart.
func TestMeshAndPeers(t *testing.T) {
	w := newWorld(t, worldSpec{routers: 3, config: configYAML})

	t.Run("installed routes and import policy", func(t *testing.T) {
		w.t = t
		// Exactly these: no default route, no cluster or service CIDR
		// and no podCIDR from a router, nothing outside the import
		// prefixes, nothing from the router with the wrong password.
		w.wantRoutes(1, meshRoutes(2, 3)...)
		w.wantRoutes(2, meshRoutes(1, 3)...)
		w.wantRoutes(3, meshRoutes(1, 2)...)
	})

	t.Run("pods reachable across nodes", func(t *testing.T) {
		for _, v6 := range []bool{false, true} {
			for _, pair := range [][2]int{{1, 2}, {2, 3}, {3, 1}} {
				if err := w.connect(pair[0], pair[1], v6); err != nil {
					t.Errorf("%s -> %s (ipv6 %v): %v", nodeName(pair[0]), nodeName(pair[1]), v6, err)
				}
			}
		}
	})

	t.Run("routers learn each podCIDR from its node only", func(t *testing.T) {
		w.t = t
		for i := 1; i <= 3; i++ {
			w.wantRIB(1, podCIDR4(i), nodeIP4(i))
			w.wantRIB(2, podCIDR4(i), nodeIP4(i)) // over MD5
		}
		w.wantRIB(1, serviceCIDR, nodeIP4(1), nodeIP4(2), nodeIP4(3))
		lb := netip.PrefixFrom(lbIP, 32)
		w.wantRIB(1, lb, nodeIP4(1)) // only the node with a ready local endpoint
		for _, c := range w.status(w.rtrs[1]).RIB {
			if c.Prefix == lb && !slices.Equal(c.Communities, []uint32{clusterASN<<16 | 300}) {
				t.Errorf("tor1: %s carries communities %v, want 64512:300", lb, c.Communities)
			}
		}
		// Nothing a router announced comes back to another one.
		w.wantRIB(2, outside)
		if st := w.status(w.rtrs[3]); len(st.Established) != 0 {
			t.Errorf("tor3 (wrong MD5 password) has sessions with %v", st.Established)
		}
		if n := len(w.ribPaths(3, podCIDR4(1))); n != 0 {
			t.Errorf("tor3 (wrong MD5 password) learned %d paths", n)
		}
	})

	t.Run("eTP Local address follows the ready endpoints", func(t *testing.T) {
		w.t = t
		lb := netip.PrefixFrom(lbIP, 32)
		w.ready = map[int]bool{2: true}
		for i := 1; i <= 3; i++ {
			w.writeNode(i)
		}
		w.wantRIB(1, lb, nodeIP4(2))
		w.ready = map[int]bool{}
		w.writeNode(2)
		w.wantRIB(1, lb)
	})

	t.Run("restart keeps routes; a node deleted meanwhile is gone after", func(t *testing.T) {
		w.t = t
		w.kill(w.nodes[3])
		if !waitFor(30*time.Second, func() bool { return !established(w.status(w.nodes[1]), nodeIP4(3)) }) {
			t.Fatal("node-1 still has its session with the killed node-3")
		}
		// node-1 keeps node-3's routes (graceful restart), node-3's kernel
		// keeps what it learned.
		w.wantRoutes(1, meshRoutes(2, 3)...)
		w.wantRoutes(3, meshRoutes(1, 2)...)
		// node-2 is deleted from the API while node-3's agent is down;
		// node-2's agent, still running, withdraws everything.
		w.alive[2] = false
		for i := 1; i <= 3; i++ {
			w.writeNode(i)
		}
		w.wantRoutes(1, meshRoutes(3)...)
		w.wantRIB(1, podCIDR4(2))
		w.wantRIB(2, podCIDR6(2))
		if got := show(w.routes(w.nodes[3].ns)); !strings.Contains(got, podCIDR4(2).String()) {
			t.Fatalf("node-3's kernel lost node-2's route while its agent was down: %s", got)
		}
		start := time.Now()
		w.start(w.nodes[3], "node")
		w.wantRoutes(3, meshRoutes(1)...)
		t.Logf("node-3 restarted: stale route removed and routes refreshed %s after the restart", time.Since(start).Round(10*time.Millisecond))
		if err := w.connect(3, 1, false); err != nil {
			t.Errorf("node-3 -> node-1 after the restart: %v", err)
		}
	})

	t.Run("cleanup removes weft's BGP routes", func(t *testing.T) {
		w.t = t
		w.kill(w.nodes[1])
		w.do(w.nodes[1].ns, bgp.FIB{}.Cleanup)
		if rs := w.routes(w.nodes[1].ns); len(rs) != 0 {
			t.Errorf("after cleanup: %s", show(rs))
		}
	})
}

// waitFor polls cond until it holds; within only bounds a hang.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// TestRouteReflector: with node-1 the reflector, node-2 and node-3 peer
// only with it, and still route to each other's pods directly (the
// reflected path keeps the originator's next hop).
func TestRouteReflector(t *testing.T) {
	rr := func(string) string { return "routeReflectors: {nodeSelector: {rr: 'true'}}\n" }
	w := newWorld(t, worldSpec{config: rr, labels: map[int]map[string]string{1: {"rr": "true"}}})
	w.wantRoutes(1, nodeRoutes(2, 3)...)
	w.wantRoutes(2, nodeRoutes(1, 3)...)
	w.wantRoutes(3, nodeRoutes(1, 2)...)
	for _, i := range []int{2, 3} {
		// The status lags the sessions by up to 100 ms.
		var got []netip.Addr
		if !waitFor(5*time.Second, func() bool {
			got = w.status(w.nodes[i]).Established
			return slices.Equal(got, []netip.Addr{nodeIP4(1)})
		}) {
			t.Errorf("client %s has sessions with %v, want only the reflector %s", nodeName(i), got, nodeIP4(1))
		}
	}
	for _, v6 := range []bool{false, true} {
		if err := w.connect(2, 3, v6); err != nil {
			t.Errorf("node-2 -> node-3 (ipv6 %v): %v", v6, err)
		}
	}
}

// TestRacks: nodes in subnets of their own behind one ToR router, which
// each node peers with (an external peer chosen by the node's rack label)
// and which forwards along what it learns. iBGP keeps each node's address
// as next hop, which is not on-link: the route goes via the node's
// gateway towards it, and pods reach each other across racks with no
// overlay.
func TestRacks(t *testing.T) {
	torPerRack := func(string) string {
		c := "peers:\n"
		for i := 1; i <= 3; i++ {
			c += fmt.Sprintf("- {name: tor-r%d, address: %s, asn: %d, nodeSelector: {weft.dev/rack: r%d}}\n", i, rackGW4(i), routerASN, i)
		}
		return c
	}
	labels := map[int]map[string]string{}
	for i := 1; i <= 3; i++ {
		labels[i] = map[string]string{"weft.dev/rack": fmt.Sprintf("r%d", i)}
	}
	w := newWorld(t, worldSpec{racks: true, config: torPerRack, labels: labels})
	for i := 1; i <= 3; i++ {
		var want []bgp.Route
		for j := 1; j <= 3; j++ {
			if j != i {
				want = append(want, route(podCIDR4(j), rackGW4(i)), route(podCIDR6(j), rackGW6(i)))
			}
		}
		w.wantRoutes(i, want...)
	}
	// The ToR forwards pod traffic along what it learned (its routes are
	// installed before its status shows them).
	for i := 1; i <= 3; i++ {
		w.wantRIB(1, podCIDR4(i), rackIP4(i))
		w.wantRIB(1, podCIDR6(i), rackIP6(i))
	}
	for _, v6 := range []bool{false, true} {
		for _, pair := range [][2]int{{1, 2}, {3, 1}} {
			if err := w.connect(pair[0], pair[1], v6); err != nil {
				t.Errorf("%s -> %s (ipv6 %v): %v", nodeName(pair[0]), nodeName(pair[1]), v6, err)
			}
		}
	}
}

// TestResyncRepairs: a route of weft's deleted by hand comes back at the
// next resync, though nothing changed in BGP (two nodes, nothing else
// talking).
func TestResyncRepairs(t *testing.T) {
	w := newWorld(t, worldSpec{size: 2, resync: 2 * time.Second,
		config: func(string) string { return fmt.Sprintf("asn: %d\n", clusterASN) }})
	w.wantRoutes(1, nodeRoutes(2)...)
	p := podCIDR4(2)
	w.do(w.nodes[1].ns, func() error {
		return netlink.RouteDel(&netlink.Route{Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}, Protocol: bgp.RouteProtocol})
	})
	if got := show(w.routes(w.nodes[1].ns)); strings.Contains(got, p.String()) {
		t.Fatalf("node-1 still routes %s after its deletion: %s", p, got)
	}
	w.wantRoutes(1, nodeRoutes(2)...)
}
