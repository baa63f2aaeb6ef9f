package agent

import (
	"net/netip"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/weftnet/weft/internal/nflog"
	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

// ipv4TCP is a TCP SYN's head from src to dst:port.
func ipv4TCP(src, dst netip.Addr, port uint16) []byte {
	b := make([]byte, 40)
	b[0], b[9] = 0x45, 6
	copy(b[12:], src.AsSlice())
	copy(b[16:], dst.AsSlice())
	b[22], b[23] = byte(port>>8), byte(port)
	return b
}

// TestDenyLogExplains: a logged drop is explained with the state the
// agent applied: a ClusterNetworkPolicy rule by name, priority and rule,
// or the NetworkPolicies isolating the pod; the metric's policy label
// is bounded.
func TestDenyLogExplains(t *testing.T) {
	w := nt.Addressed()
	deny := nt.ClusterPolicy("no-z", cnp.AdminTier, 3, metav1.LabelSelector{MatchLabels: nt.L(nt.NSLabel, "x")}, func(s *cnp.ClusterNetworkPolicySpec) {
		s.Ingress = []cnp.ClusterNetworkPolicyIngressRule{{Name: "from-z", Action: cnp.ClusterNetworkPolicyRuleActionDeny,
			From: []cnp.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{MatchLabels: nt.L(nt.NSLabel, "z")}}}}}
	})
	in := policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, ClusterPolicies: []*cnp.ClusterNetworkPolicy{deny},
		Policies: []*networkingv1.NetworkPolicy{nt.Policy("y", "deny-all", nil)}}
	var l denyLog
	l.update(policy.Compile(in), podNames(in.Pods))
	ip := func(key string) netip.Addr {
		k := strings.Split(key, "/")
		return nt.IP(w.Pod(k[0], k[1]))
	}
	rec, ok := l.explain("node1", nflog.Packet{Prefix: policy.DropLogPrefix + "ingress", Payload: ipv4TCP(ip("z/a"), ip("x/b"), 80)})
	if !ok || rec.Tier != policy.TierAdmin || rec.Policy != "no-z" || rec.Priority != 3 || rec.Rule != "from-z" || rec.SrcPod != "z/a" || rec.DstPod != "x/b" ||
		rec.Protocol != "TCP" || rec.Port != 80 || rec.Direction != "ingress" {
		t.Fatalf("%+v %v, want the Admin rule no-z/from-z for z/a -> x/b 80/TCP", rec, ok)
	}
	rec, ok = l.explain("node1", nflog.Packet{Prefix: policy.DropLogPrefix + "ingress", Payload: ipv4TCP(ip("x/a"), ip("y/c"), 81)})
	if !ok || rec.Tier != policy.TierNetworkPolicy || len(rec.Policies) != 1 || rec.Policies[0] != "y/deny-all" {
		t.Fatalf("%+v %v, want the NetworkPolicy y/deny-all", rec, ok)
	}
	if _, ok := l.explain("node1", nflog.Packet{Prefix: "someone else's", Payload: ipv4TCP(ip("x/a"), ip("y/c"), 81)}); ok {
		t.Fatal("a packet of another prefix was explained")
	}
	for i := range maxDeniedSeries + 10 {
		label := l.label(DenyRecord{Direction: "ingress", Tier: policy.TierAdmin, Policy: "p" + string(rune('a'+i%26)) + string(rune('a'+i/26))})
		if want := i >= maxDeniedSeries; (label[2] == "other") != want {
			t.Fatalf("series %d: label %v", i, label)
		}
	}
}
