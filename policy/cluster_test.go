package policy_test

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/oracle"
)

const (
	accept = cnp.ClusterNetworkPolicyRuleActionAccept
	deny   = cnp.ClusterNetworkPolicyRuleActionDeny
	pass   = cnp.ClusterNetworkPolicyRuleActionPass
)

func ns(name string) metav1.LabelSelector {
	return metav1.LabelSelector{MatchLabels: nt.L(nt.NSLabel, name)}
}

var everyNS = metav1.LabelSelector{}

func ingress(rules ...cnp.ClusterNetworkPolicyIngressRule) func(*cnp.ClusterNetworkPolicySpec) {
	return func(s *cnp.ClusterNetworkPolicySpec) { s.Ingress = append(s.Ingress, rules...) }
}

func egress(rules ...cnp.ClusterNetworkPolicyEgressRule) func(*cnp.ClusterNetworkPolicySpec) {
	return func(s *cnp.ClusterNetworkPolicySpec) { s.Egress = append(s.Egress, rules...) }
}

func peers(p ...cnp.ClusterNetworkPolicyEgressPeer) []cnp.ClusterNetworkPolicyEgressPeer { return p }

// tiered compiles, and checks each case's verdict against the oracle's as
// well as against want, and what decided it against the wanted text.
type tieredCase struct {
	from, to string // namespace/name
	proto    corev1.Protocol
	port     uint16
	allowed  bool
	why      string // a part of the deciding direction's explanation
}

func checkTiered(t *testing.T, w *nt.World, pols []*networkingv1.NetworkPolicy, cluster []*cnp.ClusterNetworkPolicy, nodes []*corev1.Node, cases []tieredCase) policy.Desired {
	t.Helper()
	d := policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: pols, ClusterPolicies: cluster, Nodes: nodes})
	o := oracle.World{Namespaces: w.Namespaces, Policies: pols, ClusterPolicies: cluster, Nodes: nodes}
	for _, c := range cases {
		src, dst := pod(w, c.from), pod(w, c.to)
		x := d.Explain(nt.IP(src), nt.IP(dst), policy.Protocol(c.proto), c.port)
		if o.Allowed(src, dst, c.proto, int32(c.port)) != c.allowed {
			t.Errorf("%s -> %s %d/%s: the oracle says %v, the case %v", c.from, c.to, c.port, c.proto, !c.allowed, c.allowed)
		}
		dec := x.Ingress
		if x.Egress != nil && (!x.Egress.Allowed || x.Ingress == nil) {
			dec = x.Egress
		}
		why := "<nothing decided>"
		if dec != nil {
			why = dec.String()
		}
		if x.Allowed != c.allowed || !strings.Contains(why, c.why) {
			t.Errorf("%s -> %s %d/%s: allowed %v (%s), want %v (%q)", c.from, c.to, c.port, c.proto, x.Allowed, why, c.allowed, c.why)
		}
	}
	return d
}

func pod(w *nt.World, key string) *corev1.Pod {
	k := strings.SplitN(key, "/", 2)
	return w.Pod(k[0], k[1])
}

