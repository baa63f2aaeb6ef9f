package proxytest

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
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
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	n := &Node{t: t, Pods: map[string]Pod{}, outside: b.Outside, Config: proxy.Config{Mode: b.Mode, NodeName: NodeName,
		NodeIPs:      []netip.Addr{netip.MustParseAddr(NodeIP), netip.MustParseAddr(NodeIP6)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(Cluster), netip.MustParsePrefix(Cluster6)}}}
	if b.Setup != nil {
		b.Setup(t, &n.Config)
	}
	bin, err := cnitest.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	n.Ext = outside(t)
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

// outside creates the outside host on the node network, routing the
// service, LoadBalancer and pod ranges via the node.
func outside(t *testing.T) string {
	t.Helper()
	path, err := netnsutil.NewNamed("proxytest-ext")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete("proxytest-ext") })
	for _, args := range [][]string{
		{"link", "add", "uplink0", "type", "veth", "peer", "name", "eth0", "netns", path},
		{"addr", "add", NodeIP + "/24", "dev", "uplink0"},
		{"link", "set", "uplink0", "up"},
		{"-n", "proxytest-ext", "addr", "add", ExtIP + "/24", "dev", "eth0"},
		{"-n", "proxytest-ext", "addr", "add", ExtIP2 + "/24", "dev", "eth0"},
		{"-n", "proxytest-ext", "link", "set", "eth0", "up"},
		{"-n", "proxytest-ext", "route", "add", SvcCIDR, "via", NodeIP},
		{"-n", "proxytest-ext", "route", "add", LBIP + "/32", "via", NodeIP},
		// Nodes have a default route; without one, service traffic from the
		// node or through it dies at routing before the proxy's rules.
		{"route", "add", "default", "via", ExtIP},
		{"-6", "addr", "add", NodeIP6 + "/64", "dev", "uplink0", "nodad"},
		{"-n", "proxytest-ext", "-6", "addr", "add", ExtIP6 + "/64", "dev", "eth0", "nodad"},
		{"-n", "proxytest-ext", "-6", "route", "add", SvcCIDR6, "via", NodeIP6},
		{"-6", "route", "add", "default", "via", ExtIP6},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "uplink0").Run() })
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
