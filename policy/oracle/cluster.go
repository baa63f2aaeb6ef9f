package oracle

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// The ClusterNetworkPolicy tiers, read straight from the API objects: the
// policies of a tier that select the subject pod, by priority then name,
// their rules of the direction in order; the first rule that matches the
// peer and the port decides. A rule that cannot be read matches nothing
// when it accepts, everything otherwise.

// verdict is a tier's answer: no rule matched (undecided), or the action
// of the first that did.
type verdict string

const undecided verdict = ""

// tier evaluates one tier for subject's direction dir toward peer (dst is
// the destination pod, whose named ports count).
func (w World) tier(t cnp.Tier, subject, peer, dst *corev1.Pod, ingress bool, proto corev1.Protocol, port int32) verdict {
	var pols []*cnp.ClusterNetworkPolicy
	for _, p := range w.ClusterPolicies {
		tier := p.Spec.Tier
		if tier != cnp.AdminTier && tier != cnp.BaselineTier {
			tier = cnp.AdminTier
		}
		if tier == t && w.subjectMatches(p.Spec.Subject, subject) {
			pols = append(pols, p)
		}
	}
	slices.SortFunc(pols, func(a, b *cnp.ClusterNetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Spec.Priority, b.Spec.Priority), cmp.Compare(a.Name, b.Name))
	})
	for _, p := range pols {
		broken := !policyReadable(p)
		if ingress {
			for _, r := range p.Spec.Ingress {
				var peers []cnp.ClusterNetworkPolicyEgressPeer
				for _, f := range r.From {
					peers = append(peers, cnp.ClusterNetworkPolicyEgressPeer{Namespaces: f.Namespaces, Pods: f.Pods})
				}
				if v := w.rule(broken, r.Action, peers, r.Protocols, peer, dst, proto, port); v != undecided {
					return v
				}
			}
			continue
		}
		for _, r := range p.Spec.Egress {
			if v := w.rule(broken, r.Action, r.To, r.Protocols, peer, dst, proto, port); v != undecided {
				return v
			}
		}
	}
	return undecided
}

// policyReadable: a known tier, a priority in range and a subject that can
// be read (else every rule of the policy fails closed).
func policyReadable(p *cnp.ClusterNetworkPolicy) bool {
	s := p.Spec.Subject
	ok := (p.Spec.Tier == cnp.AdminTier || p.Spec.Tier == cnp.BaselineTier) && p.Spec.Priority >= 0 && p.Spec.Priority <= 1000
	switch {
	case s.Namespaces != nil && s.Pods == nil:
		_, valid := selects(s.Namespaces, nil)
		return ok && valid
	case s.Pods != nil && s.Namespaces == nil:
		_, nsValid := selects(&s.Pods.NamespaceSelector, nil)
		_, podValid := selects(&s.Pods.PodSelector, nil)
		return ok && nsValid && podValid
	}
	return false
}

func (w World) subjectMatches(s cnp.ClusterNetworkPolicySubject, p *corev1.Pod) bool {
	switch {
	case s.Namespaces != nil && s.Pods == nil:
		ok, valid := selects(s.Namespaces, w.namespaceLabels(p.Namespace))
		return ok || !valid
	case s.Pods != nil && s.Namespaces == nil:
		nsOK, nsValid := selects(&s.Pods.NamespaceSelector, w.namespaceLabels(p.Namespace))
		podOK, podValid := selects(&s.Pods.PodSelector, p.Labels)
		return !nsValid || !podValid || (nsOK && podOK)
	default:
		return true // cannot be read: every pod
	}
}

// rule is one rule's verdict on the packet; broken: its policy cannot be
// read.
func (w World) rule(broken bool, action cnp.ClusterNetworkPolicyRuleAction, peers []cnp.ClusterNetworkPolicyEgressPeer,
	protos []cnp.ClusterNetworkPolicyProtocol, peer, dst *corev1.Pod, proto corev1.Protocol, port int32) verdict {
	valid := len(peers) > 0 && !broken
	switch action {
	case cnp.ClusterNetworkPolicyRuleActionAccept, cnp.ClusterNetworkPolicyRuleActionDeny, cnp.ClusterNetworkPolicyRuleActionPass:
	default:
		valid = false
	}
	peerOK := false
	for _, p := range peers {
		ok, v := w.clusterPeerMatches(p, peer)
		if len(p.DomainNames) > 0 && action != cnp.ClusterNetworkPolicyRuleActionAccept {
			v = false
		}
		valid = valid && v
		peerOK = peerOK || ok
	}
	portOK, v := protocolsMatch(protos, dst, proto, port)
	valid = valid && v
	switch {
	case !valid && action == cnp.ClusterNetworkPolicyRuleActionAccept:
		return undecided
	case !valid:
		return verdict(cnp.ClusterNetworkPolicyRuleActionDeny)
	case peerOK && portOK:
		return verdict(action)
	}
	return undecided
}

