package iptables_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/readyset"
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
	if len(rs.Sets) != 1 || len(rs.Sets[0].Members) != 9 || rs.Sets[0].Type != "hash:net,port" {
		t.Fatalf("sets %+v, want one union of the 9 pods on tcp:80", rs.Sets)
	}
}

// A pod selected by many policies each with its own ports still has one
// allow rule: one (peer, port) set lookup. What the set cannot hold
// (protocol-only ports, wide ranges) gets one rule per port match.
func TestRenderFlatWithManyPorts(t *testing.T) {
	w := nt.Addressed()
	var pols []*networkingv1.NetworkPolicy
	for i := range 100 {
		peer := nt.PodPeer(nt.L(nt.PodLabel, nt.PodNames[i%3]))
		port := nt.Port(corev1.ProtocolTCP, int32(1000+i))
		if i%3 == 1 {
			port = nt.Range(corev1.ProtocolUDP, int32(2000+i), int32(2002+i))
		}
		pols = append(pols, nt.Policy("x", fmt.Sprintf("p%03d", i), nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(peer), port))))
	}
	pols = append(pols,
		nt.Policy("x", "wide", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.PodPeer(nt.L(nt.PodLabel, "b"))), nt.Range(corev1.ProtocolTCP, 30000, 32767)))),
		nt.Policy("x", "sctp", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.PodPeer(nt.L(nt.PodLabel, "c"))), nt.AnyPort(corev1.ProtocolSCTP)))))
	rs := render(w, "node1", pols...)
	in := chain(rs, "WEFT-POL-I-")[0].Rules
	if len(in) != 4 || !strings.Contains(in[0], " src,dst ") || !strings.Contains(in[1], "-p sctp ") || !strings.Contains(in[2], "--dport 30000:32767 ") {
		t.Fatalf("x/a chain:\n%s", strings.Join(in, "\n"))
	}
	// x/a, x/b or x/c on each port: 67 single ports and 33 ranges of 3.
	for _, s := range rs.Sets {
		if s.Type == "hash:net,port" && len(s.Members) != 67+33*3 {
			t.Errorf("(peer, port) set has %d members, want %d", len(s.Members), 67+33*3)
		}
	}
}

