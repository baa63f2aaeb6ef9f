package netpoltest

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Short constructors for policies in scenario tables.

// Policy returns a policy in ns selecting podSel's pods (nil: all pods).
func Policy(ns, name string, podSel map[string]string, spec ...func(*networkingv1.NetworkPolicySpec)) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: podSel}}}
	for _, f := range spec {
		f(&p.Spec)
	}
	return p
}

// Types sets policyTypes.
func Types(t ...networkingv1.PolicyType) func(*networkingv1.NetworkPolicySpec) {
	return func(s *networkingv1.NetworkPolicySpec) { s.PolicyTypes = t }
}

// Ingress appends ingress rules.
func Ingress(r ...networkingv1.NetworkPolicyIngressRule) func(*networkingv1.NetworkPolicySpec) {
	return func(s *networkingv1.NetworkPolicySpec) {
		if s.Ingress == nil {
			s.Ingress = []networkingv1.NetworkPolicyIngressRule{}
		}
		s.Ingress = append(s.Ingress, r...)
	}
}

// Egress appends egress rules.
func Egress(r ...networkingv1.NetworkPolicyEgressRule) func(*networkingv1.NetworkPolicySpec) {
	return func(s *networkingv1.NetworkPolicySpec) {
		if s.Egress == nil {
			s.Egress = []networkingv1.NetworkPolicyEgressRule{}
		}
		s.Egress = append(s.Egress, r...)
	}
}

// From is an ingress rule.
func From(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ports}
}

// To is an egress rule.
func To(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ports}
}

// Peers lists peers.
func Peers(p ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return p }

// PodPeer selects pods of the policy's namespace.
func PodPeer(l map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: l}}
}

// NSPeer selects every pod of the namespaces labelled l.
func NSPeer(l map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: l}}
}

// NSPodPeer selects pods labelled pod in namespaces labelled ns.
func NSPodPeer(ns, pod map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: ns}, PodSelector: &metav1.LabelSelector{MatchLabels: pod}}
}

// ExprPeer selects by expressions (nil: that selector absent).
func ExprPeer(ns, pod []metav1.LabelSelectorRequirement) networkingv1.NetworkPolicyPeer {
	var p networkingv1.NetworkPolicyPeer
	if ns != nil {
		p.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: ns}
	}
	if pod != nil {
		p.PodSelector = &metav1.LabelSelector{MatchExpressions: pod}
	}
	return p
}

// BlockPeer is an ipBlock.
func BlockPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

// Port is a numeric port.
func Port(proto corev1.Protocol, port int32) networkingv1.NetworkPolicyPort {
	v := intstr.FromInt32(port)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
}

// Range is a port range.
func Range(proto corev1.Protocol, port, end int32) networkingv1.NetworkPolicyPort {
	p := Port(proto, port)
	p.EndPort = &end
	return p
}

// Named is a named port.
func Named(proto corev1.Protocol, name string) networkingv1.NetworkPolicyPort {
	v := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &v}
}

// AnyPort is every port of a protocol.
func AnyPort(proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto}
}

// L is a label map.
func L(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// Req is a label selector requirement.
func Req(key string, op metav1.LabelSelectorOperator, values ...string) []metav1.LabelSelectorRequirement {
	return []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}
}
