package iptables_test

import (
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

// TestSourceCheck: x/a admits only x/b (UDP 7777). x/c (same bridge) and
// z/c (other bridge, routed) forge x/b's address with a raw socket, over
// IPv4 and IPv6. Without the source check x/a gets their datagrams; with
// it none arrives, while x/b's own do and the policy grid still matches
// the oracle.
func TestSourceCheck(t *testing.T) {
	b := newBed(t)
	a4, a6 := polipt.Applier{}, polipt.Applier{Family: 6}
	tcp := corev1.ProtocolUDP
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "from-b", nt.L(nt.PodLabel, "a"),
		nt.Ingress(nt.From(nt.Peers(nt.PodPeer(nt.L(nt.PodLabel, "b"))), nt.Port(tcp, 7777), nt.Port(tcp, 80), nt.Port(tcp, 81))))}
	apply := func() {
		t.Helper()
		b.apply(t, &a4, b.World, pols)
		b.apply(t, &a6, b.World, pols)
	}
	sink, err := nt.ListenUDP(b.Targets["x/a"].NSPath, 7777)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	round := 0
	forgedArrives := func(spoofer string, targets map[string]nt.Target) bool {
		t.Helper()
		round++
		ok, err := nt.ForgedArrives(sink, targets[spoofer], targets["x/b"], targets["x/a"], 7777, strconv.Itoa(round))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	type path struct {
		spoofer string
		family  string
		targets map[string]nt.Target
	}
	paths := []path{{"x/c", "IPv4", b.Targets}, {"z/c", "IPv4", b.Targets}, {"x/c", "IPv6", b.Targets6}, {"z/c", "IPv6", b.Targets6}}
	apply()
	for _, p := range paths {
		if !forgedArrives(p.spoofer, p.targets) {
			t.Fatalf("%s from %s: without the source check the forged datagram did not arrive: the probe proves nothing", p.family, p.spoofer)
		}
	}
	b.checkSources = true
	apply()
	for _, p := range paths {
		if forgedArrives(p.spoofer, p.targets) {
			t.Errorf("%s: %s reached x/a with x/b's address through the source check", p.family, p.spoofer)
		}
	}
	b.check(t, b.World, pols, "policy grid with the source check")
	if err := a4.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := a6.Cleanup(); err != nil {
		t.Fatal(err)
	}
}
