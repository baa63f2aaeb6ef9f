package netpoltest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/weftnet/weft/policy"
	"github.com/weftnet/weft/policy/oracle"
)

// ClusterPolicy returns a ClusterNetworkPolicy of tier and priority whose
// subject is the pods of the namespaces nsSel selects.
func ClusterPolicy(name string, tier cnp.Tier, priority int32, nsSel metav1.LabelSelector, spec ...func(*cnp.ClusterNetworkPolicySpec)) *cnp.ClusterNetworkPolicy {
	p := &cnp.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cnp.ClusterNetworkPolicySpec{Tier: tier, Priority: priority, Subject: cnp.ClusterNetworkPolicySubject{Namespaces: &nsSel}}}
	for _, f := range spec {
		f(&p.Spec)
	}
	return p
}

// ClusterIngress is an ingress rule of action from peers (namespaces or
// pods peers), on protocols (none: everything).
func ClusterIngress(action cnp.ClusterNetworkPolicyRuleAction, peers []cnp.ClusterNetworkPolicyEgressPeer, protos ...cnp.ClusterNetworkPolicyProtocol) cnp.ClusterNetworkPolicyIngressRule {
	r := cnp.ClusterNetworkPolicyIngressRule{Action: action, Protocols: protos}
	for _, p := range peers {
		r.From = append(r.From, cnp.ClusterNetworkPolicyIngressPeer{Namespaces: p.Namespaces, Pods: p.Pods})
	}
	return r
}

// ClusterEgress is an egress rule of action to peers, on protocols.
func ClusterEgress(action cnp.ClusterNetworkPolicyRuleAction, peers []cnp.ClusterNetworkPolicyEgressPeer, protos ...cnp.ClusterNetworkPolicyProtocol) cnp.ClusterNetworkPolicyEgressRule {
	return cnp.ClusterNetworkPolicyEgressRule{Action: action, To: peers, Protocols: protos}
}

// ClusterPort is a protocol's destination port (0: every port, the range
// 1-65535: the API wants a destination port).
func ClusterPort(proto corev1.Protocol, port int32) cnp.ClusterNetworkPolicyProtocol {
	dp := &cnp.Port{Number: port}
	if port == 0 {
		dp = &cnp.Port{Range: &cnp.PortRange{Start: 1, End: 65535}}
	}
	switch proto {
	case corev1.ProtocolUDP:
		return cnp.ClusterNetworkPolicyProtocol{UDP: &cnp.ClusterNetworkPolicyProtocolUDP{DestinationPort: dp}}
	case corev1.ProtocolSCTP:
		return cnp.ClusterNetworkPolicyProtocol{SCTP: &cnp.ClusterNetworkPolicyProtocolSCTP{DestinationPort: dp}}
	}
	return cnp.ClusterNetworkPolicyProtocol{TCP: &cnp.ClusterNetworkPolicyProtocolTCP{DestinationPort: dp}}
}

// ClusterPortRange is a protocol's destination port range.
func ClusterPortRange(proto corev1.Protocol, start, end int32) cnp.ClusterNetworkPolicyProtocol {
	p := ClusterPort(proto, 1)
	r := &cnp.Port{Range: &cnp.PortRange{Start: start, End: end}}
	switch {
	case p.TCP != nil:
		p.TCP.DestinationPort = r
	case p.UDP != nil:
		p.UDP.DestinationPort = r
	default:
		p.SCTP.DestinationPort = r
	}
	return p
}

// NamespacesPeer selects the pods of the namespaces sel selects.
func NamespacesPeer(sel metav1.LabelSelector) cnp.ClusterNetworkPolicyEgressPeer {
	return cnp.ClusterNetworkPolicyEgressPeer{Namespaces: &sel}
}

// PodsPeer selects the pods pod selects in the namespaces ns selects.
func PodsPeer(ns, pod metav1.LabelSelector) cnp.ClusterNetworkPolicyEgressPeer {
	return cnp.ClusterNetworkPolicyEgressPeer{Pods: &cnp.NamespacedPod{NamespaceSelector: ns, PodSelector: pod}}
}

// NetworksPeer selects addresses by CIDR (egress only).
func NetworksPeer(cidrs ...string) cnp.ClusterNetworkPolicyEgressPeer {
	p := cnp.ClusterNetworkPolicyEgressPeer{}
	for _, c := range cidrs {
		p.Networks = append(p.Networks, cnp.CIDR(c))
	}
	return p
}

