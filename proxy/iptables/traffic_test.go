package iptables_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
)

// TestPartialSyncAndRestart: one endpoint change rewrites a few chains, not
// all; a fresh backend (a restarted proxy) recognises the chains in the
// kernel by name, so its first full sync rewrites only the fixed-name chains
// and deletes nothing. (The table's restart scenario proves an open
// connection survives it.)
func TestPartialSyncAndRestart(t *testing.T) {
	n, _ := newNode(t, "a", "b")
	for i := 0; i < 20; i++ {
		ip := fmt.Sprintf("10.96.1.%d", i+1)
		n.Svcs = append(n.Svcs, proxytest.Service(fmt.Sprintf("s%d", i), ip, nil))
		n.Slices = append(n.Slices, proxytest.Slice(fmt.Sprintf("s%d", i), n.Local("a")))
	}
	full := sync(n)
	if !full.Full {
		t.Fatalf("first sync not full: %+v", full)
	}
	n.Slices[3] = proxytest.Slice("s3", n.Local("a"), n.Local("b"))
	part := sync(n)
	if part.Full || part.Chains == 0 || part.Chains > 6 {
		t.Fatalf("one endpoint change rewrote %d chains (full sync wrote %d)", part.Chains, full.Chains)
	}
	n.Backend = n.NewBackend()
	ms, _ := model.Build(n.Svcs, n.Slices)
	fixed := 0
	for _, c := range iptables.Render(nodeConfig(), ms, 4).Chains {
		if c.Fixed {
			fixed++
		}
	}
	if st := sync(n); !st.Full || st.Chains != fixed || st.Deleted > 0 {
		t.Fatalf("a new backend's first sync: %+v, want a full sync of the %d fixed chains only", st, fixed)
	}
	if r, err := proxytest.Get(n.Pods["b"].NS, "", "http://10.96.1.5/"); err != nil || r.Pod != "a" {
		t.Fatalf("service after restart: %+v %v", r, err)
	}
}

// TestChunkedSync: a sync larger than one restore's bound is split, leaves
// first, and gives the same working services; shrinking it back deletes
// the chains no longer used.
func TestChunkedSync(t *testing.T) {
	n, ipt := newNode(t, "a", "b")
	ipt.SetChunkRules(3)
	for i := range 12 {
		ip := fmt.Sprintf("10.96.%d.%d", i%3, i+1)
		n.Svcs = append(n.Svcs, proxytest.Service(fmt.Sprintf("s%d", i), ip, nil))
		n.Slices = append(n.Slices, proxytest.Slice(fmt.Sprintf("s%d", i), n.Local("a"), n.Local("b")))
	}
	if st := sync(n); st.Restores < 5 {
		t.Fatalf("first sync of %d rules in %d restores, want it split", st.Rules, st.Restores)
	}
	for i := range 12 {
		url := fmt.Sprintf("http://10.96.%d.%d/", i%3, i+1)
		if r, err := proxytest.Get(n.Pods["a"].NS, "", url); err != nil || (r.Pod != "a" && r.Pod != "b") {
			t.Fatalf("%s: %+v %v", url, r, err)
		}
	}
	n.Svcs, n.Slices = n.Svcs[:1], n.Slices[:1]
	st := sync(n)
	if st.Deleted == 0 {
		t.Fatalf("shrinking deleted nothing: %+v", st)
	}
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := model.Build(n.Svcs, n.Slices)
	want := strings.Count(iptables.Payload(iptables.Render(nodeConfig(), ms, 4)), ":WEFT-LB-")
	if lb := strings.Count(string(out), ":WEFT-LB-"); lb != want {
		t.Fatalf("%d load-balancing chains left, the remaining service has %d:\n%s", lb, want, out)
	}
	if r, err := proxytest.Get(n.Pods["b"].NS, "", "http://10.96.0.1/"); err != nil {
		t.Fatalf("remaining service: %+v %v", r, err)
	}
}

// TestPolicyJumpsStayFirst: the proxy inserts its jumps below weft-agent's
// NetworkPolicy jumps, so that service traffic the proxy's FORWARD chain
// accepts has been through policy first.
func TestPolicyJumpsStayFirst(t *testing.T) {
	n, ipt := newNode(t, "a")
	t.Cleanup(func() {
		for _, args := range [][]string{{"-D", "FORWARD", "-j", "WEFT-POL-FORWARD"}, {"-D", "FORWARD", "-s", "198.51.100.3/32", "-j", "DROP"}, {"-X", "WEFT-POL-FORWARD"}} {
			_ = exec.Command("iptables", args...).Run()
		}
		_ = ipt.Cleanup()
	})
	for _, args := range [][]string{
		{"-N", "WEFT-POL-FORWARD"}, {"-A", "FORWARD", "-s", "198.51.100.3/32", "-j", "DROP"},
		{"-I", "FORWARD", "1", "-j", "WEFT-POL-FORWARD"},
	} {
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v %s", args, err, out)
		}
	}
	n.Svcs = []*corev1.Service{proxytest.Service("web", "10.96.0.10", nil)}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("web", n.Local("a"))}
	n.Sync()
	out, err := exec.Command("iptables", "-S", "FORWARD").Output()
	if err != nil {
		t.Fatal(err)
	}
	rules := strings.Split(strings.TrimSpace(string(out)), "\n")[1:] // after "-P FORWARD ..."
	if len(rules) < 4 || !strings.HasSuffix(rules[0], "-j WEFT-POL-FORWARD") || !strings.HasSuffix(rules[len(rules)-1], "-j DROP") {
		t.Fatalf("FORWARD after a proxy sync, want the policy jump first and the foreign rule last:\n%s", out)
	}
}

// TestForeignRulesSurvive: rules weft does not own survive syncs and cleanup.
func TestForeignRulesSurvive(t *testing.T) {
	n, ipt := newNode(t, "a")
	for _, args := range [][]string{
		{"-t", "nat", "-N", "FOREIGN"}, {"-t", "nat", "-A", "FOREIGN", "-d", "198.51.100.1/32", "-j", "RETURN"},
		{"-t", "nat", "-A", "PREROUTING", "-j", "FOREIGN"}, {"-t", "filter", "-A", "FORWARD", "-s", "198.51.100.2/32", "-j", "DROP"},
	} {
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v %s", args, err, out)
		}
	}
	n.Svcs = []*corev1.Service{proxytest.Service("web", "10.96.0.10", nil)}
	n.Slices = []*discoveryv1.EndpointSlice{proxytest.Slice("web", n.Local("a"))}
	n.Sync()
	n.Slices = nil
	n.Sync()
	if err := ipt.Cleanup(); err != nil {
		t.Fatal(err)
	}
	save := func(table string) string {
		out, err := exec.Command("iptables-save", "-t", table).Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	nat, filter := save("nat"), save("filter")
	for _, want := range []string{"-A FOREIGN -d 198.51.100.1/32 -j RETURN", "-A PREROUTING -j FOREIGN"} {
		if !strings.Contains(nat, want) {
			t.Errorf("foreign nat rule %q gone:\n%s", want, nat)
		}
	}
	if !strings.Contains(filter, "-A FORWARD -s 198.51.100.2/32 -j DROP") {
		t.Errorf("foreign filter rule gone:\n%s", filter)
	}
	if strings.Contains(nat+filter, "WEFT-") {
		t.Errorf("weft rules left after cleanup:\n%s%s", nat, filter)
	}
}