// TestTiers: the Admin tier decides before NetworkPolicies, which decide
// for the pods they isolate before the Baseline tier; Pass goes on to the
// next tier; the first matching rule of the policy with the lowest
// priority wins, ties by name.
func TestTiers(t *testing.T) {
	w := nt.Addressed()
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	cluster := []*cnp.ClusterNetworkPolicy{
		// Admin: x's pods take nothing from y, except that y/a's traffic to
		// port 81 is passed on to the NetworkPolicies.
		nt.ClusterPolicy("admin-deny-y", cnp.AdminTier, 20, ns("x"), ingress(
			nt.ClusterIngress(deny, peers(nt.NamespacesPeer(ns("y")))))),
		nt.ClusterPolicy("admin-pass-ya", cnp.AdminTier, 10, ns("x"), ingress(
			nt.ClusterIngress(pass, peers(nt.PodsPeer(ns("y"), metav1.LabelSelector{MatchLabels: nt.L(nt.PodLabel, "a")})), nt.ClusterPort(tcp, 81)))),
		// Equal priority: "a-" sorts before "b-", so z's UDP is accepted.
		nt.ClusterPolicy("b-deny-z-udp", cnp.AdminTier, 30, ns("x"), ingress(nt.ClusterIngress(deny, peers(nt.NamespacesPeer(ns("z"))), nt.ClusterPort(udp, 0)))),
		nt.ClusterPolicy("a-accept-z-udp", cnp.AdminTier, 30, ns("x"), ingress(nt.ClusterIngress(accept, peers(nt.NamespacesPeer(ns("z"))), nt.ClusterPort(udp, 0)))),
		// Baseline: every pod denies TCP 80 from z, unless its
		// NetworkPolicies decide.
		nt.ClusterPolicy("baseline-deny-z", cnp.BaselineTier, 5, everyNS, ingress(
			nt.ClusterIngress(deny, peers(nt.NamespacesPeer(ns("z"))), nt.ClusterPort(tcp, 80)))),
	}
	pols := []*networkingv1.NetworkPolicy{
		// x/a isolates its ingress, allowing y/a and z on 80 and 81.
		nt.Policy("x", "allow-ya", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.NSPodPeer(nt.L(nt.NSLabel, "y"), nt.L(nt.PodLabel, "a")), nt.NSPeer(nt.L(nt.NSLabel, "z"))),
			nt.Port(tcp, 80), nt.Port(tcp, 81)))),
	}
	checkTiered(t, w, pols, cluster, nil, []tieredCase{
		{"y/a", "x/a", tcp, 81, true, "allowed by NetworkPolicy x/allow-ya"},       // passed, then the NetworkPolicy allows
		{"y/a", "x/b", tcp, 81, true, "no policy decides"},                         // passed; x/b is not isolated, the Baseline does not match
		{"y/a", "x/a", tcp, 80, false, "Admin ClusterNetworkPolicy admin-deny-y"},  // not passed: denied before the NetworkPolicy
		{"y/b", "x/a", tcp, 81, false, "Admin ClusterNetworkPolicy admin-deny-y"},  // only y/a is passed
		{"z/a", "x/a", udp, 80, true, "a-accept-z-udp (priority 30) rule ingress"}, // the tie, by name
		{"z/a", "x/a", tcp, 80, true, "allowed by NetworkPolicy x/allow-ya"},       // isolated: the NetworkPolicy decides over the Baseline
		{"z/a", "x/b", tcp, 80, false, "Baseline ClusterNetworkPolicy baseline-deny-z"},
		{"z/a", "x/b", tcp, 81, true, "no policy decides"},
		{"x/b", "x/a", tcp, 80, false, "isolated by NetworkPolicies [x/allow-ya]"},
		{"x/b", "y/c", tcp, 80, true, "no policy decides"},
	})
}

// TestEgressAcceptLeavesIngress: an Admin Accept of a pod's egress ends
// the source's evaluation only; the destination's ingress policies still
// apply. A Baseline Pass allows.
func TestEgressAcceptLeavesIngress(t *testing.T) {
	w := nt.Addressed()
	tcp := corev1.ProtocolTCP
	cluster := []*cnp.ClusterNetworkPolicy{
		nt.ClusterPolicy("egress-accept", cnp.AdminTier, 1, ns("x"), egress(nt.ClusterEgress(accept, peers(nt.NamespacesPeer(everyNS))))),
		nt.ClusterPolicy("y-deny-x", cnp.AdminTier, 2, ns("y"), ingress(nt.ClusterIngress(deny, peers(nt.NamespacesPeer(ns("x")))))),
		nt.ClusterPolicy("z-pass", cnp.BaselineTier, 1, ns("z"), ingress(nt.ClusterIngress(pass, peers(nt.NamespacesPeer(everyNS))))),
		nt.ClusterPolicy("z-deny", cnp.BaselineTier, 2, ns("z"), ingress(nt.ClusterIngress(deny, peers(nt.NamespacesPeer(everyNS))))),
	}
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "deny-egress", nil, nt.Types(networkingv1.PolicyTypeEgress))}
	checkTiered(t, w, pols, cluster, nil, []tieredCase{
		{"x/a", "y/a", tcp, 80, false, "Admin ClusterNetworkPolicy y-deny-x (priority 2)"},
		{"x/a", "x/b", tcp, 80, true, "no policy decides"}, // egress accepted over the NetworkPolicy's deny
		{"x/a", "z/b", tcp, 80, true, "Baseline ClusterNetworkPolicy z-pass (priority 1) rule ingress[0]: Pass"},
	})
}

