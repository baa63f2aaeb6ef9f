package netpoltest

import (
	"fmt"
	"math/rand/v2"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Random returns a random set of 1 to 4 valid policies over the bed w
// (whose pods must have addresses), mixing every feature the API has.
func Random(r *rand.Rand, w *World) []*networkingv1.NetworkPolicy {
	n := 1 + r.IntN(4)
	var out []*networkingv1.NetworkPolicy
	for i := range n {
		ns := pick(r, NamespaceNames)
		p := Policy(ns, fmt.Sprintf("random-%d", i), nil)
		p.Spec.PodSelector = randomSelector(r, PodLabel, PodNames)
		switch r.IntN(4) {
		case 0: // defaulted types
		case 1:
			p.Spec.PolicyTypes = []networkingv1.PolicyType{ing}
		case 2:
			p.Spec.PolicyTypes = []networkingv1.PolicyType{egr}
		default:
			p.Spec.PolicyTypes = []networkingv1.PolicyType{ing, egr}
		}
		for range r.IntN(3) {
			p.Spec.Ingress = append(p.Spec.Ingress, From(randomPeers(r, w), randomPorts(r)...))
		}
		for range r.IntN(3) {
			p.Spec.Egress = append(p.Spec.Egress, To(randomPeers(r, w), randomPorts(r)...))
		}
		out = append(out, p)
	}
	return out
}

func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

func randomSelector(r *rand.Rand, key string, values []string) metav1.LabelSelector {
	switch r.IntN(4) {
	case 0:
		return metav1.LabelSelector{}
	case 1, 2:
		return metav1.LabelSelector{MatchLabels: L(key, pick(r, values))}
	default:
		ops := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn}
		return metav1.LabelSelector{MatchExpressions: Req(key, pick(r, ops), pick(r, values), pick(r, values))}
	}
}

func randomPeers(r *rand.Rand, w *World) []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for range r.IntN(3) {
		switch r.IntN(4) {
		case 0:
			s := randomSelector(r, PodLabel, PodNames)
			out = append(out, networkingv1.NetworkPolicyPeer{PodSelector: &s})
		case 1:
			s := randomSelector(r, NSLabel, NamespaceNames)
			out = append(out, networkingv1.NetworkPolicyPeer{NamespaceSelector: &s})
		case 2:
			s, t := randomSelector(r, NSLabel, NamespaceNames), randomSelector(r, PodLabel, PodNames)
			out = append(out, networkingv1.NetworkPolicyPeer{NamespaceSelector: &s, PodSelector: &t})
		default:
			p := pick(r, w.Pods)
			if r.IntN(2) == 0 {
				out = append(out, BlockPeer(IP(p).String()+"/32"))
			} else {
				out = append(out, BlockPeer(ClusterCIDR, IP(p).String()+"/32"))
			}
		}
	}
	return out
}

func randomPorts(r *rand.Rand) []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for range r.IntN(3) {
		proto := pick(r, Protocols)
		switch r.IntN(5) {
		case 0:
			out = append(out, Port(proto, pick(r, Ports)))
		case 1:
			out = append(out, Named(proto, PortName(pick(r, Ports), pick(r, []corev1.Protocol{proto, corev1.ProtocolTCP}))))
		case 2:
			out = append(out, Range(proto, 80, 81))
		case 3:
			out = append(out, AnyPort(proto))
		default:
			out = append(out, Port(proto, 53))
		}
	}
	return out
}
