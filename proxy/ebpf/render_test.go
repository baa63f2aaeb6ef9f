package ebpf_test

import (
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

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
		key(proxytest.LBIP, 80, model.TCP),   // sourceRanges: only the external frontend
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
	// The external frontends: the traffic policy's endpoints, masquerade
	// for eTP Cluster, sourceRanges on LoadBalancer IPs.
	ext := func(addr string, port uint16) ebpf.FrontendKey {
		return ebpf.FrontendKey{Addr: netip.MustParseAddr(addr), Port: port, Protocol: model.TCP, External: true}
	}
	ranges := []netip.Prefix{netip.MustParsePrefix(proxytest.ExtIP + "/32")}
	for _, tc := range []struct {
		name string
		key  ebpf.FrontendKey
		want ebpf.Frontend
	}{
		{"eTP Cluster NodePort", ext(proxytest.NodeIP, 30080), ebpf.Frontend{Backends: []netip.AddrPort{be(b, 80), be(c, 80)}, Masquerade: true}},
		{"eTP Local NodePort: the local endpoint, client kept", ext(proxytest.NodeIP, 30081), ebpf.Frontend{Backends: []netip.AddrPort{be(c, 80)}}},
		{"eTP Local NodePort without a local endpoint: drop", ext(proxytest.NodeIP, 30082), ebpf.Frontend{Verdict: ebpf.Drop}},
		{"LoadBalancer IP with sourceRanges", ext(proxytest.LBIP, 80), ebpf.Frontend{Backends: []netip.AddrPort{be(b, 80)}, Masquerade: true, SourceRanges: ranges}},
		{"LoadBalancer NodePort: no sourceRanges", ext(proxytest.NodeIP, 30083), ebpf.Frontend{Backends: []netip.AddrPort{be(b, 80)}, Masquerade: true}},
		{"externalIP", ext(proxytest.ExtIPv4, 80), ebpf.Frontend{Backends: []netip.AddrPort{be(b, 80)}, Masquerade: true}},
	} {
		f, ok := got[tc.key]
		f.Service = model.ServicePortName{}
		if !ok || !reflect.DeepEqual(f, tc.want) {
			t.Errorf("%s: %v %+v, want %+v", tc.name, ok, f, tc.want)
		}
	}
	for _, absent := range []ebpf.FrontendKey{ext("10.96.0.10", 80), ext(proxytest.NodeIP, 80)} {
		if f, ok := got[absent]; ok {
			t.Errorf("unexpected external frontend %v: %+v", absent, f)
		}
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

// TestRendererMatchesRender drives the incremental renderer through
// changes delivered by the real tracker and checks after each that it
// gives what Render gives from scratch, and that every frontend that
// differs from the previous step is reported dirty.
func TestRendererMatchesRender(t *testing.T) {
	cfg := ebpf.Config{NodeName: proxytest.NodeName, NodePortIPs: []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)}}
	svcs, slices := proxytest.Scenario()
	tr := model.NewTracker()
	for _, s := range svcs {
		tr.OnService(nil, s)
	}
	for _, es := range slices {
		tr.OnEndpointSlice(nil, es)
	}
	r := ebpf.NewRenderer(cfg)
	prev := map[ebpf.FrontendKey]ebpf.Frontend{}
	check := func(step string) {
		t.Helper()
		st, _ := tr.Snapshot()
		got, dirty := r.Update(st)
		want := ebpf.Render(cfg, st)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: incremental render differs from Render:\n got %v\nwant %v", step, got, want)
		}
		for k, f := range want {
			if p, ok := prev[k]; (!ok || !reflect.DeepEqual(p, f)) && !dirty[k] {
				t.Fatalf("%s: %v changed but is not dirty", step, k)
			}
		}
		for k := range prev {
			if _, ok := want[k]; !ok && !dirty[k] {
				t.Fatalf("%s: %v went but is not dirty", step, k)
			}
		}
		prev = maps.Clone(want)
	}
	check("initial")
	find := func(name string) *corev1.Service {
		for _, s := range svcs {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no service %s", name)
		return nil
	}
	// An endpoint joins web.
	tr.OnEndpointSlice(slices[0], proxytest.Slice("web", proxytest.Endpoint{IP: proxytest.PodA, Node: proxytest.NodeName}))
	check("web shrinks")
	// A second Service claims extip's externalIP and port: the first in
	// name order keeps it; when it goes, the other takes over.
	claim := proxytest.Service("aaa-extip", "10.96.0.30", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{proxytest.ExtIPv4} })
	tr.OnService(nil, claim)
	tr.OnEndpointSlice(nil, proxytest.Slice("aaa-extip", proxytest.Endpoint{IP: proxytest.PodC, Node: proxytest.NodeName}))
	check("conflicting externalIP added")
	tr.OnService(claim, nil)
	check("conflicting externalIP removed")
	// A Service goes, another loses its endpoints.
	tr.OnService(find("np"), nil)
	check("np removed")
	tr.OnEndpointSlice(slices[4], nil)
	check("lb without endpoints")
	// Hundreds of Services at once (rendered on every CPU), a hundred of
	// them claiming extip's externalIP and port; then they go.
	var many []*corev1.Service
	for i := range 600 {
		name := fmt.Sprintf("many-%03d", i)
		s := proxytest.Service(name, fmt.Sprintf("10.97.%d.%d", i/200, i%200+1), func(s *corev1.Service) {
			if i%6 == 0 {
				s.Spec.ExternalIPs = []string{proxytest.ExtIPv4}
			}
		})
		many = append(many, s)
		tr.OnService(nil, s)
		tr.OnEndpointSlice(nil, proxytest.Slice(name, proxytest.Endpoint{IP: proxytest.PodC, Node: proxytest.NodeName}))
	}
	check("600 Services added")
	for _, s := range many {
		tr.OnService(s, nil)
	}
	check("600 Services removed")
}
