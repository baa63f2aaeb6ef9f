package iptables

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/weftnet/weft/proxy/model"
)

// benchState is the benchmark's cluster shape: n ClusterIP Services with
// one slice of ten ready endpoints each, on other nodes.
func benchState(b *testing.B, n int) model.State {
	svcs := make([]*corev1.Service, n)
	slices := make([]*discoveryv1.EndpointSlice, n)
	ready := true
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		svcs[i] = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
			Spec: corev1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip}, Ports: []corev1.ServicePort{
				{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}}}
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4}
		port, pname, tcp := int32(8080), "http", corev1.ProtocolTCP
		es.Ports = []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &tcp}}
		for j := range 10 {
			k := i*10 + j
			node := fmt.Sprintf("peer-%d", k%100) // pods on other nodes, as in a large cluster
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{NodeName: &node,
				Addresses: []string{netip.AddrFrom4([4]byte{10, 244, byte(k >> 8), byte(k)}).String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
		}
		slices[i] = es
	}
	st, errs := model.Build(svcs, slices)
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	return st
}

type nopRunner struct{}

func (nopRunner) Restore(int, []byte) error        { return nil }
func (nopRunner) Save(int, string) ([]byte, error) { return nil, nil }
func (nopRunner) IPSet([]byte) error               { return nil }

func benchConfig() Config {
	return Config{NodeName: "n", NodePortIPs: []netip.Addr{netip.MustParseAddr("172.18.0.50")}, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
}

func BenchmarkRender10k(b *testing.B) {
	st := benchState(b, 10000)
	for b.Loop() {
		Render(benchConfig(), st, 4)
	}
}

// changeOne returns st with one service's endpoint list replaced, the way
// the tracker does it (copy on write).
func changeOne(st model.State, i int) model.State {
	next := model.State{Ports: maps.Clone(st.Ports), Endpoints: maps.Clone(st.Endpoints)}
	for name, eps := range next.Endpoints {
		eps = slices.Clone(eps)
		eps[0].Port = uint16(8000 + i%2)
		next.Endpoints[name] = eps
		break
	}
	return next
}

// BenchmarkOneChange10k is the Go side of a sync after one endpoint
// changed: render and diff against the last apply (the restore is a no-op).
func BenchmarkOneChange10k(b *testing.B) {
	st := benchState(b, 10000)
	a := &Applier{Family: 4, Runner: nopRunner{}}
	r := NewRenderer(benchConfig(), 4)
	if _, err := a.Apply(r.Update(st), true); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		st = changeOne(st, i)
		i++
		if _, err := a.Apply(r.Update(st), false); err != nil {
			b.Fatal(err)
		}
	}
}