func TestRenderBlocksAndPorts(t *testing.T) {
	w := nt.Addressed()
	rs := render(w, "node1", nt.Policy("x", "p", nt.L(nt.PodLabel, "a"),
		nt.Ingress(nt.From(nt.Peers(nt.BlockPeer("0.0.0.0/0", "10.244.1.0/24")), nt.Range(corev1.ProtocolUDP, 80, 81), nt.AnyPort(corev1.ProtocolSCTP)))))
	if len(rs.Sets) != 2 {
		t.Fatalf("sets %+v", rs.Sets)
	}
	members := map[string]string{}
	for _, s := range rs.Sets {
		members[s.Type] = strings.Join(s.Members, ",")
	}
	if members["hash:net,port"] != "0.0.0.0/1,udp:80,10.244.1.0/24,udp:80 nomatch,128.0.0.0/1,udp:80,0.0.0.0/1,udp:81,10.244.1.0/24,udp:81 nomatch,128.0.0.0/1,udp:81" ||
		members["hash:net"] != "0.0.0.0/1,10.244.1.0/24 nomatch,128.0.0.0/1" {
		t.Fatalf("set members %q", members)
	}
	in := chain(rs, "WEFT-POL-I-")[0].Rules
	if len(in) != 3 || !strings.Contains(in[0], " src,dst ") || !strings.Contains(in[1], " src -p sctp ") || in[2] != "-j WEFT-POL-DROP-IN" {
		t.Errorf("chain %q", in)
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
	if !strings.Contains(members["hash:net"], "::/1,8000::/1,fd00::/120 nomatch,fd00::a/128") || strings.Contains(members["hash:net"], "10.244.") {
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

// The source check comes first in both entry chains, before the shortcut
// for established flows; each family holds only its own addresses.
func TestRenderSourceCheck(t *testing.T) {
	srcs := []polipt.Source{{Port: "weftb", Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.3"), netip.MustParseAddr("fd00::3")}},
		{Port: "wefta", Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.2")}}}
	for _, family := range []int{4, 6} {
		rs := polipt.Render(policy.Desired{}, polipt.Config{NodeName: "node1", Family: family, PodPorts: "weft+", Sources: srcs})
		chains := map[string][]string{}
		for _, c := range rs.Chains {
			chains[c.Name] = c.Rules
		}
		jump := "-m physdev --physdev-in weft+ -j " + polipt.ChainSource
		for _, name := range []string{polipt.ChainForward, polipt.ChainInput} {
			if len(chains[name]) < 2 || chains[name][0] != jump || ruleIndex(chains[name], "ESTABLISHED") < 1 {
				t.Errorf("IPv%d %s = %q, want the source check first", family, name, chains[name])
			}
		}
		want := []string{"-s 10.244.1.2/32 -m physdev --physdev-in wefta -j RETURN", "-s 10.244.1.3/32 -m physdev --physdev-in weftb -j RETURN"}
		if family == 6 {
			want = []string{"-s fe80::/10 -j RETURN", "-s ::/128 -j RETURN", "-s fd00::3/128 -m physdev --physdev-in weftb -j RETURN"}
		}
		got := chains[polipt.ChainSource]
		if len(got) != len(want)+1 || strings.Join(got[:len(want)], "\n") != strings.Join(want, "\n") || !strings.HasSuffix(got[len(want)], "-j DROP") {
			t.Errorf("IPv%d %s:\n%s\nwant\n%s\nthen DROP", family, polipt.ChainSource, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	// Without PodPorts nothing is checked.
	for _, c := range polipt.Render(policy.Desired{}, polipt.Config{NodeName: "node1", Sources: srcs}).Chains {
		if c.Name == polipt.ChainSource {
			t.Error("source chain rendered without PodPorts")
		}
	}
}

func ruleIndex(rules []string, part string) int {
	return slices.IndexFunc(rules, func(r string) bool { return strings.Contains(r, part) })
}

// New pods are default-deny: WEFT-POL-PENDING drops what goes to a pod
// bridge for, or comes from a pod port with, an address not in the
// family's ready set, which the ruleset asks to exist without filling it.
// FORWARD checks before the shortcut for established flows, INPUT after
// it (the node's probes are answered); neighbour discovery passes first.
func TestRenderPending(t *testing.T) {
	for _, family := range []int{4, 6} {
		rs := polipt.Render(policy.Desired{}, polipt.Config{NodeName: "node1", Family: family, PodPorts: "weft+", PodBridges: []string{"weft0"}})
		chains := map[string][]string{}
		for _, c := range rs.Chains {
			chains[c.Name] = c.Rules
		}
		ready := readyset.Name4
		if family == 6 {
			ready = readyset.Name6
		}
		if len(rs.External) != 1 || rs.External[0].Name != ready || rs.External[0].Type != "hash:ip" {
			t.Errorf("IPv%d external sets %+v, want %s", family, rs.External, ready)
		}
		fwd, in := chains[polipt.ChainForward], chains[polipt.ChainInput]
		jump := "-j " + polipt.ChainPending
		if p, e := slices.Index(fwd, jump), ruleIndex(fwd, "ESTABLISHED"); p < 1 || p > e {
			t.Errorf("IPv%d FORWARD %q: want the pending check after the source check and before ESTABLISHED", family, fwd)
		}
		if p, e := slices.Index(in, jump), ruleIndex(in, "ESTABLISHED"); p < e || e < 1 {
			t.Errorf("IPv%d INPUT %q: want the pending check after ESTABLISHED", family, in)
		}
		if family == 6 {
			for _, c := range [][]string{fwd, in} {
				if nd := ruleIndex(c, "neighbour-advertisement"); nd < 0 || nd > slices.Index(c, jump) {
					t.Errorf("IPv6 %q: neighbour discovery must pass before the pending check", c)
				}
			}
		}
		got := strings.Join(chains[polipt.ChainPending], "\n")
		for _, want := range []string{
			"-o weft0 -m set ! --match-set " + ready + " dst -m addrtype --dst-type UNICAST",
			"-m physdev --physdev-in weft+ -m set ! --match-set " + ready + " src",
		} {
			if !strings.Contains(got, want) {
				t.Errorf("IPv%d %s lacks %q:\n%s", family, polipt.ChainPending, want, got)
			}
		}
		if family == 6 && !strings.HasPrefix(got, "-s fe80::/10 -j RETURN\n-d fe80::/10 -j RETURN") {
			t.Errorf("IPv6 %s does not let link-local traffic through first:\n%s", polipt.ChainPending, got)
		}
	}
	rs := polipt.Render(policy.Desired{}, polipt.Config{NodeName: "node1", PodPorts: "weft+"})
	if len(rs.External) != 0 || slices.ContainsFunc(rs.Chains, func(c polipt.Chain) bool { return c.Name == polipt.ChainPending }) {
		t.Error("pending check rendered without PodBridges")
	}
}
