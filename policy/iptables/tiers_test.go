package iptables_test

import (
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/oracle"
)

// adminPolicies are n Admin ClusterNetworkPolicies over namespace x's
// pods, each one ingress rule from another pod on a port of its own
// (Accept, Deny and Pass in turn), and one, the second, without ports.
func adminPolicies(n int) []*cnp.ClusterNetworkPolicy {
	actions := []cnp.ClusterNetworkPolicyRuleAction{cnp.ClusterNetworkPolicyRuleActionDeny, cnp.ClusterNetworkPolicyRuleActionAccept, cnp.ClusterNetworkPolicyRuleActionPass}
	var out []*cnp.ClusterNetworkPolicy
	for k := range n {
		var protos []cnp.ClusterNetworkPolicyProtocol
		if k != 1 {
			protos = append(protos, nt.ClusterPort(corev1.ProtocolTCP, int32(1000+k)))
		}
		peer := nt.PodsPeer(metav1.LabelSelector{MatchLabels: nt.L(nt.NSLabel, nt.NamespaceNames[k%3])}, metav1.LabelSelector{MatchLabels: nt.L(nt.PodLabel, nt.PodNames[(k/3)%3])})
		p := nt.ClusterPolicy(fmt.Sprintf("admin-%04d", k), cnp.AdminTier, int32(k%100), metav1.LabelSelector{MatchLabels: nt.L(nt.NSLabel, "x")})
		p.Spec.Ingress = []cnp.ClusterNetworkPolicyIngressRule{nt.ClusterIngress(actions[k%3], []cnp.ClusterNetworkPolicyEgressPeer{peer}, protos...)}
		out = append(out, p)
	}
	return out
}

// TestTiersFlat: a pod's tier chain has as many rules with 500 Admin
// ClusterNetworkPolicies selecting it as with 3 of the same kinds (ports
// of their own, every action, a rule without ports): the rules selecting
// the pod change set members, not rules.
func TestTiersFlat(t *testing.T) {
	w := nt.Addressed()
	count := func(n int) (int, []string) {
		d := policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, ClusterPolicies: adminPolicies(n)})
		rs := polipt.Render(d, polipt.Config{NodeName: "node1"})
		chains := chain(rs, "WEFT-POL-I-")
		if len(chains) != 3 {
			t.Fatalf("%d policies: %d pod ingress chains, want 3", n, len(chains))
		}
		members := 0
		for _, s := range rs.Sets {
			members += len(s.Members)
		}
		if n == 500 && members == 0 {
			t.Fatalf("no set members")
		}
		return len(chains[0].Rules), chains[0].Rules
	}
	few, rules := count(3)
	many, manyRules := count(500)
	if few != many || many > 5 {
		t.Fatalf("pod chain with 3 policies: %d rules, with 500: %d; want the same, at most 5\n%s\n--\n%s", few, many, strings.Join(rules, "\n"), strings.Join(manyRules, "\n"))
	}
	t.Logf("pod chain with 500 Admin policies:\n%s", strings.Join(manyRules, "\n"))
}

// TestManyTiers holds a set of about a hundred random
// ClusterNetworkPolicies against the oracle on the kernel (large tiers,
// overlapping ports, peers of every kind), then the same without their
// networks peers (IPv4 addresses on the bed) in both families.
func TestManyTiers(t *testing.T) {
	b := newBed(t)
	r := rand.New(rand.NewPCG(21, 34))
	var cluster []*cnp.ClusterNetworkPolicy
	for i := 0; len(cluster) < 100; i++ {
		for j, p := range nt.RandomCluster(r, b.World) {
			p.Name = fmt.Sprintf("many-%d-%d", i, j)
			cluster = append(cluster, p)
		}
	}
	// Then the same without networks peers (IPv4 only on the bed), in
	// both families, on the same appliers.
	var local []*cnp.ClusterNetworkPolicy
	for _, p := range cluster {
		p = p.DeepCopy()
		p.Spec.Egress = slices.DeleteFunc(p.Spec.Egress, func(e cnp.ClusterNetworkPolicyEgressRule) bool {
			return slices.ContainsFunc(e.To, func(p cnp.ClusterNetworkPolicyEgressPeer) bool { return len(p.Networks) > 0 })
		})
		local = append(local, p)
	}
	a4, a6 := polipt.Applier{}, polipt.Applier{Family: 6}
	for i, set := range [][]*cnp.ClusterNetworkPolicy{cluster, local} {
		d := policy.Compile(policy.Input{Pods: b.World.Pods, Namespaces: b.World.Namespaces, ClusterPolicies: set})
		for _, a := range []*polipt.Applier{&a4, &a6} {
			if _, err := a.Apply(polipt.Render(d, polipt.Config{NodeName: nodeName, Family: max(a.Family, 4)})); err != nil {
				t.Fatalf("set %d, IPv%d: %v", i, max(a.Family, 4), err)
			}
		}
		want := oracle.Expect(oracle.World{Namespaces: b.World.Namespaces, ClusterPolicies: set}, b.World.Pods, nt.Ports, nt.Protocols)
		b.CheckMatrix(t, b.Targets, want, fmt.Sprintf("set %d of %d random cluster policies (IPv4)", i, len(set)))
		if !nt.UsesNetworks(set) {
			b.CheckMatrix(t, b.Targets6, want, fmt.Sprintf("set %d of %d random cluster policies (IPv6)", i, len(set)))
		} else if i == 1 {
			t.Fatal("networks peers left")
		}
	}
	// The kernel writes the pods' tier chains back as rendered, so a full
	// apply (the periodic resync) leaves them and their counters alone.
	d := policy.Compile(policy.Input{Pods: b.World.Pods, Namespaces: b.World.Namespaces, ClusterPolicies: local})
	for _, fam := range []int{4, 6} {
		tool := map[int]string{4: "iptables-save", 6: "ip6tables-save"}[fam]
		out, err := exec.Command(tool, "-t", "filter").Output()
		if err != nil {
			t.Fatal(err)
		}
		kernel := map[string][]string{}
		for _, line := range strings.Split(string(out), "\n") {
			if rest, ok := strings.CutPrefix(line, "-A "); ok {
				c, r, _ := strings.Cut(rest, " ")
				kernel[c] = append(kernel[c], r)
			}
		}
		n := 0
		for _, c := range polipt.Render(d, polipt.Config{NodeName: nodeName, Family: fam}).Chains {
			if slices.ContainsFunc([]string{"WEFT-POL-I-", "WEFT-POL-IR-", "WEFT-POL-E-", "WEFT-POL-ER-"}, func(p string) bool { return strings.HasPrefix(c.Name, p) }) {
				n++
				if !slices.Equal(kernel[c.Name], c.Rules) {
					t.Fatalf("IPv%d: %s holds\n%s\nrendered\n%s", fam, c.Name, strings.Join(kernel[c.Name], "\n"), strings.Join(c.Rules, "\n"))
				}
			}
		}
		if n == 0 {
			t.Fatalf("IPv%d: no pod chains", fam)
		}
	}
}