// clusterPeerMatches: does the peer select p, and can it be read?
func (w World) clusterPeerMatches(peer cnp.ClusterNetworkPolicyEgressPeer, p *corev1.Pod) (match, valid bool) {
	kinds := 0
	if peer.Namespaces != nil {
		kinds++
	}
	if peer.Pods != nil {
		kinds++
	}
	if peer.Nodes != nil {
		kinds++
	}
	if len(peer.Networks) > 0 {
		kinds++
	}
	if len(peer.DomainNames) > 0 {
		kinds++
	}
	if kinds != 1 {
		return false, false
	}
	switch {
	case peer.Namespaces != nil:
		return selects(peer.Namespaces, w.namespaceLabels(p.Namespace))
	case peer.Pods != nil:
		nsOK, nsValid := selects(&peer.Pods.NamespaceSelector, w.namespaceLabels(p.Namespace))
		podOK, podValid := selects(&peer.Pods.PodSelector, p.Labels)
		return nsOK && podOK, nsValid && podValid
	case peer.Nodes != nil:
		_, valid := selects(peer.Nodes, nil)
		ip, _ := primaryIP(p)
		for _, n := range w.Nodes {
			if nodeOK, _ := selects(peer.Nodes, n.Labels); nodeOK {
				for _, a := range n.Status.Addresses {
					if addr, err := netip.ParseAddr(a.Address); err == nil && addr == ip {
						return true, valid
					}
				}
			}
		}
		return false, valid
	case len(peer.Networks) > 0:
		ip, _ := primaryIP(p)
		in := false
		for _, n := range peer.Networks {
			pfx, err := netip.ParsePrefix(string(n))
			if err != nil {
				return false, false
			}
			in = in || pfx.Masked().Contains(ip)
		}
		return in, true
	}
	return false, true // domain names: not supported, nothing matches
}

// protocolsMatch: do the rule's protocols take the packet, and can they
// be read?
func protocolsMatch(protos []cnp.ClusterNetworkPolicyProtocol, dst *corev1.Pod, proto corev1.Protocol, port int32) (match, valid bool) {
	if len(protos) == 0 {
		return true, true
	}
	valid = true
	for _, pr := range protos {
		var want corev1.Protocol
		var dp *cnp.Port
		n := 0
		if pr.TCP != nil {
			n, want, dp = n+1, corev1.ProtocolTCP, pr.TCP.DestinationPort
		}
		if pr.UDP != nil {
			n, want, dp = n+1, corev1.ProtocolUDP, pr.UDP.DestinationPort
		}
		if pr.SCTP != nil {
			n, want, dp = n+1, corev1.ProtocolSCTP, pr.SCTP.DestinationPort
		}
		if pr.DestinationNamedPort != "" {
			n++
		}
		if n != 1 {
			valid = false
			continue
		}
		if pr.DestinationNamedPort != "" {
			if containerPort(dst, pr.DestinationNamedPort, proto) == port {
				match = true
			}
			continue
		}
		switch {
		case dp == nil:
			match = match || want == proto
		case dp.Range == nil:
			if dp.Number < 1 || dp.Number > 65535 {
				valid = false
			}
			match = match || (want == proto && port == dp.Number)
		default:
			if dp.Number != 0 || dp.Range.Start < 1 || dp.Range.End > 65535 || dp.Range.Start > dp.Range.End {
				valid = false
			}
			match = match || (want == proto && port >= dp.Range.Start && port <= dp.Range.End)
		}
	}
	return match, valid
}

// selects: does s select a set of labels, and can it be read?
func selects(s *metav1.LabelSelector, l map[string]string) (match, valid bool) {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return false, false
	}
	return sel.Matches(labels.Set(l)), true
}
