package iptables_test

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

func render(w *nt.World, node string, pols ...*networkingv1.NetworkPolicy) *polipt.Ruleset {
	d := policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: pols})
	return polipt.Render(d, polipt.Config{NodeName: node})
}

func chain(rs *polipt.Ruleset, prefix string) []polipt.Chain {
	var out []polipt.Chain
	for _, c := range rs.Chains {
		if strings.HasPrefix(c.Name, prefix) {
			out = append(out, c)
		}
	}
	return out
}

// Only this node's pods get chains; names stay within iptables' limits.
func TestRenderOnlyLocalPods(t *testing.T) {
	w := nt.Addressed() // x on node1, y on node2, z on node3
	rs := render(w, "node2", nt.Policy("x", "deny", nil, nt.Ingress()), nt.Policy("y", "deny", nil, nt.Types(networkingv1.PolicyTypeEgress)))
	if in, out := chain(rs, "WEFT-POL-I-"), chain(rs, "WEFT-POL-E-"); len(in) != 0 || len(out) != 3 {
		t.Fatalf("node2 has %d ingress and %d egress pod chains, want 0 and 3", len(in), len(out))
	}
	for _, c := range rs.Chains {
		if len(c.Name) > 28 {
			t.Errorf("chain name %s too long", c.Name)
		}
	}
	for _, s := range rs.Sets {
		if len(s.Name) > 31 {
			t.Errorf("set name %s too long", s.Name)
		}
	}
}

// A pod selected by many policies with the same ports has one rule per
// port list, matching the union of their peers: the chain stays flat.
func TestRenderFlatWithManyPolicies(t *testing.T) {
	w := nt.Addressed()
	var pols []*networkingv1.NetworkPolicy
	for i := range 100 {
		peer := nt.PodPeer(nt.L(nt.PodLabel, nt.PodNames[i%3]))
		if i%2 == 1 {
			peer = nt.NSPeer(nt.L(nt.NSLabel, nt.NamespaceNames[i%3]))
		}
		pols = append(pols, nt.Policy("x", fmt.Sprintf("p%03d", i), nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(peer), nt.Port(corev1.ProtocolTCP, 80)))))
	}
	rs := render(w, "node1", pols...)
	in := chain(rs, "WEFT-POL-I-")
	if len(in) != 1 {
		t.Fatalf("%d ingress chains, want x/a's", len(in))
	}
	// One allow rule, the drop.
	if len(in[0].Rules) != 2 {
		t.Fatalf("x/a chain has %d rules, want 2:\n%s", len(in[0].Rules), strings.Join(in[0].Rules, "\n"))
	}
	// peers: pods of x (podSelector) ∪ all pods of x, y and z (nsSelector)
	if len(rs.Sets) != 1 || len(rs.Sets[0].Members) != 9 {
		t.Fatalf("sets %+v, want one union of the 9 pods", rs.Sets)
	}
}

func TestRenderBlocksAndPorts(t *testing.T) {
	w := nt.Addressed()
	rs := render(w, "node1", nt.Policy("x", "p", nt.L(nt.PodLabel, "a"),
		nt.Ingress(nt.From(nt.Peers(nt.BlockPeer("0.0.0.0/0", "10.244.1.0/24")), nt.Range(corev1.ProtocolUDP, 80, 81), nt.AnyPort(corev1.ProtocolSCTP)))))
	if len(rs.Sets) != 1 || rs.Sets[0].Type != "hash:net" ||
		strings.Join(rs.Sets[0].Members, ",") != "0.0.0.0/1,128.0.0.0/1,10.244.1.0/24 nomatch" {
		t.Fatalf("sets %+v", rs.Sets)
	}
	in := chain(rs, "WEFT-POL-I-")[0].Rules
	want := []string{"-p udp -m udp --dport 80:81 ", "-p sctp "}
	for i, w := range want {
		if !strings.Contains(in[i], w) || !strings.Contains(in[i], "--match-set "+rs.Sets[0].Name+" src") {
			t.Errorf("rule %d = %q, want %q from the set", i, in[i], w)
		}
	}
}

func TestRenderIPv6(t *testing.T) {
	w := nt.Addressed()
	for i, p := range w.Pods {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: fmt.Sprintf("fd00::%x", 10+i)})
	}
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "p", nil, nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nil), nt.BlockPeer("::/0", "fd00::/120"), nt.BlockPeer("10.0.0.0/8")))))}
	d := policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: pols})
	v4, v6 := polipt.Render(d, polipt.Config{NodeName: "node1"}), polipt.Render(d, polipt.Config{NodeName: "node1", Family: 6})
	names := map[string]bool{}
	for _, s := range v4.Sets {
		names[s.Name] = true
		if !strings.HasPrefix(s.Name, "WEFT-POL-") {
			t.Errorf("IPv4 set %s", s.Name)
		}
	}
	members := map[string]string{}
	for _, s := range v6.Sets {
		if !strings.HasPrefix(s.Name, "WEFT-POL6-") || names[s.Name] {
			t.Errorf("IPv6 set %s collides with the IPv4 ones", s.Name)
		}
		members[s.Type] += strings.Join(s.Members, ",") + ";"
	}
	if !strings.Contains(members["hash:net"], "::/1,8000::/1,fd00::/120 nomatch") || !strings.Contains(members["hash:ip"], "fd00::a") ||
		strings.Contains(members["hash:ip"], "10.244.") {
		t.Errorf("IPv6 set members %v", members)
	}
	var fwd, dispatch []string
	for _, c := range v6.Chains {
		switch c.Name {
		case polipt.ChainForward:
			fwd = c.Rules
		case polipt.ChainIngress:
			dispatch = c.Rules
		}
	}
	if len(dispatch) != 3 || !strings.HasPrefix(dispatch[0], "-d fd00::a/128 ") {
		t.Errorf("IPv6 dispatch %q", dispatch)
	}
	if !strings.Contains(strings.Join(fwd, "\n"), "neighbour-solicitation") {
		t.Errorf("IPv6 FORWARD chain lacks neighbour discovery: %q", fwd)
	}
}