// RandomCluster returns 0 to 4 valid ClusterNetworkPolicies over the bed
// w (whose pods must have addresses), of both tiers, with every action,
// namespaces, pods and networks peers, every protocol form, and
// priorities drawn from a few values so that ties happen.
func RandomCluster(r *rand.Rand, w *World) []*cnp.ClusterNetworkPolicy {
	var out []*cnp.ClusterNetworkPolicy
	for i := range r.IntN(5) {
		tier := pick(r, []cnp.Tier{cnp.AdminTier, cnp.BaselineTier})
		p := ClusterPolicy(fmt.Sprintf("cluster-%d", i), tier, pick(r, []int32{0, 10, 20}), randomSelector(r, NSLabel, NamespaceNames))
		if r.IntN(2) == 0 {
			p.Spec.Subject = cnp.ClusterNetworkPolicySubject{Pods: &cnp.NamespacedPod{
				NamespaceSelector: randomSelector(r, NSLabel, NamespaceNames), PodSelector: randomSelector(r, PodLabel, PodNames)}}
		}
		for range r.IntN(3) {
			p.Spec.Ingress = append(p.Spec.Ingress, ClusterIngress(randomAction(r), randomClusterPeers(r, w, false), randomProtocols(r)...))
		}
		for range r.IntN(3) {
			peers := randomClusterPeers(r, w, true)
			protos := randomProtocols(r)
			if slices.ContainsFunc(peers, func(p cnp.ClusterNetworkPolicyEgressPeer) bool { return len(p.Networks) > 0 }) {
				// The API refuses named ports beside networks peers.
				protos = slices.DeleteFunc(protos, func(p cnp.ClusterNetworkPolicyProtocol) bool { return p.DestinationNamedPort != "" })
			}
			p.Spec.Egress = append(p.Spec.Egress, ClusterEgress(randomAction(r), peers, protos...))
		}
		out = append(out, p)
	}
	return out
}

func randomAction(r *rand.Rand) cnp.ClusterNetworkPolicyRuleAction {
	return pick(r, []cnp.ClusterNetworkPolicyRuleAction{cnp.ClusterNetworkPolicyRuleActionAccept,
		cnp.ClusterNetworkPolicyRuleActionDeny, cnp.ClusterNetworkPolicyRuleActionPass})
}

// randomClusterPeers: 1 to 2 peers (a rule needs one); networks only in
// egress rules.
func randomClusterPeers(r *rand.Rand, w *World, egress bool) []cnp.ClusterNetworkPolicyEgressPeer {
	var out []cnp.ClusterNetworkPolicyEgressPeer
	for range 1 + r.IntN(2) {
		kinds := 2
		if egress {
			kinds = 3
		}
		switch r.IntN(kinds) {
		case 0:
			out = append(out, NamespacesPeer(randomSelector(r, NSLabel, NamespaceNames)))
		case 1:
			out = append(out, PodsPeer(randomSelector(r, NSLabel, NamespaceNames), randomSelector(r, PodLabel, PodNames)))
		default:
			out = append(out, NetworksPeer(IP(pick(r, w.Pods)).String()+"/32"))
		}
	}
	return out
}

func randomProtocols(r *rand.Rand) []cnp.ClusterNetworkPolicyProtocol {
	var out []cnp.ClusterNetworkPolicyProtocol
	for range r.IntN(3) {
		proto := pick(r, Protocols)
		switch r.IntN(4) {
		case 0:
			out = append(out, ClusterPort(proto, pick(r, Ports)))
		case 1:
			out = append(out, cnp.ClusterNetworkPolicyProtocol{DestinationNamedPort: PortName(pick(r, Ports), proto)})
		case 2:
			out = append(out, ClusterPortRange(proto, 80, 81))
		default:
			out = append(out, ClusterPort(proto, 0))
		}
	}
	return out
}

// UsesNetworks reports whether some ClusterNetworkPolicy has a networks
// peer: the bed's are IPv4, so such cases say nothing about IPv6 flows
// (as UsesIPBlock).
func UsesNetworks(pols []*cnp.ClusterNetworkPolicy) bool {
	for _, p := range pols {
		for _, r := range p.Spec.Egress {
			for _, peer := range r.To {
				if len(peer.Networks) > 0 {
					return true
				}
			}
		}
	}
	return false
}

// RandomTiered holds n random sets of ClusterNetworkPolicies of both
// tiers (every other one beside random NetworkPolicies) against the
// oracle on the bed, over IPv4 and IPv6 (IPv4 only for sets with
// ipBlocks or networks, which are IPv4 on the bed); apply programs each
// compiled set, one after the other on the same appliers.
func (b *Bed) RandomTiered(t testing.TB, n int, apply func(policy.Desired) error) {
	t.Helper()
	r := rand.New(rand.NewPCG(5, 8))
	for i := range n {
		var pols []*networkingv1.NetworkPolicy
		if i%2 == 1 {
			pols = Random(r, b.World)
		}
		cluster := RandomCluster(r, b.World)
		d := policy.Compile(policy.Input{Pods: b.World.Pods, Namespaces: b.World.Namespaces, Policies: pols, ClusterPolicies: cluster})
		if err := apply(d); err != nil {
			t.Fatalf("random tiered set %d: apply: %v", i, err)
		}
		want := oracle.Expect(oracle.World{Namespaces: b.World.Namespaces, Policies: pols, ClusterPolicies: cluster}, b.World.Pods, Ports, Protocols)
		what := fmt.Sprintf("random tiered set %d", i)
		b.CheckMatrix(t, b.Targets, want, what+" (IPv4)")
		if !UsesIPBlock(pols) && !UsesNetworks(cluster) {
			b.CheckMatrix(t, b.Targets6, want, what+" (IPv6)")
		}
	}
}
