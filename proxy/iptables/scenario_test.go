package iptables_test

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Addresses of the shared scenario (pods a, b, c on this node, as the
// node's IPAM hands them out).
const (
	podA, podB, podC = "10.244.1.2", "10.244.1.3", "10.244.1.4"
	extIPv4          = "198.51.100.5"
)

// scenario is one set of Services and EndpointSlices covering every proxy
// feature; the packet tracer walks it and the kernel tests send traffic
// through it.
func scenario() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	local := func(ip string) endpoint { return endpoint{ip, nodeName} }
	svcs := []*corev1.Service{
		service("web", "10.96.0.10", nil),
		service("np", "10.96.0.11", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = 30080 }),
		service("local", "10.96.0.12", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30081
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}),
		service("remote-only", "10.96.0.13", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30082
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}),
		service("lb", "10.96.0.14", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30083
			s.Spec.LoadBalancerSourceRanges = []string{extIP + "/32"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}}
		}),
		service("sticky", "10.96.0.15", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }),
		service("empty", "10.96.0.16", nil),
		service("itp", "10.96.0.17", func(s *corev1.Service) {
			p := corev1.ServiceInternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = &p
		}),
		service("itp-remote", "10.96.0.18", func(s *corev1.Service) {
			p := corev1.ServiceInternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = &p
		}),
		service("extip", "10.96.0.19", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{extIPv4} }),
		service("self", "10.96.0.21", nil),
		service("dns", "10.96.0.53", func(s *corev1.Service) {
			s.Spec.Ports = []corev1.ServicePort{{Name: "dns", Port: 81, Protocol: corev1.ProtocolUDP}}
		}),
	}
	slices := []*discoveryv1.EndpointSlice{
		slice("web", local(podA), local(podB), local(podC)),
		slice("np", local(podB), local(podC)),
		slice("local", local(podC), endpoint{remoteEP, otherNode}),
		slice("remote-only", endpoint{remoteEP, otherNode}),
		slice("lb", local(podB)),
		slice("sticky", local(podA), local(podB), local(podC)),
		slice("itp", local(podA), endpoint{remoteEP, otherNode}),
		slice("itp-remote", endpoint{remoteEP, otherNode}),
		slice("extip", local(podB)),
		slice("self", local(podA)),
		udpSlice("dns", podA),
	}
	return svcs, slices
}
