package iptables_test

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab/workload"
	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/model"
)

// The address plan of the proxy's kernel tests: the test process is a node
// (172.18.0.1 on the node network, pods on 10.244.1.0/24 behind a bridge);
// an outside host has 172.18.0.100 and .101; services live in 10.96.0.0/16.
const (
	nodeName  = "node-a"
	otherNode = "node-b"
	podCIDR   = "10.244.1.0/24"
	podCIDR6  = "fd00:10:244:1::/64"
	cluster6  = "fd00:10:244::/56"
	nodeIP6   = "fd00:18::1"
	extIP6    = "fd00:18::100"
	svcCIDR6  = "fd00:96::/112"
	cluster   = "10.244.0.0/16"
	remoteEP  = "10.244.2.9" // an endpoint on another node
	nodeIP    = "172.18.0.1"
	extIP     = "172.18.0.100"
	extIP2    = "172.18.0.101"
	lbIP      = "192.0.2.10"
	svcCIDR   = "10.96.0.0/16"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// node is the test's node: pods wired by the weft CNI plugin, an outside
// host, and the proxy's backend.
type node struct {
	t       *testing.T
	ext     string // the outside host's namespace path
	pods    map[string]pod
	backend *iptables.Backend
	svcs    []*corev1.Service
	slices  []*discoveryv1.EndpointSlice
}

type pod struct {
	name, ns string
	ip, ip6  netip.Addr
}

func newNode(t *testing.T, podNames ...string) *node {
	t.Helper()
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	bin, err := cnitest.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, pods: map[string]pod{}}
	n.ext = outside(t)
	rt := cnitest.NewRuntime(bin, filepath.Join(t.TempDir(), "cache"))
	list, err := cnitest.Conflist("1.1.0", "pods", map[string]any{"type": "weft", "bridge": "wproxy0", "mtu": 1500,
		"ipam": map[string]any{"ranges": [][]map[string]string{{{"subnet": podCIDR}}, {{"subnet": podCIDR6}}}, "dataDir": t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName("wproxy0"); err == nil {
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
		res, err := rt.Add(ctx, list, cnitest.Attachment{ContainerID: name, NetNS: path, IfName: "eth0"})
		if err != nil {
			t.Fatal(err)
		}
		ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
		ip6, _ := netip.AddrFromSlice(res.IPs[1].Address.IP.To16())
		n.pods[name] = pod{name: name, ns: path, ip: ip, ip6: ip6}
		ready := make(chan struct{})
		go func() {
			_ = netnsutil.Do(path, func() error {
				return workload.Run(ctx, workload.Options{Name: name, HTTPAddrs: []string{":80"}, TCPEchoAddrs: []string{":81"}, UDPEchoAddrs: []string{":81"}},
					func() { close(ready) })
			})
		}()
		<-ready
	}
	n.backend = iptables.New(nodeConfig(), []int{4, 6}, iptables.Exec{})
	t.Cleanup(func() { _ = n.backend.Cleanup() })
	return n
}

// nodeConfig is the renderer's view of the test node, dual-stack.
func nodeConfig() iptables.Config {
	return iptables.Config{NodeName: nodeName,
		NodePortIPs:  []netip.Addr{netip.MustParseAddr(nodeIP), netip.MustParseAddr(nodeIP6)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(cluster), netip.MustParsePrefix(cluster6)}}
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
		{"addr", "add", nodeIP + "/24", "dev", "uplink0"},
		{"link", "set", "uplink0", "up"},
		{"-n", "proxytest-ext", "addr", "add", extIP + "/24", "dev", "eth0"},
		{"-n", "proxytest-ext", "addr", "add", extIP2 + "/24", "dev", "eth0"},
		{"-n", "proxytest-ext", "link", "set", "eth0", "up"},
		{"-n", "proxytest-ext", "route", "add", svcCIDR, "via", nodeIP},
		{"-n", "proxytest-ext", "route", "add", lbIP + "/32", "via", nodeIP},
		// Nodes have a default route; without one, service traffic from the
		// node or through it dies at routing before the proxy's rules.
		{"route", "add", "default", "via", extIP},
		{"-6", "addr", "add", nodeIP6 + "/64", "dev", "uplink0", "nodad"},
		{"-n", "proxytest-ext", "-6", "addr", "add", extIP6 + "/64", "dev", "eth0", "nodad"},
		{"-n", "proxytest-ext", "-6", "route", "add", svcCIDR6, "via", nodeIP6},
		{"-6", "route", "add", "default", "via", extIP6},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "uplink0").Run() })
	return path
}

// sync programs the current services through the backend, as the proxier does.
func (n *node) sync() iptables.Stats {
	n.t.Helper()
	st, errs := model.Build(n.svcs, n.slices)
	if len(errs) > 0 {
		n.t.Fatalf("building the model: %v", errs)
	}
	if err := n.backend.Sync(st, false); err != nil {
		n.t.Fatal(err)
	}
	return n.backend.LastStats[0]
}

// get fetches the workload's JSON answer from the namespace at ns ("" is
// the node), optionally from a given source address.
func get(ns, src, url string) (workload.Reply, error) {
	var local net.Addr
	if src != "" {
		local = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	// Dropped traffic must fail fast; a connection refused fails at once.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return workload.HTTPGetVia(ctx, netnsutil.Dialer(ns, local), url)
}

func service(name, clusterIP string, mutate func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, {Name: "echo", Port: 81, Protocol: corev1.ProtocolTCP}},
		},
	}
	if mutate != nil {
		mutate(s)
	}
	return s
}

// endpoint is a ready endpoint on a node.
type endpoint struct{ ip, node string }

func slice(svc string, eps ...endpoint) *discoveryv1.EndpointSlice {
	http, echo, tcp := "http", "echo", corev1.ProtocolTCP
	p80, p81 := int32(80), int32(81)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &http, Port: &p80, Protocol: &tcp}, {Name: &echo, Port: &p81, Protocol: &tcp}},
	}
	for _, e := range eps {
		ready := true
		node := e.node
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	return es
}

func (n *node) local(name string) endpoint { return endpoint{n.pods[name].ip.String(), nodeName} }
