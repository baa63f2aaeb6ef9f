package nftables_test

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
	polnft "github.com/weftnet/weft/policy/nftables"
)

func TestMain(m *testing.M) { os.Exit(netnsutil.RunTests(m)) }

// bed is the shared kernel bed with this backend's hook.
type bed struct {
	*nt.Bed
	a *polnft.Applier
	// checkSources makes apply hold pod traffic to its sources; pending
	// holds pods whose addresses are not ready.
	checkSources, pending bool
	last                  polnft.Stats
}

func newBed(t *testing.T) *bed {
	t.Helper()
	b := &bed{Bed: nt.NewBed(t)}
	a, err := polnft.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.a = a
	t.Cleanup(func() { _ = a.Cleanup(context.Background()) })
	return b
}

func (b *bed) config() polnft.Config {
	cfg := polnft.Config{NodeName: nt.BedNode, LogDrops: true}
	if b.checkSources {
		cfg.PodPorts = nt.BedPortPattern
		for _, p := range b.Ports {
			cfg.Sources = append(cfg.Sources, polnft.Source{Port: p.Name, Addrs: p.Addrs})
		}
	}
	if b.pending {
		cfg.PodBridges = nt.BedBridges
	}
	return cfg
}

func (b *bed) apply(t *testing.T, w *nt.World, pols []*networkingv1.NetworkPolicy) {
	t.Helper()
	st, err := b.a.Apply(context.Background(), polnft.Render(nt.Compile(w, pols), b.config()))
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	b.last = st
}

// check holds both families against the oracle (IPv6 only for policies
// without ipBlocks, which are IPv4 on the bed).
func (b *bed) check(t *testing.T, w *nt.World, pols []*networkingv1.NetworkPolicy, what string) {
	t.Helper()
	b.Check(t, b.Targets, w, pols, what+" (IPv4)")
	if !nt.UsesIPBlock(pols) {
		b.Check(t, b.Targets6, w, pols, what+" (IPv6)")
	}
}

func nft(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("nft", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %v: %v: %s", args, err, out)
	}
	return string(out)
}

func newRand() *rand.Rand { return rand.New(rand.NewPCG(7, 11)) }

// TestScenarios runs every upstream scenario (and the rejected-policy
// ones) with real TCP and UDP probes between pod namespaces over IPv4 and
// IPv6, holding each step's full grid against the oracle. One applier
// carries over from scenario to scenario, so partial applies (element
// diffs, new and deleted chains) are exercised too. Then the drop
// counters, and cleanup leaving a foreign table alone.
func TestScenarios(t *testing.T) {
	b := newBed(t)
	nft(t, "add", "table", "inet", "filter")
	nft(t, "add", "chain", "inet", "filter", "forward", "{ type filter hook forward priority 0; policy accept; }")
	nft(t, "add", "rule", "inet", "filter", "forward", "counter")
	for _, sc := range nt.Scenarios(b.World) {
		for i, st := range sc.Steps {
			w, pols := nt.Apply(b.World, sc, i)
			b.apply(t, w, pols)
			b.check(t, w, pols, sc.Name+": "+st.Name)
		}
	}
	in, out, err := b.a.Drops(context.Background())
	if err != nil || in == 0 || out == 0 {
		t.Fatalf("drop counters ingress=%d egress=%d (%v), want both counted", in, out, err)
	}
	if err := b.a.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tables := nft(t, "list", "tables"); strings.Contains(tables, polnft.TableName) || !strings.Contains(tables, "table inet filter") {
		t.Fatalf("after cleanup: %s", tables)
	}
}

// TestRandom holds 50 random policy sets against the oracle on the kernel.
func TestRandom(t *testing.T) {
	b := newBed(t)
	r := newRand()
	for i := range 50 {
		pols := nt.Random(r, b.World)
		b.apply(t, b.World, pols)
		b.check(t, b.World, pols, "random set "+strconv.Itoa(i))
	}
}

// TestRandomTiers holds 40 random sets of ClusterNetworkPolicies of both
// tiers (half of them beside random NetworkPolicies) against the oracle
// on the kernel, over IPv4 and IPv6, with one applier throughout: tier
// chains and sets come, change and go by partial applies.
func TestRandomTiers(t *testing.T) {
	b := newBed(t)
	b.RandomTiered(t, 40, func(d policy.Desired) error {
		_, err := b.a.Apply(context.Background(), polnft.Render(d, b.config()))
		return err
	})
}

// TestCheck: the kernel takes every rule form Render writes (the start-up
// check the agent runs before its first apply).
func TestCheck(t *testing.T) {
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	a, err := polnft.New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestDropLogged: with a log group, a dropped connection attempt reaches
// that nflog group with its direction and flow (the agent's deny log).
func TestDropLogged(t *testing.T) {
	b := newBed(t)
	cfg := b.config()
	cfg.LogGroup = 7710
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "deny-a", nt.L(nt.PodLabel, "a"))}
	if _, err := b.a.Apply(context.Background(), polnft.Render(nt.Compile(b.World, pols), cfg)); err != nil {
		t.Fatal(err)
	}
	b.CheckDropLogged(t, cfg.LogGroup, "y/b", "x/a")
}
