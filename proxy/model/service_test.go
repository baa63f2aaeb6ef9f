package model

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestBuildService runs each bad or special Service ("default/bad") next
// to a good one, which must always be built with its endpoint.
func TestBuildService(t *testing.T) {
	two := withPorts(
		corev1.ServicePort{Name: "a", Port: 80},
		corev1.ServicePort{Name: "b", Port: 81, Protocol: corev1.ProtocolUDP},
	)
	for _, tc := range []struct {
		name  string
		mods  []func(*corev1.Service)
		errs  []errKey // all of Kind Service, Key default/bad
		ports []string // port names of default/bad that are built
		check func(t *testing.T, ps []*ServicePort)
	}{
		{name: "plain", ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			p := ps[0]
			if !slices.Equal(p.ClusterIPs, addrs("10.96.0.10")) || p.Port != 80 || p.Protocol != TCP || p.NodePort != 0 ||
				p.HasExternal() || p.AffinitySeconds != 0 || p.ExternalPolicyLocal || p.InternalPolicyLocal || p.PreferClose {
				t.Errorf("port = %+v", p)
			}
		}},
		{name: "unparseable ClusterIP", mods: mods(withIPs("10.96.0.300")), errs: fields("spec.clusterIPs[0]")},
		{name: "second ClusterIP bad", mods: mods(withIPs("10.96.0.1", "nope")), errs: fields("spec.clusterIPs[1]")},
		{name: "two IPv4 ClusterIPs", mods: mods(withIPs("10.96.0.1", "10.96.0.2")), errs: fields("spec.clusterIPs[1]")},
		{name: "two IPv6 ClusterIPs", mods: mods(withIPs("fd00::1", "10.96.0.2", "fd00::2")), errs: fields("spec.clusterIPs[2]")},
		{name: "ClusterIP with zone", mods: mods(withIPs("fe80::1%eth0")), errs: fields("spec.clusterIPs[0]")},
		{name: "IPv4-mapped ClusterIP", mods: mods(withIPs("::ffff:10.96.0.1")), errs: fields("spec.clusterIPs[0]")},
		{name: "fallback to spec.clusterIP", mods: mods(spec(func(s *corev1.ServiceSpec) { s.ClusterIPs = nil; s.ClusterIP = "10.96.0.7" })),
			ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
				if !slices.Equal(ps[0].ClusterIPs, addrs("10.96.0.7")) {
					t.Errorf("ClusterIPs = %v", ps[0].ClusterIPs)
				}
			}},
		{name: "bad spec.clusterIP", mods: mods(spec(func(s *corev1.ServiceSpec) { s.ClusterIPs = nil; s.ClusterIP = "x" })), errs: fields("spec.clusterIP")},
		{name: "legacy leading zeros", mods: mods(withIPs("010.096.000.010")), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			if !slices.Equal(ps[0].ClusterIPs, addrs("10.96.0.10")) {
				t.Errorf("ClusterIPs = %v", ps[0].ClusterIPs)
			}
		}},
		{name: "headless", mods: mods(withIPs(corev1.ClusterIPNone))},
		{name: "no ClusterIP", mods: mods(withIPs())},
		{name: "ExternalName", mods: mods(withType(corev1.ServiceTypeExternalName), withIPs())},
		{name: "ExternalName with a ClusterIP", mods: mods(withType(corev1.ServiceTypeExternalName))},
		{name: "served by another proxy", mods: mods(func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other"} })},
		{name: "labelled headless", mods: mods(func(s *corev1.Service) { s.Labels = map[string]string{LabelHeadless: ""} })},
		{name: "other labels", mods: mods(func(s *corev1.Service) { s.Labels = map[string]string{"app": "web"} }), ports: []string{"http"}},
		{name: "port 0", mods: mods(two, spec(func(s *corev1.ServiceSpec) { s.Ports[0].Port = 0 })), errs: fields("spec.ports[0].port"), ports: []string{"b"}},
		{name: "port 65536", mods: mods(two, spec(func(s *corev1.ServiceSpec) { s.Ports[1].Port = 65536 })), errs: fields("spec.ports[1].port"), ports: []string{"a"}},
		{name: "protocol ICMP", mods: mods(two, spec(func(s *corev1.ServiceSpec) { s.Ports[1].Protocol = "ICMP" })), errs: fields("spec.ports[1].protocol"), ports: []string{"a"}},
		{name: "empty protocol is TCP", mods: mods(two), ports: []string{"a", "b"}, check: func(t *testing.T, ps []*ServicePort) {
			if ps[0].Protocol != TCP || ps[0].Name.Protocol != TCP || ps[1].Protocol != UDP {
				t.Errorf("protocols = %s, %s", ps[0].Name, ps[1].Name)
			}
		}},
		{name: "SCTP", mods: mods(spec(func(s *corev1.ServiceSpec) { s.Ports[0].Protocol = corev1.ProtocolSCTP })), ports: []string{"http"}},
		{name: "duplicate port name", mods: mods(two, spec(func(s *corev1.ServiceSpec) { s.Ports[1].Name, s.Ports[1].Protocol = "a", "" })),
			errs: fields("spec.ports[1].name"), ports: []string{"a"}},
		{name: "same name, other protocol", mods: mods(two, spec(func(s *corev1.ServiceSpec) { s.Ports[1].Name = "a" })), ports: []string{"a", "a"}},
		{name: "bad nodePort", mods: mods(two, withType(corev1.ServiceTypeNodePort), spec(func(s *corev1.ServiceSpec) {
			s.Ports[0].NodePort, s.Ports[1].NodePort = 70000, 30001
		})), errs: fields("spec.ports[0].nodePort"), ports: []string{"b"}, check: func(t *testing.T, ps []*ServicePort) {
			if ps[0].NodePort != 30001 || !ps[0].HasExternal() {
				t.Errorf("NodePort = %d", ps[0].NodePort)
			}
		}},
		{name: "nodePort ignored for ClusterIP", mods: mods(spec(func(s *corev1.ServiceSpec) { s.Ports[0].NodePort = 70000 })), ports: []string{"http"},
			check: func(t *testing.T, ps []*ServicePort) {
				if ps[0].NodePort != 0 {
					t.Errorf("NodePort = %d", ps[0].NodePort)
				}
			}},
		{name: "bad externalIP", mods: mods(spec(func(s *corev1.ServiceSpec) {
			s.ExternalIPs = []string{"192.0.2.1", "192.0.2.x", "2001:db8::1", "192.0.2.1"}
		})),
			errs: fields("spec.externalIPs[1]"), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
				// The IPv6 one has no IPv6 ClusterIP to serve it; the repeat is dropped.
				if !slices.Equal(ps[0].ExternalIPs, addrs("192.0.2.1")) {
					t.Errorf("ExternalIPs = %v", ps[0].ExternalIPs)
				}
			}},
		{name: "load balancer ingress", mods: mods(withType(corev1.ServiceTypeLoadBalancer), func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
				{IP: "198.51.100.1"},
				{IP: "198.51.100.2", IPMode: ptr(corev1.LoadBalancerIPModeVIP)},
				{IP: "198.51.100.3", IPMode: ptr(corev1.LoadBalancerIPModeProxy)},
				{Hostname: "lb.example.com"},
				{IP: "198.51.100.x"},
			}
		}), errs: fields("status.loadBalancer.ingress[4].ip"), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			if !slices.Equal(ps[0].LoadBalancerIPs, addrs("198.51.100.1", "198.51.100.2")) {
				t.Errorf("LoadBalancerIPs = %v", ps[0].LoadBalancerIPs)
			}
		}},
		{name: "source ranges", mods: mods(withType(corev1.ServiceTypeLoadBalancer), spec(func(s *corev1.ServiceSpec) {
			s.LoadBalancerSourceRanges = []string{" 10.0.0.0/8 ", "192.168.1.7/24", "2001:db8::/32"}
		})), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.0/24")}
			if !slices.Equal(ps[0].SourceRanges, want) {
				t.Errorf("SourceRanges = %v", ps[0].SourceRanges)
			}
		}},
		{name: "bad source range fails closed", mods: mods(withType(corev1.ServiceTypeLoadBalancer), spec(func(s *corev1.ServiceSpec) {
			s.LoadBalancerSourceRanges = []string{"10.0.0.0/8", "10.0.0.0/33", "10.0.0.0"}
		})), errs: fields("spec.loadBalancerSourceRanges[1]", "spec.loadBalancerSourceRanges[2]")},
		{name: "connections kept", mods: mods(func(s *corev1.Service) { s.Annotations = map[string]string{AnnotationResetConnections: "false"} }),
			ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
				if !ps[0].KeepConnections {
					t.Error("KeepConnections false with the annotation false")
				}
			}},
		{name: "connections reset by default", ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			if ps[0].KeepConnections {
				t.Error("KeepConnections true without the annotation")
			}
		}},
		{name: "unknown reset annotation ignored", mods: mods(func(s *corev1.Service) { s.Annotations = map[string]string{AnnotationResetConnections: "maybe"} }),
			errs: fields("metadata.annotations[" + AnnotationResetConnections + "]"), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
				if ps[0].KeepConnections {
					t.Error("KeepConnections true with an unknown value")
				}
			}},
		{name: "affinity default", mods: mods(spec(func(s *corev1.ServiceSpec) { s.SessionAffinity = corev1.ServiceAffinityClientIP })),
			ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
				if ps[0].AffinitySeconds != DefaultAffinitySeconds {
					t.Errorf("AffinitySeconds = %d", ps[0].AffinitySeconds)
				}
			}},
		{name: "affinity timeout", mods: mods(affinity(60)), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			if ps[0].AffinitySeconds != 60 {
				t.Errorf("AffinitySeconds = %d", ps[0].AffinitySeconds)
			}
		}},
		{name: "bad affinity timeout", mods: mods(affinity(0)), errs: fields("spec.sessionAffinityConfig.clientIP.timeoutSeconds")},
		{name: "traffic policies", mods: mods(withType(corev1.ServiceTypeLoadBalancer), spec(func(s *corev1.ServiceSpec) {
			s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
			s.HealthCheckNodePort = 32000
		})), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			if p := ps[0]; !p.ExternalPolicyLocal || !p.InternalPolicyLocal || p.HealthCheckNodePort != 32000 {
				t.Errorf("port = %+v", p)
			}
		}},
		{name: "bad healthCheckNodePort", mods: mods(withType(corev1.ServiceTypeLoadBalancer), spec(func(s *corev1.ServiceSpec) {
			s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.HealthCheckNodePort = -1
		})), errs: fields("spec.healthCheckNodePort"), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			if p := ps[0]; !p.ExternalPolicyLocal || p.HealthCheckNodePort != 0 {
				t.Errorf("port = %+v", p)
			}
		}},
		{name: "eTP Local ignored for ClusterIP", mods: mods(spec(func(s *corev1.ServiceSpec) {
			s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.HealthCheckNodePort = 32000
		})), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			if p := ps[0]; p.ExternalPolicyLocal || p.HealthCheckNodePort != 0 {
				t.Errorf("port = %+v", p)
			}
		}},
		{name: "eTP Local for ClusterIP with externalIPs (kube-proxy)", mods: mods(spec(func(s *corev1.ServiceSpec) {
			s.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.ExternalIPs = []string{"192.0.2.1"}
		})), ports: []string{"http"}, check: func(t *testing.T, ps []*ServicePort) {
			if p := ps[0]; !p.ExternalPolicyLocal || p.HealthCheckNodePort != 0 {
				t.Errorf("port = %+v", p)
			}
		}},
		{name: "PreferClose", mods: mods(distribution(corev1.ServiceTrafficDistributionPreferClose)), ports: []string{"http"}, check: preferClose(true, false)},
		{name: "PreferSameZone", mods: mods(distribution(corev1.ServiceTrafficDistributionPreferSameZone)), ports: []string{"http"}, check: preferClose(true, false)},
		{name: "PreferSameNode", mods: mods(distribution(corev1.ServiceTrafficDistributionPreferSameNode)), ports: []string{"http"}, check: preferClose(false, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := svc("default", "bad", tc.mods...)
			good := svc("default", "good", withIPs("10.96.0.20"))
			goodES := slice("default", "good-1", "good", discoveryv1.AddressTypeIPv4, eports(eport("http", 8080)), ep("10.244.0.5"))
			st, errs := Build([]*corev1.Service{bad, good}, []*discoveryv1.EndpointSlice{goodES})

			var want []errKey
			for _, e := range tc.errs {
				want = append(want, errKey{"Service", "default/bad", e.Field})
			}
			checkErrs(t, errs, want)

			if got := strs(st.Endpoints[spn("default", "good", "http", TCP)]); !slices.Equal(got, []string{"10.244.0.5:8080"}) {
				t.Errorf("good endpoints = %v", got)
			}
			var ps []*ServicePort
			for _, p := range bad.Spec.Ports { // in spec order
				for _, proto := range []Protocol{TCP, UDP, SCTP} {
					if sp := st.Ports[spn("default", "bad", p.Name, proto)]; sp != nil && !slices.Contains(ps, sp) {
						ps = append(ps, sp)
					}
				}
			}
			var names []string
			for _, p := range ps {
				names = append(names, p.Name.Port)
				if _, ok := st.Endpoints[p.Name]; !ok {
					t.Errorf("no Endpoints entry for %s", p.Name)
				}
			}
			if !slices.Equal(names, tc.ports) {
				t.Fatalf("ports built = %v, want %v", names, tc.ports)
			}
			if len(st.Ports) != len(ps)+1 || len(st.Endpoints) != len(st.Ports) {
				t.Errorf("state has %d ports, %d endpoint lists", len(st.Ports), len(st.Endpoints))
			}
			if tc.check != nil {
				tc.check(t, ps)
			}
		})
	}
}

func mods(m ...func(*corev1.Service)) []func(*corev1.Service) { return m }

func fields(fs ...string) []errKey {
	out := make([]errKey, len(fs))
	for i, f := range fs {
		out[i] = errKey{Field: f}
	}
	return out
}

func affinity(seconds int32) func(*corev1.Service) {
	return spec(func(s *corev1.ServiceSpec) {
		s.SessionAffinity = corev1.ServiceAffinityClientIP
		s.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(seconds)}}
	})
}

func distribution(d string) func(*corev1.Service) {
	return spec(func(s *corev1.ServiceSpec) { s.TrafficDistribution = ptr(d) })
}

func preferClose(zone, node bool) func(*testing.T, []*ServicePort) {
	return func(t *testing.T, ps []*ServicePort) {
		if ps[0].PreferClose != zone || ps[0].PreferSameNode != node {
			t.Errorf("PreferClose, PreferSameNode = %v, %v", ps[0].PreferClose, ps[0].PreferSameNode)
		}
	}
}
