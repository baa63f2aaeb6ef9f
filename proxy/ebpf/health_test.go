package ebpf_test

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	weftebpf "github.com/weftnet/weft/proxy/ebpf"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
)

// metricValue returns the value of the series of family name whose label
// has the given value (label "" for a series without labels), and whether
// there is one.
func metricValue(t *testing.T, c prometheus.Collector, name, label, value string) (float64, bool) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetName() == label && l.GetValue() == value
			}
			if !match {
				continue
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestReattach: a cgroup program and a tc program detached behind weft's
// back show as detached in the metrics; the next sync attaches them again
// (Services reachable again from a pod and from outside) and counts it.
func TestReattach(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a")
	n.Svcs = append(n.Svcs, proxytest.Service("web", "10.96.0.10", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
	}))
	n.Slices = append(n.Slices, proxytest.Slice("web", n.Local("a")))
	n.Sync()
	b := n.Backend.(*weftebpf.Backend)
	pin := envs[t].pin
	ingress := "tc:" + proxytest.Uplink + ":ingress"
	for _, hook := range []string{"connect4", ingress} {
		if v, ok := metricValue(t, b, "weft_ebpf_program_attached", "hook", hook); !ok || v != 1 {
			t.Fatalf("%s after the first sync: weft_ebpf_program_attached %v (present %v), want 1", hook, v, ok)
		}
	}
	up, err := net.InterfaceByName(proxytest.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"link_connect4", fmt.Sprintf("tcx_%d", up.Index)} {
		l, err := link.LoadPinnedLink(filepath.Join(pin, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.(interface{ Detach() error }).Detach(); err != nil {
			t.Fatalf("detaching %s: %v", name, err)
		}
		_ = l.Close()
	}
	for _, hook := range []string{"connect4", ingress} {
		if v, _ := metricValue(t, b, "weft_ebpf_program_attached", "hook", hook); v != 0 {
			t.Errorf("%s detached: weft_ebpf_program_attached %v, want 0", hook, v)
		}
	}
	if r, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.0.10/"); err == nil {
		t.Fatalf("the ClusterIP answered (%+v) with connect4 detached: the test detached nothing", r)
	}
	n.Sync()
	for _, hook := range []string{"connect4", ingress} {
		if v, _ := metricValue(t, b, "weft_ebpf_program_attached", "hook", hook); v != 1 {
			t.Errorf("%s after the next sync: weft_ebpf_program_attached %v, want 1", hook, v)
		}
		if v, _ := metricValue(t, b, "weft_ebpf_program_reattached_total", "hook", hook); v != 1 {
			t.Errorf("%s: weft_ebpf_program_reattached_total %v, want 1", hook, v)
		}
	}
	if r, err := proxytest.Get(n.Pods["a"].NS, "", "http://10.96.0.10/"); err != nil || r.Pod != "a" {
		t.Errorf("the ClusterIP after the next sync: %+v %v, want a", r, err)
	}
	if r, err := n.GetOutside("", "http://"+net.JoinHostPort(proxytest.NodeIP, "30080")+"/"); err != nil || r.Pod != "a" {
		t.Errorf("the NodePort from outside after the next sync: %+v %v, want a", r, err)
	}
}

// TestMapFill: the fill metrics of the maps weft writes count what the
// maps hold, and every map reports its maximum.
func TestMapFill(t *testing.T) {
	n := proxytest.NewNode(t, backend, "a", "b")
	n.Svcs = append(n.Svcs, proxytest.Service("web", "10.96.0.10", nil), proxytest.Service("other", "10.96.0.11", nil))
	n.Slices = append(n.Slices, proxytest.Slice("web", n.Local("a")), proxytest.Slice("other", n.Local("a"), n.Local("b")))
	n.Sync()
	b := n.Backend.(*weftebpf.Backend)
	pin := envs[t].pin
	check := func(step string) {
		t.Helper()
		// After the grace period (grace.go), so that the maps do not
		// change between the metric and the count.
		if err := b.Settle(); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"weft_services", "weft_backends", "weft_maglev", "weft_revnat"} {
			got, ok := metricValue(t, b, "weft_ebpf_map_entries", "map", name)
			if want := entries(t, filepath.Join(pin, name)); !ok || int(got) != want {
				t.Errorf("%s: %s: weft_ebpf_map_entries %v (present %v), the map holds %d", step, name, got, ok, want)
			}
			if max, _ := metricValue(t, b, "weft_ebpf_map_max_entries", "map", name); max <= 0 {
				t.Errorf("%s: %s: weft_ebpf_map_max_entries %v", step, name, max)
			}
		}
	}
	n.Slices[1] = proxytest.Slice("other", n.Local("b")) // the other half of its slots is written
	n.Sync()
	check("other's list rewritten")
	n.Svcs, n.Slices = n.Svcs[:len(n.Svcs)-2], n.Slices[:len(n.Slices)-2]
	n.Sync()
	check("both Services removed")
	n.Svcs = append(n.Svcs, proxytest.Service("other", "10.96.0.11", nil))
	n.Slices = append(n.Slices, proxytest.Slice("other", n.Local("b")))
	n.Sync()
	check("other back")
	// The reader sees other's new list, and nothing for a frontend that
	// is not there.
	r, err := weftebpf.OpenReader(pin)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	other := weftebpf.FrontendKey{Addr: netip.MustParseAddr("10.96.0.11"), Port: 80, Protocol: model.TCP}
	want := []netip.AddrPort{netip.AddrPortFrom(n.Pods["b"].IP, 80)}
	if got, err := r.Backends(other); err != nil || !slices.Equal(got, want) {
		t.Errorf("reader: other's backends %v %v, want %v", got, err, want)
	}
	other.Port = 82
	if got, err := r.Backends(other); err != nil || got != nil {
		t.Errorf("reader: a frontend that is not there: %v %v", got, err)
	}
}
