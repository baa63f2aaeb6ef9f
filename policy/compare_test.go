package policy_test

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/weftnet/weft/policy"
	"github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/oracle"
)

// compiled evaluates the compiled rules over the bed's whole matrix.
func compiled(w *netpoltest.World, pols []*networkingv1.NetworkPolicy, cluster ...*cnp.ClusterNetworkPolicy) (oracle.Matrix, policy.Desired) {
	d := policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: pols, ClusterPolicies: cluster})
	byKey := map[string]*corev1.Pod{}
	for _, p := range w.Pods {
		byKey[p.Namespace+"/"+p.Name] = p
	}
	m := oracle.NewMatrix(w.Keys(), netpoltest.Ports, netpoltest.Protocols)
	for _, c := range m.Cases() {
		m.Cells[c] = d.Allows(netpoltest.IP(byKey[c.From]), netpoltest.IP(byKey[c.To]), policy.Protocol(c.Proto), uint16(c.Port))
	}
	return m, d
}

func expected(w *netpoltest.World, pols []*networkingv1.NetworkPolicy, cluster ...*cnp.ClusterNetworkPolicy) oracle.Matrix {
	return oracle.Expect(oracle.World{Namespaces: w.Namespaces, Policies: pols, ClusterPolicies: cluster}, w.Pods, netpoltest.Ports, netpoltest.Protocols)
}

// TestScenariosCompiledMatchOracle holds the compiler (through the rule
// evaluator) against the oracle on every upstream scenario.
func TestScenariosCompiledMatchOracle(t *testing.T) {
	base := netpoltest.Addressed()
	scenarios := netpoltest.Scenarios(base)
	for _, sc := range scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			for i, st := range sc.Steps {
				w, pols := netpoltest.Apply(base, sc, i)
				want := expected(w, pols)
				got, d := compiled(w, pols)
				if diff := want.Diff(got); len(diff) > 0 {
					t.Fatalf("step %q: %d cells differ\n%s", st.Name, len(diff), oracle.SideBySide(want, got))
				}
				if sc.Invalid && len(d.Errors) == 0 {
					t.Fatalf("step %q: the bad policy was not rejected", st.Name)
				}
				if !sc.Invalid && len(d.Errors) > 0 {
					t.Fatalf("step %q: rejected %v", st.Name, d.Errors)
				}
			}
		})
	}
}

// TestRandomCompiledMatchOracle compares compiler and oracle over 200
// random policy sets; the grids must also not be trivial overall.
func TestRandomCompiledMatchOracle(t *testing.T) {
	w := netpoltest.Addressed()
	r := rand.New(rand.NewPCG(1, 2))
	allowed, denied := 0, 0
	for i := range 200 {
		pols := netpoltest.Random(r, w)
		want := expected(w, pols)
		got, d := compiled(w, pols)
		if len(d.Errors) > 0 {
			t.Fatalf("set %d: generated policy rejected: %v", i, d.Errors)
		}
		if diff := want.Diff(got); len(diff) > 0 {
			t.Fatalf("set %d: %d cells differ\n%s\npolicies: %s", i, len(diff), oracle.SideBySide(want, got), dump(pols))
		}
		for _, v := range want.Cells {
			if v {
				allowed++
			} else {
				denied++
			}
		}
	}
	if allowed == 0 || denied == 0 {
		t.Fatalf("random sets are trivial: %d allowed, %d denied cells", allowed, denied)
	}
	t.Logf("%d allowed, %d denied cells over 200 sets", allowed, denied)
}

// TestRandomClusterCompiledMatchOracle compares compiler and oracle over
// 400 random sets of ClusterNetworkPolicies of both tiers, with and
// without NetworkPolicies beside them; every action must decide some
// cells, and Pass must matter somewhere.
func TestRandomClusterCompiledMatchOracle(t *testing.T) {
	w := netpoltest.Addressed()
	r := rand.New(rand.NewPCG(3, 4))
	decided := map[policy.Tier]map[policy.Action]int{policy.TierAdmin: {}, policy.TierBaseline: {}}
	for i := range 400 {
		var pols []*networkingv1.NetworkPolicy
		if i%2 == 1 {
			pols = netpoltest.Random(r, w)
		}
		cluster := netpoltest.RandomCluster(r, w)
		want := expected(w, pols, cluster...)
		got, d := compiled(w, pols, cluster...)
		if len(d.Errors) > 0 {
			t.Fatalf("set %d: generated policy rejected: %v", i, d.Errors)
		}
		if diff := want.Diff(got); len(diff) > 0 {
			t.Fatalf("set %d: %d cells differ\n%s\npolicies: %s\ncluster policies: %s", i, len(diff), oracle.SideBySide(want, got), dump(pols), dumpCluster(cluster))
		}
		for _, c := range got.Cases() {
			x := d.Explain(netpoltest.IP(byKey(w, c.From)), netpoltest.IP(byKey(w, c.To)), policy.Protocol(c.Proto), uint16(c.Port))
			for _, dec := range []*policy.Decision{x.Egress, x.Ingress} {
				if dec == nil {
					continue
				}
				if decided[dec.Tier] != nil {
					decided[dec.Tier][dec.Action]++
				}
				if len(dec.Passed) > 0 { // an Admin rule passed it on
					decided[policy.TierAdmin][policy.Pass]++
				}
			}
		}
	}
	for tier, actions := range decided {
		for _, a := range []policy.Action{policy.Accept, policy.Deny, policy.Pass} {
			if actions[a] == 0 {
				t.Errorf("no cell decided by a %s rule of the %s tier (or passed on to it): the sets are too narrow", a, tier)
			}
		}
	}
	t.Logf("decisions over 400 sets: %v", decided)
}

func byKey(w *netpoltest.World, key string) *corev1.Pod {
	for _, p := range w.Pods {
		if p.Namespace+"/"+p.Name == key {
			return p
		}
	}
	panic("no pod " + key)
}

func dumpCluster(pols []*cnp.ClusterNetworkPolicy) string {
	s := ""
	for _, p := range pols {
		b, _ := json.Marshal(p.Spec)
		s += p.Name + ": " + string(b) + "\n"
	}
	return s
}

func dump(pols []*networkingv1.NetworkPolicy) string {
	s := ""
	for _, p := range pols {
		s += p.Namespace + "/" + p.Name + ": " + p.Spec.String() + "\n"
	}
	return s
}
