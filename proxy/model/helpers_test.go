package model

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ptr[T any](v T) *T { return &v }

// svc is a ClusterIP Service 10.96.0.10 with port http 80/TCP, then mods.
func svc(ns, name string, mods ...func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func withIPs(ips ...string) func(*corev1.Service) {
	return func(s *corev1.Service) {
		s.Spec.ClusterIPs = ips
		s.Spec.ClusterIP = ""
		if len(ips) > 0 {
			s.Spec.ClusterIP = ips[0]
		}
	}
}

func withPorts(ps ...corev1.ServicePort) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.Ports = slices.Clone(ps) }
}

func withType(t corev1.ServiceType) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.Type = t }
}

func spec(f func(*corev1.ServiceSpec)) func(*corev1.Service) {
	return func(s *corev1.Service) { f(&s.Spec) }
}

// slice is an EndpointSlice of service svcName ("" for no label).
func slice(ns, name, svcName string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name},
		AddressType: at,
		Ports:       ports,
		Endpoints:   eps,
	}
	if svcName != "" {
		es.Labels = map[string]string{discoveryv1.LabelServiceName: svcName}
	}
	return es
}

func eport(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(port), Protocol: ptr(corev1.ProtocolTCP)}
}

func eports(ps ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return ps }

// ep is a ready endpoint (all conditions nil) with the given addresses.
func ep(addrs ...string) discoveryv1.Endpoint { return discoveryv1.Endpoint{Addresses: addrs} }

func cond(e discoveryv1.Endpoint, ready, serving, terminating *bool) discoveryv1.Endpoint {
	e.Conditions = discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}
	return e
}

func onNode(e discoveryv1.Endpoint, node, zone string) discoveryv1.Endpoint {
	e.NodeName, e.Zone = ptr(node), ptr(zone)
	return e
}

var (
	yes = ptr(true)
	no  = ptr(false)
)

// errKey is what tests assert of an ObjectError.
type errKey struct{ Kind, Key, Field string }

func errKeys(errs []ObjectError) []errKey {
	out := make([]errKey, len(errs))
	for i, e := range errs {
		out[i] = errKey{e.Kind, e.Key, e.Field}
	}
	return out
}

// checkErrs asserts the errors' Kind, Key and Field, that each wraps one of
// the package's errors and that its message names the object and field.
func checkErrs(t *testing.T, got []ObjectError, want []errKey) {
	t.Helper()
	if !slices.Equal(errKeys(got), want) {
		t.Errorf("errors = %v\nwant     %v", got, want)
	}
	for _, e := range got {
		if !errors.Is(e, ErrInvalid) && !errors.Is(e, ErrDuplicate) && !errors.Is(e, ErrNoService) {
			t.Errorf("%v wraps none of ErrInvalid, ErrDuplicate, ErrNoService", e)
		}
	}
}

func spn(ns, name, port string, p Protocol) ServicePortName {
	return ServicePortName{Namespace: ns, Name: name, Port: port, Protocol: p}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// strs renders endpoints as IP:port strings.
func strs(eps []Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.String()
	}
	return out
}
