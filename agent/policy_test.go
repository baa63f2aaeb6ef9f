package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

// The controller keeps what it is fed, and a rejected policy is logged once
// with its key and field, again only when its problem changes.
func TestPolicyControllerStateAndRejections(t *testing.T) {
	var logs bytes.Buffer
	c, err := NewPolicyController(PolicyOptions{NodeName: "node1", Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	w := nt.Addressed()
	for _, n := range w.Namespaces {
		c.OnNamespace(nil, n)
	}
	for _, p := range w.Pods {
		c.OnPolicyPod(nil, p)
	}
	bad := nt.Policy("x", "bad", nil, nt.Ingress(nt.From(nt.Peers(nt.BlockPeer("10.0.0.0/33")))))
	c.OnNetworkPolicy(nil, bad)
	c.OnPolicyPod(w.Pods[0], nil)
	in, _ := c.input(nil)
	if len(in.Pods) != len(w.Pods)-1 || len(in.Namespaces) != 3 || len(in.Policies) != 1 {
		t.Fatalf("input: %d pods, %d namespaces, %d policies", len(in.Pods), len(in.Namespaces), len(in.Policies))
	}
	d := policy.Compile(in)
	c.logRejected(d.Errors)
	c.logRejected(d.Errors)
	out := logs.String()
	if strings.Count(out, "rejected network policy") != 1 || !strings.Contains(out, "policy=x/bad") ||
		!strings.Contains(out, "field=spec.ingress[0].from[0].ipBlock.cidr") {
		t.Fatalf("logs:\n%s", out)
	}
	// Fixed, then broken differently: logged again.
	fixed := bad.DeepCopy()
	fixed.Spec.Ingress[0].From[0].IPBlock.CIDR = "10.0.0.0/8"
	fixed.Spec.Ingress[0].From[0].IPBlock.Except = []string{"11.0.0.0/8"}
	c.OnNetworkPolicy(bad, fixed)
	in, _ = c.input(nil)
	c.logRejected(policy.Compile(in).Errors)
	if !strings.Contains(logs.String(), "field=spec.ingress[0].from[0].ipBlock.except[0]") {
		t.Fatalf("logs:\n%s", logs.String())
	}
	c.OnNetworkPolicy(fixed, nil)
	if in, _ := c.input(nil); len(in.Policies) != 0 {
		t.Fatal("deleted policy kept")
	}
}
