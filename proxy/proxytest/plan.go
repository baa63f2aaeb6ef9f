package proxytest

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The address plan of the proxy's kernel tests: the test process is a node
// (172.18.0.1 on the node network, pods on 10.244.1.0/24 behind a bridge);
// an outside host has 172.18.0.100 and .101; services live in 10.96.0.0/16.
const (
	NodeName  = "node-a"
	OtherNode = "node-b"
	PodCIDR   = "10.244.1.0/24"
	PodCIDR6  = "fd00:10:244:1::/64"
	Cluster6  = "fd00:10:244::/56"
	NodeIP6   = "fd00:18::1"
	ExtIP6    = "fd00:18::100"
	SvcCIDR6  = "fd00:96::/112"
	Cluster   = "10.244.0.0/16"
	RemoteEP  = "10.244.2.9" // an endpoint on another node
	NodeIP    = "172.18.0.1"
	ExtIP     = "172.18.0.100"
	ExtIP2    = "172.18.0.101"
	LBIP      = "192.0.2.10"
	SvcCIDR   = "10.96.0.0/16"
	// Pods a, b, c of the shared scenario, as the node's IPAM hands them out.
	PodA, PodB, PodC = "10.244.1.2", "10.244.1.3", "10.244.1.4"
	ExtIPv4          = "198.51.100.5" // the externalIP of service extip
	// Bridge is the node's pod bridge (the CNI plugin's), Uplink the
	// node's link to the outside host.
	Bridge, Uplink = "wproxy0", "uplink0"
)

// Scenario is one set of Services and EndpointSlices covering every proxy
// feature; the iptables packet tracer walks it and the kernel scenarios
// send traffic through it.
func Scenario() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	local := func(ip string) Endpoint { return Endpoint{ip, NodeName} }
	remote := Endpoint{RemoteEP, OtherNode}
	nodePort := func(port int32, local bool) func(*corev1.Service) {
		return func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = port
			if local {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}
		}
	}
	internalLocal := func(s *corev1.Service) {
		p := corev1.ServiceInternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &p
	}
	svcs := []*corev1.Service{
		Service("web", "10.96.0.10", nil),
		Service("np", "10.96.0.11", nodePort(30080, false)),
		Service("local", "10.96.0.12", nodePort(30081, true)),
		Service("remote-only", "10.96.0.13", nodePort(30082, true)),
		Service("lb", "10.96.0.14", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30083
			s.Spec.LoadBalancerSourceRanges = []string{ExtIP + "/32"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: LBIP}}
		}),
		Service("sticky", "10.96.0.15", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }),
		Service("empty", "10.96.0.16", nil),
		Service("itp", "10.96.0.17", internalLocal),
		Service("itp-remote", "10.96.0.18", internalLocal),
		Service("extip", "10.96.0.19", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{ExtIPv4} }),
		Service("self", "10.96.0.21", nil),
		Service("dns", "10.96.0.53", func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 81, Protocol: corev1.ProtocolUDP}}
		}),
	}
	slices := []*discoveryv1.EndpointSlice{
		Slice("web", local(PodA), local(PodB), local(PodC)),
		Slice("np", local(PodB), local(PodC)),
		Slice("local", local(PodC), remote),
		Slice("remote-only", remote),
		Slice("lb", local(PodB)),
		Slice("sticky", local(PodA), local(PodB), local(PodC)),
		Slice("itp", local(PodA), remote),
		Slice("itp-remote", remote),
		Slice("extip", local(PodB)),
		Slice("self", local(PodA)),
		UDPSlice("dns", PodA),
	}
	return svcs, slices
}

// Service is a ClusterIP Service in namespace default with TCP ports http
// (80) and echo (81), changed by mutate when it is not nil.
func Service(name, clusterIP string, mutate func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}, {Name: "echo", Port: 81, Protocol: corev1.ProtocolTCP}},
		},
	}
	if mutate != nil {
		mutate(s)
	}
	return s
}

// Endpoint is a ready endpoint on a node.
type Endpoint struct{ IP, Node string }

// Slice is the IPv4 EndpointSlice of a Service made by Service (ports http
// and echo), with ready endpoints.
func Slice(svc string, eps ...Endpoint) *discoveryv1.EndpointSlice {
	http, echo, tcp := "http", "echo", corev1.ProtocolTCP
	p80, p81 := int32(80), int32(81)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &http, Port: &p80, Protocol: &tcp}, {Name: &echo, Port: &p81, Protocol: &tcp}},
	}
	for _, e := range eps {
		ready := true
		node := e.Node
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.IP}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	return es
}

// UDPSlice is the EndpointSlice of a Service with one UDP port dns (81),
// with ready endpoints on this node.
func UDPSlice(svc string, ips ...string) *discoveryv1.EndpointSlice {
	es := Slice(svc)
	name, udp, port := "dns", corev1.ProtocolUDP, int32(81)
	es.Ports = []discoveryv1.EndpointPort{{Name: &name, Protocol: &udp, Port: &port}}
	for _, ip := range ips {
		ready, node := true, NodeName
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	return es
}