// TestNetworksAndNodes: egress peers by CIDR and by node labels (the
// nodes' status addresses).
func TestNetworksAndNodes(t *testing.T) {
	w := nt.Addressed()
	tcp := corev1.ProtocolTCP
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: nt.L("role", "infra")},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.18.0.11"}, {Type: corev1.NodeHostName, Address: "n1"}}}}
	other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "172.18.0.12"}}}}
	cluster := []*cnp.ClusterNetworkPolicy{
		nt.ClusterPolicy("infra", cnp.AdminTier, 1, ns("x"), egress(
			nt.ClusterEgress(deny, peers(cnp.ClusterNetworkPolicyEgressPeer{Nodes: &metav1.LabelSelector{MatchLabels: nt.L("role", "infra")}})),
			nt.ClusterEgress(deny, peers(nt.NetworksPeer("10.244.1.0/24")), nt.ClusterPort(tcp, 80)))),
	}
	d := checkTiered(t, w, nil, cluster, []*corev1.Node{node, other}, []tieredCase{
		{"x/a", "y/a", tcp, 80, false, "Admin ClusterNetworkPolicy infra (priority 1) rule egress[1]: Deny"},
		{"x/a", "y/a", tcp, 81, true, "no policy decides"},
		{"x/a", "z/a", tcp, 80, true, "no policy decides"},
	})
	xa := nt.IP(w.Pod("x", "a"))
	for addr, want := range map[string]bool{"172.18.0.11": false, "172.18.0.12": true} {
		if got := d.Allows(xa, netip.MustParseAddr(addr), policy.TCP, 443); got != want {
			t.Errorf("x/a to node address %s: allowed %v, want %v", addr, got, want)
		}
	}
}

// TestClusterFailClosed: a rule that cannot be read matches nothing when
// it accepts and everything when it denies or passes; a policy whose
// subject cannot be read fails closed in every rule, for every pod; each
// is reported naming the policy and the field.
func TestClusterFailClosed(t *testing.T) {
	w := nt.Addressed()
	tcp := corev1.ProtocolTCP
	badSel := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "k", Operator: "Near"}}}
	cluster := []*cnp.ClusterNetworkPolicy{
		// Would accept everything into x over the NetworkPolicy, if read.
		nt.ClusterPolicy("bad-accept", cnp.AdminTier, 1, ns("x"), ingress(nt.ClusterIngress(accept, peers(nt.NamespacesPeer(everyNS)), nt.ClusterPort(tcp, 70000)))),
		// Would deny only from z, if read.
		nt.ClusterPolicy("bad-deny", cnp.AdminTier, 2, ns("y"), ingress(nt.ClusterIngress(deny, peers(cnp.ClusterNetworkPolicyEgressPeer{})))),
		// A subject that cannot be read: an Accept of everything, void.
		nt.ClusterPolicy("bad-subject", cnp.AdminTier, 0, badSel, ingress(nt.ClusterIngress(accept, peers(nt.NamespacesPeer(everyNS))))),
	}
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "deny-all", nil)}
	d := checkTiered(t, w, pols, cluster, nil, []tieredCase{
		{"z/a", "x/a", tcp, 80, false, "isolated by NetworkPolicies [x/deny-all]"},
		{"z/a", "y/a", tcp, 80, false, "Admin ClusterNetworkPolicy bad-deny (priority 2) rule ingress[0]: Deny"},
		{"z/a", "z/b", tcp, 80, true, "no policy decides"},
	})
	want := map[string]string{
		"bad-accept":  "spec.ingress[0].protocols[0].tcp.destinationPort.number",
		"bad-deny":    "spec.ingress[0].from[0]",
		"bad-subject": "spec.subject.namespaces",
	}
	for _, e := range d.Errors {
		if want[e.Policy] == e.Field {
			delete(want, e.Policy)
		}
	}
	if len(want) > 0 {
		t.Errorf("errors %v; missing %v", d.Errors, want)
	}
}
