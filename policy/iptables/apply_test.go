package iptables_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/policy"
	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/readyset"
)

// recorder keeps the calls in order and fakes just enough kernel state.
type recorder struct {
	calls  []string
	sets   map[string]bool
	chains map[string]bool
	rules  map[string][]string // chain -> rules, as iptables-save prints them
}

func (r *recorder) IPSetRestore(p []byte) error {
	r.calls = append(r.calls, "ipset:\n"+string(p))
	for _, l := range strings.Split(string(p), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 1 && f[0] == "create":
			r.sets[f[1]] = true
		case len(f) > 1 && f[0] == "destroy":
			delete(r.sets, f[1])
		}
	}
	return nil
}

func (r *recorder) IPSetNames() ([]string, error) {
	var out []string
	for n := range r.sets {
		out = append(out, n)
	}
	return out, nil
}

func (r *recorder) IPTablesRestore(p []byte) error {
	r.calls = append(r.calls, "iptables:\n"+string(p))
	for _, l := range strings.Split(string(p), "\n") {
		switch {
		case strings.HasPrefix(l, ":"):
			name := strings.Fields(l[1:])[0]
			r.chains[name] = true
			delete(r.rules, name) // declaring a chain flushes it
		case strings.HasPrefix(l, "-A "):
			chain, rule, _ := strings.Cut(l[3:], " ")
			r.rules[chain] = append(r.rules[chain], rule)
		case strings.HasPrefix(l, "-X "):
			delete(r.chains, l[3:])
		}
	}
	return nil
}

func (r *recorder) IPTablesSave() ([]byte, error) {
	var b strings.Builder
	b.WriteString("*filter\n:FORWARD ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n")
	for c := range r.chains {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for c, rules := range r.rules {
		for _, rule := range rules {
			b.WriteString("[7:420] -A " + c + " " + rule + "\n")
		}
	}
	for _, j := range polipt.Jumps() {
		if r.chains[polipt.ChainForward] {
			b.WriteString("-A " + j.Chain + " " + j.Rule + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String()), nil
}

func (r *recorder) EnsureBridgeNetfilter() error { return nil }

func (r *recorder) FirstRule(chain string) (string, error) {
	r.calls = append(r.calls, "first "+chain)
	for _, j := range polipt.Jumps() {
		if j.Chain == chain && r.chains[polipt.ChainForward] {
			return j.Rule, nil
		}
	}
	return "", nil
}

func newRecorder() *recorder {
	return &recorder{sets: map[string]bool{}, chains: map[string]bool{}, rules: map[string][]string{}}
}

// take returns the calls that changed something (reads dropped).
func (r *recorder) take() []string {
	var out []string
	for _, c := range r.calls {
		if !strings.HasPrefix(c, "first ") {
			out = append(out, c)
		}
	}
	r.calls = nil
	return out
}

// Membership changes swap a set in place and touch no chain; a policy edit
// creates fresh sets before the chains switch, and the old sets go after.
func TestApplyOrder(t *testing.T) {
	w := nt.Addressed()
	rec := newRecorder()
	a := polipt.Applier{Runner: rec}
	pol := nt.Policy("x", "p", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nt.L("team", "blue"))), nt.Port(corev1.ProtocolTCP, 80))))
	w.Namespace("y").Labels["team"] = "blue"
	if _, err := a.Apply(render(w, "node1", pol)); err != nil {
		t.Fatal(err)
	}
	first := rec.take()
	if len(first) != 2 || !strings.HasPrefix(first[0], "ipset:") || !strings.HasPrefix(first[1], "iptables:") ||
		!strings.Contains(first[1], "-I FORWARD 1 ") || !strings.Contains(first[1], "-I INPUT 1 ") {
		t.Fatalf("first apply:\n%s", strings.Join(first, "\n"))
	}
	// z joins: the set is refilled and swapped, no chain is rewritten.
	w.Namespace("z").Labels["team"] = "blue"
	st, err := a.Apply(render(w, "node1", pol))
	if err != nil {
		t.Fatal(err)
	}
	calls := rec.take()
	if st.Sets != 1 || st.Chains != 0 || len(calls) != 1 || !strings.Contains(calls[0], "swap ") || strings.Count(calls[0], ",tcp:80 -exist") != 6 {
		t.Fatalf("membership change: %+v\n%s", st, strings.Join(calls, "\n"))
	}
	// Nothing changed: nothing sent.
	if _, err := a.Apply(render(w, "node1", pol)); err != nil || len(rec.take()) != 0 {
		t.Fatalf("idle apply sent something (%v)", err)
	}
	// The policy is edited: a new set first, then the chain, then the old set goes.
	oldSets := len(rec.sets)
	pol.Spec.Ingress[0].Ports[0] = nt.Port(corev1.ProtocolTCP, 81)
	st, err = a.Apply(render(w, "node1", pol))
	if err != nil {
		t.Fatal(err)
	}
	calls = rec.take()
	if len(calls) != 3 || !strings.HasPrefix(calls[0], "ipset:") || !strings.HasPrefix(calls[1], "iptables:") ||
		!strings.Contains(calls[0], ",tcp:81 -exist") || !strings.Contains(calls[2], "destroy ") || st.DeletedSets != 1 {
		t.Fatalf("policy edit: %+v\n%s", st, strings.Join(calls, "\n"))
	}
	if len(rec.sets) != oldSets {
		t.Fatalf("%d sets after the edit, want %d", len(rec.sets), oldSets)
	}
	// The policy goes: its chains are deleted in the same transaction.
	st, err = a.Apply(render(w, "node1"))
	if err != nil || st.DeletedChains != 1 || len(rec.sets) != 0 {
		t.Fatalf("delete: %+v %v, sets left %v", st, err, rec.sets)
	}
}

