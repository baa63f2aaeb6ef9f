package iptables_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/oracle"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

func (b *bed) apply(t *testing.T, a *polipt.Applier, w *nt.World, pols []*networkingv1.NetworkPolicy) policy.Desired {
	t.Helper()
	d := policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: pols})
	cfg := polipt.Config{NodeName: nodeName, LogDrops: true, Family: a.Family}
	if b.checkSources {
		cfg.PodPorts, cfg.Sources = "v+", b.sources()
	}
	if b.pending {
		cfg.PodBridges = []string{"weft0", "weft1"}
	}
	if _, err := a.Apply(polipt.Render(d, cfg)); err != nil {
		t.Fatalf("apply: %v", err)
	}
	return d
}

func (b *bed) check(t *testing.T, w *nt.World, pols []*networkingv1.NetworkPolicy, what string) {
	t.Helper()
	want := oracle.Expect(oracle.World{Namespaces: w.Namespaces, Policies: pols}, w.Pods, nt.Ports, nt.Protocols)
	got, err := nt.WaitMatch(time.Now().Add(5*time.Second), b.Targets, want)
	if err != nil {
		t.Fatalf("%s: %v\n%s", what, err, oracle.SideBySide(want, got))
	}
}

// TestScenarios runs every upstream scenario (and the rejected-policy ones)
// with real TCP and UDP probes between pod namespaces, holding each step's
// full grid against the oracle. One applier carries over from scenario to
// scenario, so updates, deletions and set swaps are exercised too.
func TestScenarios(t *testing.T) {
	b := newBed(t)
	var a polipt.Applier
	for _, sc := range nt.Scenarios(b.World) {
		for i, st := range sc.Steps {
			w, pols := nt.Apply(b.World, sc, i)
			b.apply(t, &a, w, pols)
			b.check(t, w, pols, sc.Name+": "+st.Name)
		}
	}
	in, out, err := a.Drops()
	if err != nil || in == 0 || out == 0 {
		t.Fatalf("drop counters ingress=%d egress=%d (%v), want both counted", in, out, err)
	}
	if err := a.Cleanup(); err != nil {
		t.Fatal(err)
	}
	save, _ := exec.Command("iptables-save", "-t", "filter").Output()
	sets, _ := exec.Command("ipset", "list", "-n").Output()
	if strings.Contains(string(save), "WEFT-POL") || strings.TrimSpace(string(sets)) != "" {
		t.Fatalf("cleanup left:\n%s\n%s", save, sets)
	}
}

// TestRandom holds 50 random policy sets against the oracle on the kernel.
func TestRandom(t *testing.T) {
	b := newBed(t)
	var a polipt.Applier
	r := newRand()
	for i := range 50 {
		pols := nt.Random(r, b.World)
		b.apply(t, &a, b.World, pols)
		b.check(t, b.World, pols, "random set "+itoa(i))
	}
}

// TestNodeReachesIsolatedPods: kubelet probes come from the node itself.
func TestNodeReachesIsolatedPods(t *testing.T) {
	b := newBed(t)
	var a polipt.Applier
	deny := []*networkingv1.NetworkPolicy{nt.Policy("x", "deny", nil, nt.Types(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress))}
	b.apply(t, &a, b.World, deny)
	b.check(t, b.World, deny, "deny all in x")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", b.Targets["x/a"].IP+":80")
	if err != nil {
		t.Fatalf("node to isolated pod: %v", err)
	}
	c.Close()
}

// TestJumpStaysFirst: a jump inserted later in FORWARD (the proxy's) is
// moved behind the policy jump on the next apply.
func TestJumpStaysFirst(t *testing.T) {
	b := newBed(t)
	var a polipt.Applier
	b.apply(t, &a, b.World, nil)
	if out, err := exec.Command("iptables", "-I", "FORWARD", "1", "-m", "comment", "--comment", "someone else", "-j", "ACCEPT").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	deny := []*networkingv1.NetworkPolicy{nt.Policy("x", "deny", nil, nt.Ingress())}
	b.apply(t, &a, b.World, deny)
	out, _ := exec.Command("iptables", "-S", "FORWARD").Output()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 3 || !strings.Contains(lines[1], polipt.ChainForward) {
		t.Fatalf("FORWARD:\n%s", out)
	}
	b.check(t, b.World, deny, "deny in x behind an ACCEPT jump")
}

// TestForceFullRepairsDrift: a policy chain flushed behind weft's back is
// rewritten by the next full apply (the agent's periodic resync).
func TestForceFullRepairsDrift(t *testing.T) {
	b := newBed(t)
	var a polipt.Applier
	deny := []*networkingv1.NetworkPolicy{nt.Policy("x", "deny", nil, nt.Ingress())}
	b.apply(t, &a, b.World, deny)
	b.check(t, b.World, deny, "deny in x")
	if out, err := exec.Command("iptables", "-F", polipt.ChainIngress).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	b.check(t, b.World, nil, "after the drift (nothing enforced)")
	b.apply(t, &a, b.World, deny) // incremental: trusts its own record
	b.check(t, b.World, nil, "incremental apply does not look")
	a.ForceFull()
	b.apply(t, &a, b.World, deny)
	b.check(t, b.World, deny, "repaired")
}

// TestRandomTiers holds 40 random sets of ClusterNetworkPolicies of both
// tiers (half of them beside random NetworkPolicies) against the oracle
// on the kernel, IPv4 and IPv6 appliers both carrying over from set to
// set (tier chains and sets come, change and go).
func TestRandomTiers(t *testing.T) {
	b := newBed(t)
	a4, a6 := polipt.Applier{}, polipt.Applier{Family: 6}
	b.RandomTiered(t, 40, func(d policy.Desired) error {
		for _, a := range []*polipt.Applier{&a4, &a6} {
			if _, err := a.Apply(polipt.Render(d, polipt.Config{NodeName: nodeName, LogDrops: true, Family: a.Family})); err != nil {
				return fmt.Errorf("IPv%d: %w", max(a.Family, 4), err)
			}
		}
		return nil
	})
}

// TestDropLogged: with a log group, a dropped connection attempt reaches
// that nflog group with its direction and flow (the agent's deny log).
func TestDropLogged(t *testing.T) {
	b := newBed(t)
	var a polipt.Applier
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "deny-a", nt.L(nt.PodLabel, "a"))}
	d := policy.Compile(policy.Input{Pods: b.World.Pods, Namespaces: b.World.Namespaces, Policies: pols})
	if _, err := a.Apply(polipt.Render(d, polipt.Config{NodeName: nodeName, LogDrops: true, LogGroup: 7710})); err != nil {
		t.Fatal(err)
	}
	b.CheckDropLogged(t, 7710, "y/b", "x/a")
}
