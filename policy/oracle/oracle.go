package oracle

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/weftnet/weft/policy"
)

// World is the cluster state the oracle reasons about.
type World struct {
	Namespaces      []*corev1.Namespace
	Policies        []*networkingv1.NetworkPolicy
	ClusterPolicies []*cnp.ClusterNetworkPolicy
	Nodes           []*corev1.Node
}

// Allowed says whether a new connection from src to dst on port/proto is
// allowed. A pod reaching itself is always allowed (loopback).
func (w World) Allowed(src, dst *corev1.Pod, proto corev1.Protocol, port int32) bool {
	if src.Namespace == dst.Namespace && src.Name == dst.Name {
		return true
	}
	return w.direction(src, dst, src, networkingv1.PolicyTypeEgress, proto, port) &&
		w.direction(dst, src, dst, networkingv1.PolicyTypeIngress, proto, port)
}

// direction: may subject (the pod whose policies count) exchange the packet
// with peer, dst being the destination pod (named ports are its ports)?
// The Admin tier first, then the NetworkPolicies (which decide for a pod
// they isolate), then the Baseline tier; a Pass goes on to the next tier.
func (w World) direction(subject, peer, dst *corev1.Pod, dir networkingv1.PolicyType, proto corev1.Protocol, port int32) bool {
	ingress := dir == networkingv1.PolicyTypeIngress
	switch w.tier(cnp.AdminTier, subject, peer, dst, ingress, proto, port) {
	case verdict(cnp.ClusterNetworkPolicyRuleActionAccept):
		return true
	case verdict(cnp.ClusterNetworkPolicyRuleActionDeny):
		return false
	}
	if allowed, isolated := w.networkPolicies(subject, peer, dst, dir, proto, port); isolated {
		return allowed
	}
	return w.tier(cnp.BaselineTier, subject, peer, dst, ingress, proto, port) != verdict(cnp.ClusterNetworkPolicyRuleActionDeny)
}

// networkPolicies is the NetworkPolicy tier: whether subject is isolated
// in dir, and if so whether a policy allows the packet.
func (w World) networkPolicies(subject, peer, dst *corev1.Pod, dir networkingv1.PolicyType, proto corev1.Protocol, port int32) (allowed, isolated bool) {
	for _, pol := range w.Policies {
		if pol.Namespace != subject.Namespace || !hasType(pol, dir) {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
		if err == nil && !sel.Matches(labels.Set(subject.Labels)) {
			continue
		}
		isolated = true // selected, or cannot tell: isolated either way
		if err != nil || len(policy.Validate(pol)) > 0 {
			continue
		}
		if dir == networkingv1.PolicyTypeIngress {
			for _, r := range pol.Spec.Ingress {
				if w.peersMatch(pol.Namespace, r.From, peer) && portsMatch(r.Ports, dst, proto, port) {
					return true, true
				}
			}
		} else {
			for _, r := range pol.Spec.Egress {
				if w.peersMatch(pol.Namespace, r.To, peer) && portsMatch(r.Ports, dst, proto, port) {
					return true, true
				}
			}
		}
	}
	return false, isolated
}

// hasType applies the API's defaulting of policyTypes; unknown types make
// the policy (rejected anyway) count for both directions.
func hasType(pol *networkingv1.NetworkPolicy, dir networkingv1.PolicyType) bool {
	types := pol.Spec.PolicyTypes
	if len(types) == 0 {
		return dir == networkingv1.PolicyTypeIngress || len(pol.Spec.Egress) > 0
	}
	for _, t := range types {
		if t == dir || (t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress) {
			return true
		}
	}
	return false
}

func (w World) peersMatch(ns string, peers []networkingv1.NetworkPolicyPeer, p *corev1.Pod) bool {
	if len(peers) == 0 {
		return true
	}
	for _, peer := range peers {
		if w.peerMatches(ns, peer, p) {
			return true
		}
	}
	return false
}

func (w World) peerMatches(ns string, peer networkingv1.NetworkPolicyPeer, p *corev1.Pod) bool {
	if b := peer.IPBlock; b != nil {
		ip, ok := primaryIP(p)
		if !ok {
			return false
		}
		cidr, _ := netip.ParsePrefix(b.CIDR)
		if !cidr.Masked().Contains(ip) {
			return false
		}
		for _, e := range b.Except {
			if ex, _ := netip.ParsePrefix(e); ex.Masked().Contains(ip) {
				return false
			}
		}
		return true
	}
	if peer.NamespaceSelector == nil {
		if p.Namespace != ns {
			return false
		}
	} else if !matches(peer.NamespaceSelector, w.namespaceLabels(p.Namespace)) {
		return false
	}
	return peer.PodSelector == nil || matches(peer.PodSelector, p.Labels)
}

func (w World) namespaceLabels(name string) map[string]string {
	for _, n := range w.Namespaces {
		if n.Name == name {
			return n.Labels
		}
	}
	return nil
}

func matches(s *metav1.LabelSelector, l map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(s)
	return err == nil && sel.Matches(labels.Set(l))
}

func portsMatch(ports []networkingv1.NetworkPolicyPort, dst *corev1.Pod, proto corev1.Protocol, port int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		want := corev1.ProtocolTCP
		if p.Protocol != nil {
			want = *p.Protocol
		}
		if want != proto {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.Type != 0: // a name: the destination pod's container port
			if containerPort(dst, p.Port.StrVal, proto) == port {
				return true
			}
		case p.EndPort != nil:
			if port >= p.Port.IntVal && port <= *p.EndPort {
				return true
			}
		case port == p.Port.IntVal:
			return true
		}
	}
	return false
}

func containerPort(p *corev1.Pod, name string, proto corev1.Protocol) int32 {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			cpp := cp.Protocol
			if cpp == "" {
				cpp = corev1.ProtocolTCP
			}
			if cp.Name == name && cpp == proto {
				return cp.ContainerPort
			}
		}
	}
	return -1
}

func primaryIP(p *corev1.Pod) (netip.Addr, bool) {
	s := p.Status.PodIP
	if s == "" && len(p.Status.PodIPs) > 0 {
		s = p.Status.PodIPs[0].IP
	}
	ip, err := netip.ParseAddr(s)
	return ip, err == nil
}
