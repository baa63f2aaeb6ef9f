package netpoltest

import (
	"sort"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterCIDR is the pods' address range on every bed (lab and kernel).
const ClusterCIDR = "10.244.0.0/16"

// Scenario is a named sequence of states of the bed; after each step the
// whole reachability matrix is compared with the oracle.
type Scenario struct {
	Name string
	// Invalid scenarios hold policies the API server would reject: they run
	// where policies do not pass through it (pure and kernel tests).
	Invalid bool
	Steps   []Step
}

// Step is one state: the complete set of policies, and label changes
// (cumulative over the steps) for namespaces and pods ("ns/name").
type Step struct {
	Name            string
	Policies        []*networkingv1.NetworkPolicy
	NamespaceLabels map[string]map[string]string
	PodLabels       map[string]map[string]string
}

func one(p ...*networkingv1.NetworkPolicy) []Step { return []Step{{Name: "apply", Policies: p}} }

const (
	tcp  = corev1.ProtocolTCP
	udp  = corev1.ProtocolUDP
	sctp = corev1.ProtocolSCTP
	ing  = networkingv1.PolicyTypeIngress
	egr  = networkingv1.PolicyTypeEgress
)

// Scenarios are the upstream netpol e2e cases on the bed w (whose pods must
// have their addresses: ipBlock cases are built from them).
func Scenarios(w *World) []Scenario {
	a := L(PodLabel, "a")
	b := L(PodLabel, "b")
	c := L(PodLabel, "c")
	nsY := L(NSLabel, "y")
	nsZ := L(NSLabel, "z")
	host := func(ns, name string) string { return IP(w.Pod(ns, name)).String() + "/32" }
	denyIn := func(ns string) *networkingv1.NetworkPolicy {
		return Policy(ns, "deny-ingress", nil, Types(ing), Ingress())
	}
	s := []Scenario{
		{Name: "deny all ingress", Steps: one(denyIn("x"))},
		{Name: "deny all egress", Steps: one(Policy("x", "deny-egress", nil, Types(egr)))},
		{Name: "deny all ingress and egress", Steps: one(Policy("x", "deny-all", nil, Types(ing, egr)))},
		{Name: "allow all ingress", Steps: one(denyIn("x"), Policy("x", "allow-all", nil, Ingress(From(nil))))},
		{Name: "allow all egress over deny all egress", Steps: one(Policy("x", "deny-egress", nil, Types(egr)), Policy("x", "allow-egress", nil, Types(egr), Egress(To(nil))))},
		{Name: "allow from a namespace", Steps: one(Policy("x", "from-y", a, Ingress(From(Peers(NSPeer(nsY))))))},
		{Name: "allow from a pod in the same namespace", Steps: one(Policy("x", "from-b", a, Ingress(From(Peers(PodPeer(b))))))},
		{Name: "allow from a pod in any namespace", Steps: one(Policy("x", "from-any-b", a, Ingress(From(Peers(NSPodPeer(nil, b))))))},
		{Name: "allow from a pod in a namespace (combined selectors)", Steps: one(Policy("x", "from-y-c", a, Ingress(From(Peers(NSPodPeer(nsY, c))))))},
		{Name: "allow from a namespace or a pod (two peers)", Steps: one(Policy("x", "from-y-or-c", a, Ingress(From(Peers(NSPeer(nsY), PodPeer(c))))))},
		{Name: "allow from namespaces by expression (NotIn)", Steps: one(Policy("x", "not-x", a, Ingress(From(Peers(ExprPeer(Req(NSLabel, metav1.LabelSelectorOpNotIn, "x"), nil))))))},
		{Name: "allow from pods by expression (In)", Steps: one(Policy("x", "b-or-c", nil, Ingress(From(Peers(ExprPeer(nil, Req(PodLabel, metav1.LabelSelectorOpIn, "b", "c")))))))},
		{Name: "allow from pods by expression (Exists) in namespaces (DoesNotExist)", Steps: one(Policy("y", "exists", nil, Ingress(From(Peers(ExprPeer(Req("team", metav1.LabelSelectorOpDoesNotExist), Req(PodLabel, metav1.LabelSelectorOpExists)))))))},
		{Name: "allow ingress on port 80 only", Steps: one(Policy("x", "port-80", a, Ingress(From(nil, Port(tcp, 80)))))},
		{Name: "allow port 81 from a namespace", Steps: one(Policy("x", "y-81", a, Ingress(From(Peers(NSPeer(nsY)), Port(tcp, 81)))))},
		{Name: "allow named port (TCP)", Steps: one(Policy("x", "named", nil, Ingress(From(nil, Named(tcp, PortName(80, tcp))))))},
		{Name: "allow named port (UDP) from a namespace", Steps: one(Policy("x", "named-udp", nil, Ingress(From(Peers(NSPeer(nsZ)), Named(udp, PortName(81, udp))))))},
		{Name: "allow a protocol, any port", Steps: one(Policy("x", "udp-only", nil, Ingress(From(nil, AnyPort(udp)))))},
		{Name: "allow a port range (endPort)", Steps: one(Policy("x", "range", nil, Ingress(From(nil, Range(tcp, 80, 81)))))},
		{Name: "allow a port range covering one port", Steps: one(Policy("x", "range-81", nil, Ingress(From(nil, Range(udp, 81, 90)))))},
		{Name: "allow SCTP only", Steps: one(Policy("x", "sctp", nil, Ingress(From(nil, Port(sctp, 80)))))},
		{Name: "ipBlock with except", Steps: one(Policy("x", "block", a, Ingress(From(Peers(BlockPeer(ClusterCIDR, host("y", "b"), host("z", "c")))))))},
		{Name: "ipBlock of one pod", Steps: one(Policy("x", "block-one", nil, Ingress(From(Peers(BlockPeer(host("z", "a")))))))},
		{Name: "egress to an ipBlock", Steps: one(Policy("x", "egress-block", a, Types(egr), Egress(To(Peers(BlockPeer(host("x", "b")))))))},
		{Name: "egress to DNS only", Steps: one(Policy("x", "dns-only", nil, Types(egr), Egress(To(nil, Port(udp, 53), Port(tcp, 53)))))},
		{Name: "egress to a namespace", Steps: one(Policy("x", "to-y", nil, Types(egr), Egress(To(Peers(NSPeer(nsY))))))},
		{Name: "egress to a named port", Steps: one(Policy("x", "to-named", nil, Types(egr), Egress(To(nil, Named(udp, PortName(80, udp))))))},
		{Name: "egress to pods in any namespace on a port", Steps: one(Policy("x", "to-b-80", a, Types(egr), Egress(To(Peers(NSPodPeer(nil, b)), Port(tcp, 80)))))},
		{Name: "egress port range", Steps: one(Policy("y", "to-range", nil, Types(egr), Egress(To(nil, Range(udp, 80, 81)))))},
		{Name: "several policies in union", Steps: one(
			Policy("x", "from-y-80", a, Ingress(From(Peers(NSPeer(nsY)), Port(tcp, 80)))),
			Policy("x", "from-z-81", a, Ingress(From(Peers(NSPeer(nsZ)), Port(udp, 81)))))},
		{Name: "deny all plus an allow", Steps: one(denyIn("x"), Policy("x", "from-b", nil, Ingress(From(Peers(PodPeer(b))))))},
		{Name: "ingress and egress together", Steps: one(
			Policy("x", "egress-y", a, Types(egr), Egress(To(Peers(NSPeer(nsY))))),
			Policy("y", "from-x", nil, Ingress(From(Peers(NSPeer(L(NSLabel, "x")))))))},
		{Name: "egress-only policy ignores its ingress rules", Steps: one(Policy("x", "egress-only", nil, Types(egr), Ingress(From(Peers(PodPeer(b)))), Egress(To(Peers(NSPeer(nsZ))))))},
		{Name: "policyTypes default from egress rules", Steps: one(Policy("z", "default-types", c, Egress(To(Peers(PodPeer(a))))))},
		{Name: "empty ports list", Steps: one(Policy("x", "empty-ports", nil, Ingress(networkingv1.NetworkPolicyIngressRule{From: Peers(NSPeer(nsY)), Ports: []networkingv1.NetworkPolicyPort{}})))},
		{Name: "deny all ingress everywhere", Steps: one(denyIn("x"), denyIn("y"), denyIn("z"))},
		{Name: "policy updated", Steps: []Step{
			{Name: "from y", Policies: []*networkingv1.NetworkPolicy{Policy("x", "p", a, Ingress(From(Peers(NSPeer(nsY)))))}},
			{Name: "from z on 81", Policies: []*networkingv1.NetworkPolicy{Policy("x", "p", a, Ingress(From(Peers(NSPeer(nsZ)), Port(tcp, 81))))}},
		}},
		{Name: "policy deleted", Steps: []Step{
			{Name: "deny", Policies: []*networkingv1.NetworkPolicy{denyIn("x"), Policy("x", "from-y", b, Ingress(From(Peers(NSPeer(nsY)))))}},
			{Name: "deny deleted", Policies: []*networkingv1.NetworkPolicy{Policy("x", "from-y", b, Ingress(From(Peers(NSPeer(nsY)))))}},
			{Name: "all deleted"},
		}},
		{Name: "namespace relabelled", Steps: []Step{
			{Name: "allow team blue", Policies: []*networkingv1.NetworkPolicy{Policy("x", "blue", nil, Ingress(From(Peers(NSPeer(L("team", "blue"))))))}},
			{Name: "z joins team blue", Policies: []*networkingv1.NetworkPolicy{Policy("x", "blue", nil, Ingress(From(Peers(NSPeer(L("team", "blue"))))))},
				NamespaceLabels: map[string]map[string]string{"z": L(NSLabel, "z", "team", "blue")}},
		}},
		{Name: "pod relabelled", Steps: []Step{
			{Name: "allow role client", Policies: []*networkingv1.NetworkPolicy{Policy("x", "clients", a, Ingress(From(Peers(NSPodPeer(nil, L("role", "client"))))))}},
			{Name: "y/b becomes a client", Policies: []*networkingv1.NetworkPolicy{Policy("x", "clients", a, Ingress(From(Peers(NSPodPeer(nil, L("role", "client"))))))},
				PodLabels: map[string]map[string]string{"y/b": L(PodLabel, "b", "role", "client")}},
			{Name: "x/a leaves the policy", Policies: []*networkingv1.NetworkPolicy{Policy("x", "clients", a, Ingress(From(Peers(NSPodPeer(nil, L("role", "client"))))))},
				PodLabels: map[string]map[string]string{"y/b": L(PodLabel, "b", "role", "client"), "x/a": L(PodLabel, "a2")}},
		}},
	}
	bad := func(name string, spec func(*networkingv1.NetworkPolicySpec)) Scenario {
		return Scenario{Name: "rejected: " + name, Invalid: true, Steps: one(
			Policy("x", "bad", a, spec),
			Policy("x", "good", a, Ingress(From(Peers(NSPeer(nsY)), Port(tcp, 80)))),
		)}
	}
	s = append(s,
		bad("invalid CIDR", Ingress(From(Peers(BlockPeer("10.244.0.0/33"))))),
		bad("except outside the cidr", Ingress(From(Peers(BlockPeer("10.244.0.0/24", "10.245.0.0/24"))))),
		bad("unknown protocol", Ingress(From(nil, Port("ICMP", 80)))),
		bad("endPort below port", Ingress(From(nil, Range(tcp, 81, 80)))),
		bad("egress with a bad CIDR isolates egress", func(s *networkingv1.NetworkPolicySpec) {
			s.PolicyTypes = []networkingv1.PolicyType{egr}
			s.Egress = []networkingv1.NetworkPolicyEgressRule{To(Peers(BlockPeer("nonsense")))}
		}),
	)
	return s
}

// Apply returns the bed's objects as they are at a step of sc: copies of
// w's namespaces and pods with the step's labels, and the step's policies.
func Apply(w *World, sc Scenario, step int) (*World, []*networkingv1.NetworkPolicy) {
	nsLabels := map[string]map[string]string{}
	podLabels := map[string]map[string]string{}
	for _, st := range sc.Steps[:step+1] {
		for k, v := range st.NamespaceLabels {
			nsLabels[k] = v
		}
		for k, v := range st.PodLabels {
			podLabels[k] = v
		}
	}
	out := &World{}
	for _, n := range w.Namespaces {
		n = n.DeepCopy()
		if l, ok := nsLabels[n.Name]; ok {
			n.Labels = l
		}
		out.Namespaces = append(out.Namespaces, n)
	}
	for _, p := range w.Pods {
		p = p.DeepCopy()
		if l, ok := podLabels[p.Namespace+"/"+p.Name]; ok {
			p.Labels = l
		}
		out.Pods = append(out.Pods, p)
	}
	return out, sc.Steps[step].Policies
}

// Keys lists the pods' keys, sorted.
func (w *World) Keys() []string {
	var out []string
	for _, p := range w.Pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	sort.Strings(out)
	return out
}
