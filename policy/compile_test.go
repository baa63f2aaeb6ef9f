package policy_test

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

func compile(w *nt.World, pols ...*networkingv1.NetworkPolicy) policy.Desired {
	return policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: pols})
}

func rulesOf(t *testing.T, d policy.Desired, key string) policy.PodRules {
	t.Helper()
	for _, p := range d.Pods {
		if p.Key == key {
			return p
		}
	}
	t.Fatalf("%s has no rules; isolated pods: %v", key, d.Pods)
	return policy.PodRules{}
}

func TestPolicyTypesDefaulting(t *testing.T) {
	w := nt.Addressed()
	d := compile(w,
		nt.Policy("x", "in-default", nt.L(nt.PodLabel, "a"), nt.Ingress()),
		nt.Policy("x", "eg-default", nt.L(nt.PodLabel, "b"), nt.Egress(nt.To(nil))),
		nt.Policy("x", "eg-empty", nt.L(nt.PodLabel, "c"), nt.Egress()))
	for key, want := range map[string][2]bool{"x/a": {true, false}, "x/b": {true, true}, "x/c": {true, false}} {
		r := rulesOf(t, d, key)
		if r.Ingress.Isolated != want[0] || r.Egress.Isolated != want[1] {
			t.Errorf("%s isolated ingress=%v egress=%v, want %v", key, r.Ingress.Isolated, r.Egress.Isolated, want)
		}
	}
	if len(d.Pods) != 3 {
		t.Errorf("%d pods isolated, want 3 (nothing outside x)", len(d.Pods))
	}
}

func TestNamedPortsResolvePerDestination(t *testing.T) {
	w := nt.Addressed()
	// y/b serves "web" on 8080, every other pod has no such port.
	w.Pod("y", "b").Spec.Containers[0].Ports = append(w.Pod("y", "b").Spec.Containers[0].Ports, corev1.ContainerPort{Name: "web", ContainerPort: 8080})
	d := compile(w,
		nt.Policy("x", "eg", nt.L(nt.PodLabel, "a"), nt.Types(networkingv1.PolicyTypeEgress), nt.Egress(nt.To(nil, nt.Named(corev1.ProtocolTCP, "web")))),
		nt.Policy("y", "in", nt.L(nt.PodLabel, "b"), nt.Ingress(nt.From(nil, nt.Named(corev1.ProtocolTCP, "web")))))
	xa, yb, yc := nt.IP(w.Pod("x", "a")), nt.IP(w.Pod("y", "b")), nt.IP(w.Pod("y", "c"))
	for _, c := range []struct {
		src, dst netip.Addr
		port     uint16
		want     bool
	}{
		{xa, yb, 8080, true}, {xa, yb, 80, false}, {xa, yc, 8080, false}, {yc, yb, 8080, true}, {yc, yb, 81, false},
	} {
		if got := d.Allows(c.src, c.dst, policy.TCP, c.port); got != c.want {
			t.Errorf("%s -> %s:%d allowed=%v, want %v", c.src, c.dst, c.port, got, c.want)
		}
	}
	r := rulesOf(t, d, "y/b")
	if len(r.Ingress.Rules) != 1 || len(r.Ingress.Rules[0].Ports) != 1 || r.Ingress.Rules[0].Ports[0] != (policy.PortRange{Protocol: policy.TCP, From: 8080, To: 8080}) {
		t.Errorf("y/b ingress rules %+v, want one rule on TCP 8080", r.Ingress.Rules)
	}
}

func TestSetIDsStableAndShared(t *testing.T) {
	w := nt.Addressed()
	p := nt.Policy("x", "p", nil, nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nt.L(nt.NSLabel, "y")), nt.BlockPeer("10.0.0.0/8", "10.1.0.0/16")))))
	d1 := compile(w, p)
	w.Namespace("z").Labels[nt.NSLabel] = "y"
	d2 := compile(w, p)
	id := setID(t, d1, "/ingress/0/pods")
	blockID := setID(t, d1, "/ingress/0/block/1")
	if got := len(d1.Sets[id].Addrs); got != 3 {
		t.Fatalf("set %s has %d addresses, want y's 3 pods", id, got)
	}
	if got := len(d2.Sets[id].Addrs); got != 6 {
		t.Fatalf("after relabelling z, set %s has %d addresses, want 6", id, got)
	}
	blk := d1.Sets[blockID]
	if blk.Kind != policy.SetNets || !blk.Contains(netip.MustParseAddr("10.2.0.1")) || blk.Contains(netip.MustParseAddr("10.1.2.3")) {
		t.Fatalf("block set %+v", blk)
	}
	// A changed spec gets new sets.
	p.Spec.Ingress[0].Ports = []networkingv1.NetworkPolicyPort{nt.Port(corev1.ProtocolTCP, 80)}
	if _, ok := compile(w, p).Sets[id]; ok {
		t.Fatalf("set %s survived a spec change", id)
	}
	// Every pod of x shares the same set, not a copy per pod.
	for _, pr := range d1.Pods {
		if len(pr.Ingress.Rules) != 1 || strings.Join(pr.Ingress.Rules[0].Peers, ",") != id+","+blockID {
			t.Fatalf("%s rules %+v", pr.Key, pr.Ingress.Rules)
		}
	}
}

