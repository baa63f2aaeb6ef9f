package lab

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func lbService(name string, mutate func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}}}
	if mutate != nil {
		mutate(s)
	}
	return s
}

func TestAssignLBIPs(t *testing.T) {
	pool := netip.MustParsePrefix("10.0.0.0/29") // .1 to .6
	class := "other"
	now := metav1.Now()
	svcs := []*corev1.Service{
		lbService("new", nil),
		lbService("kept", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "10.0.0.5"}}
		}),
		lbService("asked", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.0.0.1" }),
		lbService("asked-taken", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.0.0.5" }),
		lbService("asked-outside", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "10.0.0.7" }),
		lbService("clusterip", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeClusterIP }),
		lbService("classed", func(s *corev1.Service) { s.Spec.LoadBalancerClass = &class }),
		lbService("deleted", func(s *corev1.Service) { s.DeletionTimestamp = &now }),
		lbService("v6", func(s *corev1.Service) { s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv6Protocol} }),
		lbService("stale-status", func(s *corev1.Service) {
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.1"}}
		}),
	}
	got, errs := assignLBIPs(svcs, pool)
	want := map[string]string{"kept": "10.0.0.5", "asked": "10.0.0.1", "new": "10.0.0.2", "stale-status": "10.0.0.3"}
	if len(got) != len(want) {
		t.Errorf("assigned %v, want %v", got, want)
	}
	for name, ip := range want {
		if a := got[types.NamespacedName{Namespace: "ns", Name: name}]; a.String() != ip {
			t.Errorf("%s: got %v, want %s", name, a, ip)
		}
	}
	msgs := ""
	for _, err := range errs {
		msgs += err.Error() + "\n"
	}
	for _, w := range []string{"service ns/asked-taken: spec.loadBalancerIP: 10.0.0.5 is another Service's", "service ns/asked-outside: spec.loadBalancerIP: 10.0.0.7 is not in the lab's pool 10.0.0.0/29"} {
		if !strings.Contains(msgs, w) {
			t.Errorf("errors %q lack %q", msgs, w)
		}
	}

	// A full pool: the rest wait, each named.
	var many []*corev1.Service
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		many = append(many, lbService(n, nil))
	}
	got, errs = assignLBIPs(many, pool)
	if len(got) != 6 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "service ns/g: the lab's load-balancer pool 10.0.0.0/29 is exhausted") {
		t.Errorf("full pool: %v, %v", got, errs)
	}
}

func TestUsableIn(t *testing.T) {
	pool := netip.MustParsePrefix("172.18.200.0/24")
	for a, want := range map[string]bool{"172.18.200.0": false, "172.18.200.1": true, "172.18.200.254": true, "172.18.200.255": false, "172.18.201.1": false} {
		if got := usableIn(pool, netip.MustParseAddr(a)); got != want {
			t.Errorf("usableIn(%s, %s) = %v, want %v", pool, a, got, want)
		}
	}
}

func TestLBTargets(t *testing.T) {
	node := func(name, ip string, ready corev1.ConditionStatus, labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}},
		}}
	}
	nodes := []*corev1.Node{
		node("n2", "172.18.0.12", corev1.ConditionTrue, nil),
		node("n1", "172.18.0.11", corev1.ConditionTrue, nil),
		node("down", "172.18.0.13", corev1.ConditionFalse, nil),
		node("excluded", "172.18.0.14", corev1.ConditionTrue, map[string]string{excludeFromLB: ""}),
	}
	cluster := lbTargets(lbService("c", nil), nodes)
	if len(cluster) != 2 || cluster[0] != (lbTarget{"n1", netip.MustParseAddr("172.18.0.11"), AgentPort, "/healthz"}) || cluster[1].node != "n2" {
		t.Errorf("Cluster: %+v", cluster)
	}
	local := lbTargets(lbService("l", func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy, s.Spec.HealthCheckNodePort = corev1.ServiceExternalTrafficPolicyLocal, 32001
	}), nodes)
	if len(local) != 2 || local[0].port != 32001 || local[0].path != "/" {
		t.Errorf("Local: %+v", local)
	}
}
