package ebpf_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
)

// TestRender checks the frontends of the shared scenario: which addresses
// the socket hooks translate, to which backends, and the verdict when none.
func TestRender(t *testing.T) {
	svcs, slices := proxytest.Scenario()
	st, errs := model.Build(svcs, slices)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	cfg := ebpf.Config{NodeName: proxytest.NodeName, NodePortIPs: []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)}}
	got := ebpf.Render(cfg, st)
	key := func(addr string, port uint16, p model.Protocol) ebpf.FrontendKey {
		return ebpf.FrontendKey{Addr: netip.MustParseAddr(addr), Port: port, Protocol: p}
	}
	be := func(ip string, port uint16) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(ip), port) }
	const a, b, c, remote = proxytest.PodA, proxytest.PodB, proxytest.PodC, proxytest.RemoteEP
	cases := []struct {
		name     string
		key      ebpf.FrontendKey
		verdict  ebpf.Verdict
		backends []netip.AddrPort
	}{
		{"ClusterIP", key("10.96.0.10", 80, model.TCP), ebpf.Forward, []netip.AddrPort{be(a, 80), be(b, 80), be(c, 80)}},
		{"ClusterIP second port", key("10.96.0.10", 81, model.TCP), ebpf.Forward, []netip.AddrPort{be(a, 81), be(b, 81), be(c, 81)}},
		{"NodePort on the node address", key(proxytest.NodeIP, 30080, model.TCP), ebpf.Forward, []netip.AddrPort{be(b, 80), be(c, 80)}},
		{"eTP Local NodePort from the node: cluster-wide", key(proxytest.NodeIP, 30081, model.TCP), ebpf.Forward, []netip.AddrPort{be(c, 80), be(remote, 80)}},
		{"eTP Local NodePort without local endpoint, from the node", key(proxytest.NodeIP, 30082, model.TCP), ebpf.Forward, []netip.AddrPort{be(remote, 80)}},
		{"eTP Local ClusterIP is cluster-wide", key("10.96.0.12", 80, model.TCP), ebpf.Forward, []netip.AddrPort{be(c, 80), be(remote, 80)}},
		{"no endpoints: reject", key("10.96.0.16", 80, model.TCP), ebpf.Reject, nil},
		{"iTP Local: the local endpoint", key("10.96.0.17", 80, model.TCP), ebpf.Forward, []netip.AddrPort{be(a, 80)}},
		{"iTP Local without a local endpoint: drop", key("10.96.0.18", 80, model.TCP), ebpf.Drop, nil},
		{"externalIP", key(proxytest.ExtIPv4, 80, model.TCP), ebpf.Forward, []netip.AddrPort{be(b, 80)}},
		{"UDP", key("10.96.0.53", 81, model.UDP), ebpf.Forward, []netip.AddrPort{be(a, 81)}},
	}
	for _, tc := range cases {
		f, ok := got[tc.key]
		if !ok {
			t.Errorf("%s: no frontend %v", tc.name, tc.key)
			continue
		}
		if f.Verdict != tc.verdict || len(f.Backends) != len(tc.backends) {
			t.Errorf("%s: %+v, want verdict %d with %v", tc.name, f, tc.verdict, tc.backends)
			continue
		}
		for i := range tc.backends {
			if f.Backends[i] != tc.backends[i] {
				t.Errorf("%s: backends %v, want %v", tc.name, f.Backends, tc.backends)
				break
			}
		}
	}
	for _, absent := range []ebpf.FrontendKey{
		key(proxytest.LBIP, 80, model.TCP),   // sourceRanges: the per-packet path's job
		key("10.96.0.10", 80, model.UDP),     // TCP only
		key(proxytest.NodeIP, 80, model.TCP), // not a NodePort
	} {
		if f, ok := got[absent]; ok {
			t.Errorf("unexpected frontend %v: %+v", absent, f)
		}
	}
	if f := got[key("10.96.0.15", 80, model.TCP)]; f.AffinitySeconds == 0 {
		t.Errorf("affinity service without a timeout: %+v", f)
	}
}

// TestProbeNamesTheFlag: wrong paths fail at start, naming the flag.
func TestProbeNamesTheFlag(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		cfg  ebpf.Config
		want string
	}{
		{ebpf.Config{CgroupRoot: dir, PinPath: "/sys/fs/bpf/weft"}, "--cgroup-root " + dir + ": not a cgroup v2 directory"},
		{ebpf.Config{CgroupRoot: "", PinPath: "/sys/fs/bpf/weft"}, "--cgroup-root : not a cgroup v2 directory: not set"},
	} {
		_, err := ebpf.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
