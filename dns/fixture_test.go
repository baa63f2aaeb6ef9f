package dns

import (
	"fmt"
	"net/netip"

	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The address plan of these tests: services 10.96.0.0/16 (fd00:10:96::/112),
// pods 10.244.0.0/16 (fd00:10:244::/64).
var (
	svcNet  = netip.MustParsePrefix("10.96.0.0/16")
	svcNet6 = netip.MustParsePrefix("fd00:10:96::/112")
	podNet  = netip.MustParsePrefix("10.244.0.0/16")
	podNet6 = netip.MustParsePrefix("fd00:10:244::/64")
)

// nth is the n-th address of p.
func nth(p netip.Prefix, n int) netip.Addr {
	a := p.Addr()
	for range n {
		a = a.Next()
	}
	return a
}

func ptr[T any](v T) *T { return &v }

type port struct {
	name  string
	port  int32
	proto corev1.Protocol
}

func service(ns, name string, ips []netip.Addr, ports ...port) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	for _, ip := range ips {
		s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, ip.String())
	}
	if len(ips) > 0 {
		s.Spec.ClusterIP = ips[0].String()
	}
	for _, p := range ports {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: p.name, Port: p.port, Protocol: p.proto})
	}
	return s
}

func headless(ns, name string, ports ...port) *corev1.Service {
	s := service(ns, name, nil, ports...)
	s.Spec.ClusterIP = corev1.ClusterIPNone
	s.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
	return s
}

type endpoint struct {
	addr     netip.Addr
	hostname string
	ready    bool
}

func slice(ns, svc, name string, ports []port, eps ...endpoint) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	if len(eps) > 0 && eps[0].addr.Is6() {
		s.AddressType = discoveryv1.AddressTypeIPv6
	}
	for _, p := range ports {
		proto := p.proto
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr(p.name), Port: ptr(p.port), Protocol: ptr(proto)})
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{Addresses: []string{e.addr.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(e.ready)}}
		if e.hostname != "" {
			ep.Hostname = ptr(e.hostname)
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func pod(ns, name string, ready bool, ips ...netip.Addr) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	p.Status.Phase = corev1.PodRunning
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0].String()
	}
	return p
}

func rev(a netip.Addr) string {
	r, err := mdns.ReverseAddr(a.String())
	if err != nil {
		panic(fmt.Sprint(a, err))
	}
	return r
}

// fixture is the cluster state the spec table asks about.
func fixture(x *Index) {
	x.OnService(nil, service("default", "web", []netip.Addr{nth(svcNet, 10), nth(svcNet6, 10)},
		port{"http", 80, corev1.ProtocolTCP}, port{"dns", 53, corev1.ProtocolUDP}, port{"", 8080, corev1.ProtocolTCP}))
	x.OnService(nil, service("prod", "api", []netip.Addr{nth(svcNet, 20)}, port{"grpc", 9000, corev1.ProtocolTCP}))

	x.OnService(nil, headless("default", "db", port{"pg", 5432, corev1.ProtocolTCP}))
	x.OnEndpointSlice(nil, slice("default", "db", "db-a", []port{{"pg", 5432, ""}},
		endpoint{nth(podNet, 1*256+5), "db-0", true},
		endpoint{nth(podNet, 2*256+6), "", true},
		endpoint{nth(podNet, 2*256+7), "db-2", false}))
	x.OnEndpointSlice(nil, slice("default", "db", "db-b", []port{{"pg", 5432, ""}},
		endpoint{nth(podNet6, 5), "db-0", true}))

	notReady := headless("default", "peers", port{"gossip", 7000, corev1.ProtocolUDP})
	notReady.Spec.PublishNotReadyAddresses = true
	x.OnService(nil, notReady)
	x.OnEndpointSlice(nil, slice("default", "peers", "peers-a", []port{{"gossip", 7000, corev1.ProtocolUDP}},
		endpoint{nth(podNet, 3*256+9), "p-0", false}))

	x.OnService(nil, headless("default", "empty"))
	x.OnEndpointSlice(nil, slice("default", "empty", "empty-a", nil, endpoint{nth(podNet, 4*256+1), "", false}))

	ext := service("default", "search", nil)
	ext.Spec.Type = corev1.ServiceTypeExternalName
	ext.Spec.ExternalName = "web.default.svc.cluster.local"
	x.OnService(nil, ext)

	// A pod that names itself under the headless service "db".
	sub := pod("default", "worker", true, nth(podNet, 5*256+3))
	sub.Spec.Hostname, sub.Spec.Subdomain = "worker-1", "db"
	x.OnPod(nil, sub)
	x.OnPod(nil, pod("default", "client", true, nth(podNet, 1*256+20)))
	x.OnPod(nil, pod("prod", "v6", true, nth(podNet, 2*256+30), nth(podNet6, 30)))
	x.SetSynced()
}
