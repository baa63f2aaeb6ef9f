package ipvs_test

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/ipvs"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// nodeConfig is the backend's view of the test node, dual-stack.
func nodeConfig() ipvs.Config {
	return ipvs.Config{NodeName: proxytest.NodeName, Families: []int{4, 6}, MasqueradeBit: 14,
		NodePortIPs:  []netip.Addr{netip.MustParseAddr(proxytest.NodeIP), netip.MustParseAddr(proxytest.NodeIP6)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster), netip.MustParsePrefix(proxytest.Cluster6)}}
}

func scenarioState(t testing.TB) model.State {
	t.Helper()
	svcs, slices := proxytest.Scenario()
	st, errs := model.Build(svcs, slices)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return st
}

func key(addr string, port uint16) ipvs.VSKey {
	return ipvs.VSKey{Addr: netip.MustParseAddr(addr), Proto: model.TCP, Port: port}
}

// TestRenderScenario checks the shared scenario's virtual servers and glue
// entries feature by feature, then the whole against a golden file.
func TestRenderScenario(t *testing.T) {
	d := ipvs.Render(nodeConfig(), scenarioState(t))
	dests := func(k ipvs.VSKey) []string {
		vs := d.Servers[k]
		if vs == nil {
			t.Fatalf("no virtual server %s", k)
		}
		var out []string
		for _, d := range vs.Dests {
			out = append(out, d.Addr.String())
		}
		return out
	}
	same := func(what string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	same("web ClusterIP", dests(key("10.96.0.10", 80)), []string{proxytest.PodA, proxytest.PodB, proxytest.PodC})
	same("np NodePort", dests(key(proxytest.NodeIP, 30080)), []string{proxytest.PodB, proxytest.PodC})
	same("local's ClusterIP (cluster-wide)", dests(key("10.96.0.12", 80)), []string{proxytest.PodC, proxytest.RemoteEP})
	same("local's NodePort (eTP Local)", dests(key(proxytest.NodeIP, 30081)), []string{proxytest.PodC})
	same("itp ClusterIP (iTP Local)", dests(key("10.96.0.17", 80)), []string{proxytest.PodA})
	same("empty ClusterIP (rejected by IPVS)", dests(key("10.96.0.16", 80)), nil)
	same("lb LoadBalancer IP", dests(key(proxytest.LBIP, 80)), []string{proxytest.PodB})
	same("extip externalIP", dests(key(proxytest.ExtIPv4, 80)), []string{proxytest.PodB})
	if vs := d.Servers[key("10.96.0.15", 80)]; vs.Timeout != model.DefaultAffinitySeconds || vs.Scheduler != "rr" {
		t.Errorf("sticky: timeout %d scheduler %s, want %d rr", vs.Timeout, vs.Scheduler, model.DefaultAffinitySeconds)
	}
	has := func(set []ipvs.Entry, k ipvs.VSKey) bool { return slices.Contains(set, k) }
	for _, c := range []struct {
		what string
		got  bool
	}{
		{"remote-only's NodePort dropped (eTP Local, no local endpoint)", has(d.Drop, key(proxytest.NodeIP, 30082))},
		{"itp-remote's ClusterIP dropped (iTP Local, no local endpoint)", has(d.Drop, key("10.96.0.18", 80))},
		{"remote-only's NodePort has no virtual server", d.Servers[key(proxytest.NodeIP, 30082)] == nil},
		{"empty is not dropped", !has(d.Drop, key("10.96.0.16", 80))},
		{"np's NodePort masqueraded", has(d.MasqExternal, key(proxytest.NodeIP, 30080))},
		{"local's NodePort not masqueraded", !has(d.MasqExternal, key(proxytest.NodeIP, 30081))},
		{"web's ClusterIP in the ClusterIP set", has(d.ClusterIPs, key("10.96.0.10", 80))},
		{"lb firewalled", has(d.Firewall, key(proxytest.LBIP, 80))},
		{"lb allows the outside host", slices.Contains(d.Allow, ipvs.Allowed{Entry: key(proxytest.LBIP, 80), Source: netip.MustParsePrefix(proxytest.ExtIP + "/32")})},
		{"the ClusterIP is on the device", slices.Contains(d.Addrs, netip.MustParseAddr("10.96.0.10"))},
		{"the node IP is not on the device", !slices.Contains(d.Addrs, netip.MustParseAddr(proxytest.NodeIP))},
		{"a local pod is a hairpin entry", slices.Contains(d.Hairpin, netip.MustParseAddr(proxytest.PodA))},
		{"a remote endpoint is no hairpin entry", !slices.Contains(d.Hairpin, netip.MustParseAddr(proxytest.RemoteEP))},
	} {
		if !c.got {
			t.Error(c.what)
		}
	}
	cfg := nodeConfig()
	cfg.Scheduler = "mh"
	if vs := ipvs.Render(cfg, scenarioState(t)).Servers[key("10.96.0.10", 80)]; vs.Scheduler != "mh" {
		t.Errorf("scheduler %s, want the configured mh", vs.Scheduler)
	}

	dump, err := ipvs.NewWith(nodeConfig(), nil, nil).Dump(scenarioState(t))
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "scenario.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(dump), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if dump != string(want) {
		t.Errorf("the scenario renders differently from %s (go test -update rewrites it):\n%s", golden, dump)
	}
}

// TestGlueTable loads the glue table and the scenario's elements into
// knftables' fake, which checks every set a rule or element names exists.
func TestGlueTable(t *testing.T) {
	fake := knftables.NewFake(knftables.InetFamily, ipvs.TableName)
	b := ipvs.NewWith(nodeConfig(), nil, fake)
	if _, err := b.SyncGlue(ipvs.Render(nodeConfig(), scenarioState(t))); err != nil {
		t.Fatal(err)
	}
	dump := fake.Dump()
	for _, want := range []string{
		"ip saddr != { 10.244.0.0/16 } ip daddr . meta l4proto . th dport @cluster-ips4 meta mark set meta mark or 0x4000",
		"ip6 saddr != { fd00:10:244::/56 } ip6 daddr . meta l4proto . th dport @cluster-ips6",
		"add element inet weft-ipvs drop4 { 172.18.0.1 . tcp . 30082 }",
		"add element inet weft-ipvs allow4 { 192.0.2.10 . tcp . 80 . 172.18.0.100/32 }",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("the glue table lacks %q:\n%s", want, dump)
		}
	}
	// An unchanged state writes nothing.
	if n, err := b.SyncGlue(ipvs.Render(nodeConfig(), scenarioState(t))); err != nil || n != 0 {
		t.Fatalf("a second sync of the same state wrote %d elements (%v)", n, err)
	}
}
