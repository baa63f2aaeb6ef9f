package model

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// benchObjects is a kube-proxy-benchmark-shaped cluster: n Services with
// one slice of ten endpoints each.
func benchObjects(n int) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*corev1.Service, n)
	es := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = svc("bench", name, withIPs(fmt.Sprintf("10.96.%d.%d", i/256, i%256)))
		var eps []discoveryv1.Endpoint
		for j := range 10 {
			eps = append(eps, onNode(ep(fmt.Sprintf("10.%d.%d.%d", 100+j, i/256, i%256)), fmt.Sprintf("node-%d", j), "z1"))
		}
		es[i] = slice("bench", name+"-1", name, v4, eports(eport("http", 8080)), eps...)
	}
	return svcs, es
}

func BenchmarkBuild5k(b *testing.B) {
	svcs, es := benchObjects(5000)
	for b.Loop() {
		Build(svcs, es)
	}
}

// BenchmarkTrackerOneChange is a sync after one slice changed in 5k.
func BenchmarkTrackerOneChange5k(b *testing.B) {
	svcs, es := benchObjects(5000)
	tr := NewTracker()
	for i := range svcs {
		tr.OnService(nil, svcs[i])
		tr.OnEndpointSlice(nil, es[i])
	}
	tr.Snapshot()
	for i := 0; b.Loop(); i++ {
		next := es[i%len(es)].DeepCopy()
		next.Endpoints = next.Endpoints[:9+i%2]
		tr.OnEndpointSlice(es[i%len(es)], next)
		tr.Snapshot()
	}
}
