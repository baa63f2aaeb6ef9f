package routing_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/routing"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// lab is a small cluster built from namespaces: an underlay namespace with
// a bridge, and per node a namespace attached to it by a veth (eth0), with
// a bridge weft0 holding the pod gateway and one pod namespace behind it.
type lab struct {
	t        *testing.T
	underlay string     // the underlay namespace, whose bridge port for node i is "node<i>"
	nodes    []*labNode // nodes[0] is node-1
}

type labNode struct {
	i   int
	ns  string // the node's namespace
	pod string // its pod's namespace
	rec *routing.Reconciler
}

var labSeq atomic.Int32

func newLab(t *testing.T, n int) *lab {
	t.Helper()
	if testing.Short() {
		t.Skip("kernel test: skipped with -short")
	}
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	prefix := fmt.Sprintf("rt%d", labSeq.Add(1))
	l := &lab{t: t}
	underlay := l.netns(prefix + "-underlay")
	l.underlay = underlay
	l.do(underlay, func() error { return addBridge("underlay0") })
	for i := 1; i <= n; i++ {
		nd := &labNode{i: i, rec: routing.NewReconciler(),
			ns: l.netns(fmt.Sprintf("%s-node%d", prefix, i)), pod: l.netns(fmt.Sprintf("%s-pod%d", prefix, i))}
		l.nodes = append(l.nodes, nd)
		l.do(underlay, func() error {
			return netnsutil.BridgedVeth(fmt.Sprintf("node%d", i), "underlay0", nd.ns, "eth0", underlayMTU)
		})
		l.do(nd.ns, func() error { return setupNode(i, nd.pod) })
		l.do(nd.pod, func() error { return setupPod(i) })
	}
	return l
}

// netns makes a namespace that is deleted when the test ends, pass or
// fail.
func (l *lab) netns(name string) string {
	l.t.Helper()
	path, err := netnsutil.NewNamed(name)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { _ = netnsutil.Delete(name) })
	// No DAD on the links to come: the plan's addresses are unique, and
	// tentative link-local addresses would only delay the first exchange.
	l.do(path, func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0o644)
	})
	return path
}

func (l *lab) do(ns string, fn func() error) {
	l.t.Helper()
	if err := netnsutil.Do(ns, fn); err != nil {
		l.t.Fatalf("in %s: %v", ns, err)
	}
}

func (l *lab) node(i int) *labNode { return l.nodes[i-1] }

// setupNode runs in node i's namespace: underlay addresses, forwarding,
// the pod bridge with the gateway addresses, and the pod's veth.
func setupNode(i int, podNS string) error {
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := addAddrs(eth0, netip.PrefixFrom(nodeIP4(i), underlayBits4), netip.PrefixFrom(nodeIP6(i), underlayBits6)); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(eth0); err != nil {
		return err
	}
	for _, path := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
			return err
		}
	}
	if err := addBridge("weft0"); err != nil {
		return err
	}
	br, err := netlink.LinkByName("weft0")
	if err != nil {
		return err
	}
	if err := addAddrs(br, netip.PrefixFrom(host(podCIDR4(i), 1), podCIDR4(i).Bits()),
		netip.PrefixFrom(host(podCIDR6(i), 1), podCIDR6(i).Bits())); err != nil {
		return err
	}
	return netnsutil.BridgedVeth("vpod", "weft0", podNS, "eth0", 1500)
}

// setupPod runs in pod i's namespace: addresses and default routes.
func setupPod(i int) error {
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := addAddrs(eth0, netip.PrefixFrom(host(podCIDR4(i), 2), podCIDR4(i).Bits()),
		netip.PrefixFrom(host(podCIDR6(i), 2), podCIDR6(i).Bits())); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(eth0); err != nil {
		return err
	}
	for _, gw := range []netip.Addr{host(podCIDR4(i), 1), host(podCIDR6(i), 1)} {
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			return fmt.Errorf("default route via %s: %w", gw, err)
		}
	}
	return nil
}

func addBridge(name string) error {
	off := false
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	br := &netlink.Bridge{LinkAttrs: attrs, MulticastSnooping: &off}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("bridge %s: %w", name, err)
	}
	return netlink.LinkSetUp(br)
}

// addAddrs adds addresses; IPv6 ones without DAD (they are unique by plan).
func addAddrs(l netlink.Link, ps ...netip.Prefix) error {
	for _, p := range ps {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", p, l.Attrs().Name, err)
		}
	}
	return nil
}

// variant is one way of routing: host-gw, or VXLAN over either family.
type variant struct {
	name         string
	mode         routing.Mode
	ipv6Underlay bool
}

var variants = []variant{
	{"hostgw", routing.ModeHostGW, false},
	{"vxlan", routing.ModeVXLAN, false},
	{"vxlan-over-ipv6", routing.ModeVXLAN, true},
}

func eachVariant(t *testing.T, fn func(t *testing.T, v variant)) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) { fn(t, v) })
	}
}

// config is node i's own configuration; the device MTU is left to Apply.
func (v variant) config(i int) routing.Config {
	return routing.Config{Mode: v.mode, Self: dualNode(i), VXLAN: routing.VXLANConfig{IPv6Underlay: v.ipv6Underlay}}
}

// members are the lab's nodes as the agent would see them.
func (l *lab) members(except ...int) []routing.Node {
	var ns []routing.Node
	for _, nd := range l.nodes {
		if !slices.Contains(except, nd.i) {
			ns = append(ns, dualNode(nd.i))
		}
	}
	return ns
}

// apply computes node i's state for nodes and applies it in node i.
func (l *lab) apply(v variant, i int, nodes []routing.Node) {
	l.t.Helper()
	d, errs := routing.Compute(v.config(i), nodes)
	if len(errs) > 0 {
		l.t.Fatalf("node-%d: Compute: %v", i, errs)
	}
	l.do(l.node(i).ns, func() error { return l.node(i).rec.Apply(d) })
}

// applyAll applies the full membership on every node.
func (l *lab) applyAll(v variant) {
	l.t.Helper()
	for _, nd := range l.nodes {
		l.apply(v, nd.i, l.members())
	}
}
