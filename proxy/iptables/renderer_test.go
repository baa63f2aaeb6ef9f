package iptables_test

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
)

// TestRendererMatchesRender drives the incremental renderer through a
// series of changes delivered by the real tracker and checks, after each,
// that it renders exactly what a render from scratch does, and that its
// hairpin-set deltas add up to the set.
func TestRendererMatchesRender(t *testing.T) {
	cfg := iptables.Config{NodeName: proxytest.NodeName, NodePortIPs: []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster)}}
	svcs, slices0 := proxytest.Scenario()
	tr := model.NewTracker()
	for _, s := range svcs {
		tr.OnService(nil, s)
	}
	for _, es := range slices0 {
		tr.OnEndpointSlice(nil, es)
	}
	r := iptables.NewRenderer(cfg, 4)
	set := map[string]bool{}
	check := func(step string) {
		t.Helper()
		st, _ := tr.Snapshot()
		rs := r.Update(st)
		for _, e := range rs.HairpinRemoved {
			if !set[e] {
				t.Fatalf("%s: removed %s, which was not in the set", step, e)
			}
			delete(set, e)
		}
		for _, e := range rs.HairpinAdded {
			if set[e] {
				t.Fatalf("%s: added %s twice", step, e)
			}
			set[e] = true
		}
		got, want := iptables.Payload(rs), iptables.Payload(iptables.Render(cfg, st, 4))
		if got != want {
			t.Fatalf("%s: incremental render differs from a render from scratch:\n--- incremental\n%s\n--- scratch\n%s", step, got, want)
		}
		all := rs.Hairpin()
		if len(all) != len(set) {
			t.Fatalf("%s: deltas give %d entries, the set has %d", step, len(set), len(all))
		}
		for _, e := range all {
			if !set[e] {
				t.Fatalf("%s: %s in the set but never added", step, e)
			}
		}
	}
	check("initial")
	check("no change")

	byName := func(name string) (int, *discoveryv1.EndpointSlice) {
		for i, es := range slices0 {
			if es.Labels[discoveryv1.LabelServiceName] == name {
				return i, es
			}
		}
		t.Fatalf("no slice for %s", name)
		return 0, nil
	}
	i, web := byName("web")
	shrunk := web.DeepCopy()
	shrunk.Endpoints = shrunk.Endpoints[1:]
	tr.OnEndpointSlice(web, shrunk)
	slices0[i] = shrunk
	check("web lost an endpoint")

	tr.OnEndpointSlice(shrunk, nil)
	check("web lost its slice")
	tr.OnEndpointSlice(nil, web)
	check("web's slice is back")

	for _, s := range svcs {
		if s.Name == "np" {
			moved := s.DeepCopy()
			moved.Spec.Ports[0].NodePort = 31999
			tr.OnService(s, moved)
			check("np moved to another NodePort bucket")
			tr.OnService(moved, nil)
			check("np deleted")
		}
	}
	extra := &corev1.Service{}
	*extra = *svcs[0].DeepCopy()
	extra.Name, extra.Spec.ClusterIP, extra.Spec.ClusterIPs = "web2", "10.96.9.9", []string{"10.96.9.9"}
	tr.OnService(nil, extra)
	check("a service in a new bucket")
	tr.OnService(extra, nil)
	check("the new bucket emptied")
}
