package ipvs_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/ipvs"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// backend is the IPVS backend as the shared scenario table runs it.
var backend = proxytest.Backend{Mode: "ipvs"}

// needIPVS skips on a kernel without IPVS (the host's), where test/vm's
// TestVM runs these tests in a VM; in that VM (WEFT_VM set) a missing IPVS
// is a failure.
func needIPVS(t *testing.T) {
	t.Helper()
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		if os.Getenv("WEFT_VM") != "" {
			t.Fatalf("no IPVS in the VM's kernel: %v", err)
		}
		t.Skip("this kernel has no IPVS: test/vm's TestVM runs this test in a VM booting a kernel that has it")
	}
}

// TestScenarios runs the backend-neutral real-traffic scenario table.
func TestScenarios(t *testing.T) {
	needIPVS(t)
	proxytest.Run(t, backend)
}

// TestKernelTable programs a Service with the sh scheduler and checks the
// kernel's IPVS table, the dummy device and the glue table; a restarted
// backend changes nothing; a removed endpoint without connections goes at
// once; a port of the service address that is no service is refused;
// Cleanup leaves nothing of weft's.
func TestKernelTable(t *testing.T) {
	needIPVS(t)
	cfg := ipvs.Config{NodeName: "node-a", Scheduler: "sh", Families: []int{4}, NodePortIPs: []netip.Addr{netip.MustParseAddr("172.18.0.1")}}
	svc := proxytest.Service("web", "10.96.0.10", func(s *corev1.Service) { s.Spec.Ports = s.Spec.Ports[:1] })
	two := proxytest.Slice("web", proxytest.Endpoint{IP: "10.244.1.2", Node: "node-a"}, proxytest.Endpoint{IP: "10.244.1.3", Node: "node-a"})
	one := proxytest.Slice("web", proxytest.Endpoint{IP: "10.244.1.2", Node: "node-a"})
	state := func(es *discoveryv1.EndpointSlice) model.State {
		st, errs := model.Build([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{es})
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		return st
	}
	b, err := ipvs.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Cleanup() })
	if err := b.Sync(state(two), false); err != nil {
		t.Fatal(err)
	}
	h, err := libipvs.New("")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dests := func() []string {
		t.Helper()
		svcs, err := h.GetServices()
		if err != nil || len(svcs) != 1 || svcs[0].SchedName != "sh" || svcs[0].Port != 80 || !svcs[0].Address.Equal(net.ParseIP("10.96.0.10")) {
			t.Fatalf("IPVS holds %+v (%v), want one virtual server 10.96.0.10:80 with scheduler sh", svcs, err)
		}
		ds, err := h.GetDestinations(svcs[0])
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, d := range ds {
			out = append(out, fmt.Sprintf("%s:%d/%d", d.Address, d.Port, d.Weight))
		}
		slices.Sort(out)
		return out
	}
	if got := dests(); !slices.Equal(got, []string{"10.244.1.2:80/1", "10.244.1.3:80/1"}) {
		t.Fatalf("real servers %v", got)
	}
	// A port of a service address that is no virtual server is refused,
	// even where something on the node listens on it.
	l, err := net.Listen("tcp", ":2222")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if c, err := net.DialTimeout("tcp", "10.96.0.10:2222", time.Second); err == nil || !strings.Contains(err.Error(), "refused") {
		if c != nil {
			c.Close()
		}
		t.Fatalf("10.96.0.10:2222 (no such service port): %v, want connection refused", err)
	}
	link, err := netlink.LinkByName(ipvs.Device)
	if err != nil {
		t.Fatal(err)
	}
	if addrs, _ := netlink.AddrList(link, netlink.FAMILY_V4); len(addrs) != 1 || addrs[0].IP.String() != "10.96.0.10" {
		t.Fatalf("%s holds %v, want 10.96.0.10", ipvs.Device, addrs)
	}
	restarted, err := ipvs.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.Sync(state(two), true); err != nil {
		t.Fatal(err)
	}
	if s := restarted.LastStats; s.NetlinkOps != 2 {
		t.Fatalf("a restarted backend's sync of the same state made %d IPVS requests, want 2 (the listings)", s.NetlinkOps)
	}
	if err := restarted.Sync(state(one), false); err != nil {
		t.Fatal(err)
	}
	if got := dests(); !slices.Equal(got, []string{"10.244.1.2:80/1"}) {
		t.Fatalf("after an endpoint without connections left: %v", got)
	}
	if err := restarted.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if svcs, _ := h.GetServices(); len(svcs) != 0 {
		t.Fatalf("Cleanup left %d virtual servers", len(svcs))
	}
	if _, err := netlink.LinkByName(ipvs.Device); err == nil {
		t.Fatalf("Cleanup left %s", ipvs.Device)
	}
	if out, err := exec.Command("nft", "list", "table", "inet", ipvs.TableName).CombinedOutput(); err == nil {
		t.Fatalf("Cleanup left the glue table:\n%s", out)
	}
}

// TestNoIPVS: on a kernel without IPVS (the host's), the ipvs mode fails
// at start saying so (moby/ipvs itself would not).
func TestNoIPVS(t *testing.T) {
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		t.Skip("this kernel has IPVS")
	}
	_, _, err := proxy.Build(proxy.Config{Mode: "ipvs"})
	if err == nil || !strings.Contains(err.Error(), "no IPVS") || !strings.Contains(err.Error(), "ip_vs") {
		t.Fatalf("got %v, want an error saying the kernel has no IPVS", err)
	}
}

// TestGlueLoads loads the glue table with the shared scenario's elements
// into this kernel's nf_tables (the host's has no IPVS, but has nftables),
// then an update, through the real nft.
func TestGlueLoads(t *testing.T) {
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	nft, err := knftables.New(knftables.InetFamily, ipvs.TableName)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ipvs.Config{NodeName: proxytest.NodeName, Families: []int{4, 6}, MasqueradeBit: 14,
		NodePortIPs:  []netip.Addr{netip.MustParseAddr(proxytest.NodeIP), netip.MustParseAddr(proxytest.NodeIP6)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster), netip.MustParsePrefix(proxytest.Cluster6)}}
	b := ipvs.NewWith(cfg, nil, nft)
	svcs, sl := proxytest.Scenario()
	st, _ := model.Build(svcs, sl)
	if _, err := b.SyncGlue(ipvs.Render(cfg, st)); err != nil {
		t.Fatal(err)
	}
	st2, _ := model.Build(svcs[:3], sl[:3])
	if n, err := b.SyncGlue(ipvs.Render(cfg, st2)); err != nil || n == 0 {
		t.Fatalf("update: %d elements, %v", n, err)
	}
	out, err := exec.Command("nft", "list", "set", "inet", ipvs.TableName, "entries4").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "10.96.0.11 . tcp . 80") || strings.Contains(string(out), "10.96.0.15") {
		t.Fatalf("entries4 after the update (%v):\n%s", err, out)
	}
}