// The ready set is created before the chains that match it, never flushed
// or refilled (the agent and the plugin write its members), and kept.
func TestApplyKeepsReadySet(t *testing.T) {
	rec := newRecorder()
	a := polipt.Applier{Runner: rec}
	rs := func() *polipt.Ruleset {
		return polipt.Render(policy.Desired{}, polipt.Config{NodeName: "node1", PodPorts: "weft+", PodBridges: []string{"weft0"}})
	}
	if _, err := a.Apply(rs()); err != nil {
		t.Fatal(err)
	}
	calls := rec.take()
	if len(calls) != 2 || !strings.Contains(calls[0], "create "+readyset.Name4+" hash:ip family inet maxelem 1048576 -exist\n") ||
		strings.Contains(calls[0], "flush "+readyset.Name4) || strings.Contains(calls[0], "swap") ||
		!strings.Contains(calls[1], "-j "+polipt.ChainPending) {
		t.Fatalf("first apply:\n%s", strings.Join(calls, "\n"))
	}
	if _, err := a.Apply(rs()); err != nil || len(rec.take()) != 0 {
		t.Fatalf("idle apply sent something (%v)", err)
	}
	a.ForceFull()
	if _, err := a.Apply(rs()); err != nil {
		t.Fatal(err)
	}
	for _, c := range rec.take() {
		if strings.Contains(c, "destroy "+readyset.Name4) || strings.Contains(c, "flush "+readyset.Name4) {
			t.Fatalf("full apply touched the ready set's members:\n%s", c)
		}
	}
	if !rec.sets[readyset.Name4] {
		t.Fatal("ready set gone")
	}
}

// TestFullApplyKeepsDropCounters: the periodic full apply rewrites the
// chains that drifted and leaves those the kernel holds as wanted, among
// them the drop chains, whose counters are weft_policy_dropped_packets_total.
func TestFullApplyKeepsDropCounters(t *testing.T) {
	rec := newRecorder()
	a := polipt.Applier{Runner: rec}
	rs := polipt.Render(policy.Desired{}, polipt.Config{NodeName: "node1", PodPorts: "weft+", PodBridges: []string{"weft0"}})
	if _, err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	rec.take()
	rec.rules[polipt.ChainForward] = []string{"-j ACCEPT"} // drift
	a.ForceFull()
	if _, err := a.Apply(rs); err != nil {
		t.Fatal(err)
	}
	calls := rec.take()
	for _, c := range calls {
		for _, drop := range []string{polipt.ChainDropIn, polipt.ChainDropOut} {
			if strings.Contains(c, ":"+drop+" ") {
				t.Fatalf("the full apply rewrote %s (its counters reset):\n%s", drop, c)
			}
		}
	}
	if len(calls) == 0 || !strings.Contains(strings.Join(calls, ""), ":"+polipt.ChainForward+" ") {
		t.Fatalf("the full apply did not rewrite the chain that drifted:\n%s", strings.Join(calls, "\n"))
	}
	if in, out, err := a.Drops(); err != nil || in != 7 || out != 7 {
		t.Fatalf("drops %d/%d (%v), want the kernel's counters 7/7", in, out, err)
	}
}
