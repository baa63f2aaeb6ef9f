package iptables_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/oracle"
	"github.com/weftnet/weft/policy/readyset"
)

// TestPending: with the pending check, pods whose addresses are ready see
// exactly the policy grid, over IPv4 and IPv6, bridged and routed. A pod
// taken out of the ready set (y/a, which no policy selects) neither
// receives nor sends, while the node still reaches it (kubelet probes);
// put back, the grid is whole again.
func TestPending(t *testing.T) {
	b := newBed(t)
	b.checkSources, b.pending = true, true
	a4, a6 := polipt.Applier{}, polipt.Applier{Family: 6}
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "from-b", nt.L(nt.PodLabel, "a"),
		nt.Ingress(nt.From(nt.Peers(nt.PodPeer(nt.L(nt.PodLabel, "b"))), nt.Port(corev1.ProtocolTCP, 80), nt.Port(corev1.ProtocolUDP, 81))))}
	b.apply(t, &a4, b.World, pols)
	b.apply(t, &a6, b.World, pols)
	var all []netip.Addr
	for _, s := range b.sources() {
		all = append(all, s.Addrs...)
	}
	if err := readyset.Add(all); err != nil {
		t.Fatal(err)
	}
	want := oracle.Expect(oracle.World{Namespaces: b.World.Namespaces, Policies: pols}, b.World.Pods, nt.Ports, nt.Protocols)
	grid := func(want oracle.Matrix, what string) {
		t.Helper()
		for family, targets := range map[string]map[string]nt.Target{"IPv4": b.Targets, "IPv6": b.Targets6} {
			if got, err := nt.WaitMatch(time.Now().Add(5*time.Second), targets, want); err != nil {
				t.Fatalf("%s over %s: %v\n%s", what, family, err, oracle.SideBySide(want, got))
			}
		}
	}
	grid(want, "every pod ready")

	pending := b.Addrs("y/a")
	if err := readyset.Revoke(pending); err != nil {
		t.Fatal(err)
	}
	dark := oracle.NewMatrix(want.Pods, want.Ports, want.Protos)
	for c, ok := range want.Cells {
		dark.Cells[c] = ok && (c.From == c.To || c.From != "y/a" && c.To != "y/a")
	}
	grid(dark, "y/a not ready")
	for _, a := range pending {
		conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(context.Background(), "tcp", net.JoinHostPort(a.String(), "80"))
		if err != nil {
			t.Fatalf("the node cannot reach pending pod y/a at %s: %v", a, err)
		}
		conn.Close()
	}
	if err := readyset.Add(pending); err != nil {
		t.Fatal(err)
	}
	grid(want, "y/a ready again")
	_ = a4.Cleanup()
	_ = a6.Cleanup()
}