func TestRejectedPolicyFailsClosed(t *testing.T) {
	w := nt.Addressed()
	bad := nt.Policy("x", "bad", nt.L(nt.PodLabel, "a"), nt.Types(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress),
		nt.Ingress(nt.From(nt.Peers(nt.BlockPeer("10.0.0.0/8", "11.0.0.0/16")))), nt.Egress(nt.To(nil, nt.Range(corev1.ProtocolTCP, 90, 80))))
	d := compile(w, bad)
	if len(d.Errors) != 2 {
		t.Fatalf("errors %v, want the except and the endPort", d.Errors)
	}
	for i, f := range []string{"spec.ingress[0].from[0].ipBlock.except[0]", "spec.egress[0].ports[0].endPort"} {
		if d.Errors[i].Policy != "x/bad" || d.Errors[i].Field != f {
			t.Errorf("error %d = %v, want x/bad %s", i, d.Errors[i], f)
		}
		if !strings.Contains(d.Errors[i].Error(), "x/bad") || !strings.Contains(d.Errors[i].Error(), f) {
			t.Errorf("message %q names neither key nor field", d.Errors[i])
		}
	}
	r := rulesOf(t, d, "x/a")
	if !r.Ingress.Isolated || !r.Egress.Isolated || len(r.Ingress.Rules)+len(r.Egress.Rules) != 0 {
		t.Fatalf("x/a = %+v, want isolated both ways with no rules", r)
	}
	// A bad pod selector: every pod of the namespace stays isolated.
	sel := nt.Policy("y", "bad-selector", nil, nt.Ingress(nt.From(nil)))
	sel.Spec.PodSelector.MatchExpressions = nt.Req("k", "Near", "v")
	d = compile(w, sel)
	if len(d.Errors) != 1 || d.Errors[0].Field != "spec.podSelector" || len(d.Pods) != 3 {
		t.Fatalf("bad selector: errors %v, %d isolated pods, want spec.podSelector and y's 3 pods", d.Errors, len(d.Pods))
	}
}

func TestValidateFields(t *testing.T) {
	for _, c := range []struct {
		name, field string
		pol         *networkingv1.NetworkPolicy
	}{
		{"cidr", "spec.ingress[0].from[0].ipBlock.cidr", nt.Policy("x", "p", nil, nt.Ingress(nt.From(nt.Peers(nt.BlockPeer("10.0.0.300/8")))))},
		{"except family", "spec.egress[0].to[0].ipBlock.except[0]", nt.Policy("x", "p", nil, nt.Egress(nt.To(nt.Peers(nt.BlockPeer("10.0.0.0/8", "fd00::/64")))))},
		{"except equal", "spec.egress[0].to[0].ipBlock.except[0]", nt.Policy("x", "p", nil, nt.Egress(nt.To(nt.Peers(nt.BlockPeer("10.0.0.0/8", "10.0.0.0/8")))))},
		{"protocol", "spec.ingress[0].ports[0].protocol", nt.Policy("x", "p", nil, nt.Ingress(nt.From(nil, nt.Port("icmp", 1))))},
		{"endPort named", "spec.ingress[0].ports[0].endPort", func() *networkingv1.NetworkPolicy {
			p := nt.Named(corev1.ProtocolTCP, "web")
			end := int32(90)
			p.EndPort = &end
			return nt.Policy("x", "p", nil, nt.Ingress(nt.From(nil, p)))
		}()},
		{"port zero", "spec.ingress[0].ports[0].port", nt.Policy("x", "p", nil, nt.Ingress(nt.From(nil, nt.Port(corev1.ProtocolTCP, 0))))},
		{"type", "spec.policyTypes[0]", nt.Policy("x", "p", nil, nt.Types("Sideways"))},
		{"empty peer", "spec.ingress[0].from[0]", nt.Policy("x", "p", nil, nt.Ingress(nt.From(nt.Peers(networkingv1.NetworkPolicyPeer{}))))},
	} {
		errs := policy.Validate(c.pol)
		if len(errs) != 1 || errs[0].Field != c.field {
			t.Errorf("%s: errors %v, want one on %s", c.name, errs, c.field)
		}
	}
	if errs := policy.Validate(nt.Policy("x", "ok", nil, nt.Ingress(nt.From(nt.Peers(nt.BlockPeer("10.0.0.0/8", "10.1.0.0/16")), nt.Range(corev1.ProtocolSCTP, 1, 65535))))); errs != nil {
		t.Errorf("valid policy rejected: %v", errs)
	}
}

func TestHostNetworkAndPendingPodsIgnored(t *testing.T) {
	w := nt.Addressed()
	w.Pod("x", "a").Spec.HostNetwork = true
	w.Pod("x", "b").Status = corev1.PodStatus{}
	d := compile(w, nt.Policy("x", "deny", nil, nt.Ingress()))
	if len(d.Pods) != 1 || d.Pods[0].Key != "x/c" {
		t.Fatalf("isolated %v, want only x/c", d.Pods)
	}
}

func setID(t *testing.T, d policy.Desired, suffix string) string {
	t.Helper()
	for id := range d.Sets {
		if strings.HasPrefix(id, "x/p@") && strings.HasSuffix(id, suffix) {
			return id
		}
	}
	t.Fatalf("no set *%s in %v", suffix, d.Sets)
	return ""
}
