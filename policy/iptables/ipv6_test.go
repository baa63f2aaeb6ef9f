package iptables_test

import (
	"time"

	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/oracle"
)

// TestIPv6 runs the selector-based scenarios and random sets over IPv6 on
// the dual-stack bed, with the IPv6 applier, and holds real probes against
// the oracle; the IPv4 rules are absent, so IPv4 stays open meanwhile.
func TestIPv6(t *testing.T) {
	b := newBed(t)
	a := polipt.Applier{Family: 6}
	check := func(w *nt.World, pols []*networkingv1.NetworkPolicy, what string) {
		t.Helper()
		d := policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: pols})
		if _, err := a.Apply(polipt.Render(d, polipt.Config{NodeName: nodeName, Family: 6})); err != nil {
			t.Fatalf("%s: apply: %v", what, err)
		}
		want := oracle.Expect(oracle.World{Namespaces: w.Namespaces, Policies: pols}, w.Pods, nt.Ports, nt.Protocols)
		got, err := nt.WaitMatch(time.Now().Add(5*time.Second), b.Targets6, want)
		if err != nil {
			t.Fatalf("%s over IPv6: %v\n%s", what, err, oracle.SideBySide(want, got))
		}
	}
	ran := 0
	for _, sc := range nt.Scenarios(b.World) {
		for i, st := range sc.Steps {
			w, pols := nt.Apply(b.World, sc, i)
			if nt.UsesIPBlock(pols) {
				continue
			}
			check(w, pols, sc.Name+": "+st.Name)
			ran++
		}
	}
	r := newRand()
	for i := 0; ran < 60 && i < 200; i++ {
		pols := nt.Random(r, b.World)
		if nt.UsesIPBlock(pols) {
			continue
		}
		check(b.World, pols, "random set "+itoa(i))
		ran++
	}
	// IPv4 is the other applier's: still open to all.
	b.check(t, b.World, nil, "IPv4 untouched by the IPv6 applier")
	if err := a.Cleanup(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d IPv6 grids compared", ran)
}
