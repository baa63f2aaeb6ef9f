package proxytest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab/workload"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/model"
)

// Node is a test's node: pods wired by the weft CNI plugin, an outside
// host, and the proxy's backend.
type Node struct {
	t       *testing.T
	Ext     string // the outside host's namespace path
	Pods    map[string]Pod
	Config  proxy.Config // what proxy.Build gets for this node
	Backend proxy.Backend
	Svcs    []*corev1.Service
	Slices  []*discoveryv1.EndpointSlice
	outside func(ns, src, url string) (workload.Reply, error)
	dialer  func(ns string) func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Pod is one pod of the node, running the lab's workload (HTTP on 80, TCP
// and UDP echo on 81), which answers with its name.
type Pod struct {
	Name, NS string
	IP, IP6  netip.Addr
}

// NewNode builds the node with the named pods and a backend of b (b.Setup
// runs first, so that everything the test creates afterwards is in the
// environment it prepares). It skips without root or with -short.
func NewNode(t *testing.T, b Backend, podNames ...string) *Node {
	t.Helper()
	return NewNodeOn(t, b, PlainUplink, podNames...)
}

// NewNodeOn is NewNode with the node's addresses on an uplink of kind k; it
// skips when the kernel cannot make that kind of link.
func NewNodeOn(t *testing.T, b Backend, k UplinkKind, podNames ...string) *Node {
	t.Helper()
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	n := &Node{t: t, Pods: map[string]Pod{}, outside: b.Outside, dialer: b.OutsideDialer, Config: proxy.Config{Mode: b.Mode, NodeName: NodeName,
		NodeIPs:      []netip.Addr{netip.MustParseAddr(NodeIP), netip.MustParseAddr(NodeIP6)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(Cluster), netip.MustParsePrefix(Cluster6)}}}
	// No eBPF pin directory of the machine's: a mode taking over the node
	// removes what the eBPF mode left there (the eBPF backend's Setup
	// points it at a bpffs of the test's).
	n.Config.BPFPinPath = filepath.Join(t.TempDir(), "bpf")
	if b.Setup != nil {
		b.Setup(t, &n.Config)
	}
	bin, err := cnitest.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	n.Ext = outside(t, k)
	rt := cnitest.NewRuntime(bin, filepath.Join(t.TempDir(), "cache"))
	list, err := cnitest.Conflist("1.1.0", "pods", map[string]any{"type": "weft", "bridge": Bridge, "mtu": 1500,
		"ipam": map[string]any{"ranges": [][]map[string]string{{{"subnet": PodCIDR}}, {{"subnet": PodCIDR6}}}, "dataDir": t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(Bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, name := range podNames {
		path, err := netnsutil.NewNamed("proxytest-" + name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netnsutil.Delete("proxytest-" + name) })
		att := cnitest.Attachment{ContainerID: name, NetNS: path, IfName: "eth0"}
		res, err := rt.Add(ctx, list, att)
		if err != nil {
			t.Fatal(err)
		}
		// A namespace's links go when the kernel gets round to it: delete
		// the pod's veth now, so that the next test can reuse its name.
		t.Cleanup(func() { _ = rt.Del(context.Background(), list, att) })
		ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
		ip6, _ := netip.AddrFromSlice(res.IPs[1].Address.IP.To16())
		n.Pods[name] = Pod{Name: name, NS: path, IP: ip, IP6: ip6}
		ready := make(chan struct{})
		go func() {
			_ = netnsutil.Do(path, func() error {
				return workload.Run(ctx, workload.Options{Name: name, HTTPAddrs: []string{":80"}, TCPEchoAddrs: []string{":81"}, UDPEchoAddrs: []string{":81"}},
					func() { close(ready) })
			})
		}()
		<-ready
	}
	n.Backend = n.NewBackend()
	t.Cleanup(func() { _ = n.Backend.Cleanup() })
	return n
}

// NewBackend builds a backend for the node as weft-proxy does; a second
// one is a restarted proxy.
func (n *Node) NewBackend() proxy.Backend {
	n.t.Helper()
	_, b, err := proxy.Build(n.Config)
	if err != nil {
		n.t.Fatal(err)
	}
	return b
}

// UplinkKind is how the node's link to the outside host carries its
// addresses.
type UplinkKind string

// The uplinks the scenarios run on. On every kind the outside host's end
// is a plain veth (a VLAN's: its VLAN device on that veth).
const (
	// PlainUplink: the addresses on the veth itself.
	PlainUplink UplinkKind = "plain"
	// BridgedUplink: the veth a port of a Linux bridge holding the
	// addresses, bridge netfilter on (a hypervisor host's br0).
	BridgedUplink UplinkKind = "bridge"
	// BondedUplink: the veth the one slave of an active-backup bond
	// holding the addresses.
	BondedUplink UplinkKind = "bond"
	// VLANUplink: the addresses on VLAN 10 over the veth.
	VLANUplink UplinkKind = "vlan"
)

// outside creates the outside host on the node network, routing the
// service, externalIP and LoadBalancer ranges via the node, over an uplink
// of kind k; it returns the host's namespace path.
func outside(t *testing.T, k UplinkKind) string {
	t.Helper()
	path, err := netnsutil.NewNamed("proxytest-ext")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete("proxytest-ext") })
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			if strings.Contains(string(out), "Unknown device type") {
				t.Skipf("this kernel cannot make a %s uplink (ip %s: %s); the VM suite runs it", k, strings.Join(args, " "), strings.TrimSpace(string(out)))
			}
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("link", "add", Uplink, "type", "veth", "peer", "name", "eth0", "netns", path)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", Uplink).Run() })
	dev, extDev := Uplink, "eth0"
	switch k {
	case PlainUplink:
	case BridgedUplink:
		dev = "upbr0"
		ip("link", "add", dev, "type", "bridge")
		ip("link", "set", Uplink, "master", dev)
		// The kernel's default once br_netfilter is loaded, and what
		// Kubernetes requires: bridged IP traffic goes through netfilter.
		for _, f := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
			if err := os.WriteFile("/proc/sys/net/bridge/"+f, []byte("1"), 0o644); err != nil {
				t.Fatalf("bridge netfilter: %v", err)
			}
		}
	case BondedUplink:
		dev = "upbond0"
		ip("link", "add", dev, "type", "bond", "mode", "active-backup")
		ip("link", "set", Uplink, "master", dev)
	case VLANUplink:
		dev, extDev = Uplink+".10", "eth0.10"
		ip("link", "add", "link", Uplink, "name", dev, "type", "vlan", "id", "10")
		ip("-n", "proxytest-ext", "link", "add", "link", "eth0", "name", extDev, "type", "vlan", "id", "10")
		ip("-n", "proxytest-ext", "link", "set", "eth0", "up")
	default:
		t.Fatalf("unknown uplink kind %q", k)
	}
	if dev != Uplink {
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", dev).Run() })
		ip("link", "set", Uplink, "up")
	}
	for _, args := range [][]string{
		{"addr", "add", NodeIP + "/24", "dev", dev},
		{"link", "set", dev, "up"},
		{"-n", "proxytest-ext", "addr", "add", ExtIP + "/24", "dev", extDev},
		{"-n", "proxytest-ext", "addr", "add", ExtIP2 + "/24", "dev", extDev},
		{"-n", "proxytest-ext", "link", "set", extDev, "up"},
		{"-n", "proxytest-ext", "route", "add", SvcCIDR, "via", NodeIP},
		{"-n", "proxytest-ext", "route", "add", LBIP + "/32", "via", NodeIP},
		{"-n", "proxytest-ext", "route", "add", ExtIPv4 + "/32", "via", NodeIP},
		// Nodes have a default route; without one, service traffic from the
		// node or through it dies at routing before the proxy's rules.
		{"route", "add", "default", "via", ExtIP},
		{"-6", "addr", "add", NodeIP6 + "/64", "dev", dev, "nodad"},
		{"-n", "proxytest-ext", "-6", "addr", "add", ExtIP6 + "/64", "dev", extDev, "nodad"},
		{"-n", "proxytest-ext", "-6", "route", "add", SvcCIDR6, "via", NodeIP6},
		{"-6", "route", "add", "default", "via", ExtIP6},
	} {
		ip(args...)
	}
	return path
}

// Sync programs the node's Services and EndpointSlices through the backend,
// as the proxier does.
func (n *Node) Sync() {
	n.t.Helper()
	st, errs := model.Build(n.Svcs, n.Slices)
	if len(errs) > 0 {
		n.t.Fatalf("building the model: %v", errs)
	}
	if err := n.Backend.Sync(st, false); err != nil {
		n.t.Fatal(err)
	}
}

// GetOutside is Get from the outside host.
func (n *Node) GetOutside(src, url string) (workload.Reply, error) {
	if n.outside != nil {
		return n.outside(n.Ext, src, url)
	}
	return Get(n.Ext, src, url)
}

// outsideDialer dials as a client of the outside host.
func (n *Node) outsideDialer() dialer {
	if n.dialer != nil {
		return n.dialer(n.Ext)
	}
	return netnsutil.Dialer(n.Ext, nil)
}

// Local is a ready endpoint for the named pod on this node.
func (n *Node) Local(name string) Endpoint { return Endpoint{n.Pods[name].IP.String(), NodeName} }

// Get fetches the workload's JSON answer from the namespace at ns ("" is
// the node), optionally from a given source address.
func Get(ns, src, url string) (workload.Reply, error) {
	var local net.Addr
	if src != "" {
		local = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	// Dropped traffic must fail fast; a connection refused fails at once.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return workload.HTTPGetVia(ctx, netnsutil.Dialer(ns, local), url)
}

// Echo is a connection to a pod's TCP echo port (81): Say sends a line and
// reads its echo, which shows the connection still goes through.
type Echo struct {
	net.Conn
	r *bufio.Reader
}

// NewEcho wraps c, a connection to an echo port.
func NewEcho(c net.Conn) *Echo { return &Echo{c, bufio.NewReader(c)} }

// Say sends msg and waits up to 2 s for its echo.
func (e *Echo) Say(msg string) error {
	_ = e.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintln(e, msg); err != nil {
		return err
	}
	_, err := e.r.ReadString('\n')
	return err
}
