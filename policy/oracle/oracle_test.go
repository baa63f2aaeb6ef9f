package oracle_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	nt "github.com/weftnet/weft/policy/netpoltest"
	"github.com/weftnet/weft/policy/oracle"
)

// Hand-worked answers, one per rule of the API.
func TestAllowed(t *testing.T) {
	w := nt.Addressed()
	xa, xb, ya, yb, zc := w.Pod("x", "a"), w.Pod("x", "b"), w.Pod("y", "a"), w.Pod("y", "b"), w.Pod("z", "c")
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	a := nt.L(nt.PodLabel, "a")
	for _, c := range []struct {
		name     string
		pols     []*networkingv1.NetworkPolicy
		src, dst *corev1.Pod
		proto    corev1.Protocol
		port     int32
		want     bool
	}{
		{"no policy", nil, ya, xa, tcp, 80, true},
		{"deny ingress", []*networkingv1.NetworkPolicy{nt.Policy("x", "d", nil, nt.Ingress())}, ya, xa, tcp, 80, false},
		{"deny ingress leaves egress", []*networkingv1.NetworkPolicy{nt.Policy("x", "d", nil, nt.Ingress())}, xa, ya, tcp, 80, true},
		{"self always", []*networkingv1.NetworkPolicy{nt.Policy("x", "d", nil, nt.Types(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress))}, xa, xa, tcp, 80, true},
		{"other pod not selected", []*networkingv1.NetworkPolicy{nt.Policy("x", "d", a, nt.Ingress())}, ya, xb, tcp, 80, true},
		{"podSelector peer is same-namespace", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nt.Peers(nt.PodPeer(nt.L(nt.PodLabel, "b"))))))}, yb, xa, tcp, 80, false},
		{"podSelector peer allows", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nt.Peers(nt.PodPeer(nt.L(nt.PodLabel, "b"))))))}, xb, xa, tcp, 80, true},
		{"both selectors need both", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nt.Peers(nt.NSPodPeer(nt.L(nt.NSLabel, "y"), nt.L(nt.PodLabel, "b"))))))}, ya, xa, tcp, 80, false},
		{"both selectors", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nt.Peers(nt.NSPodPeer(nt.L(nt.NSLabel, "y"), nt.L(nt.PodLabel, "b"))))))}, yb, xa, tcp, 80, true},
		{"port mismatch", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nil, nt.Port(tcp, 81))))}, yb, xa, tcp, 80, false},
		{"protocol mismatch", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nil, nt.Port(tcp, 80))))}, yb, xa, udp, 80, false},
		{"endPort", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nil, nt.Range(udp, 79, 81))))}, yb, xa, udp, 81, true},
		{"named port of the destination", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nil, nt.Named(udp, "serve-81-udp"))))}, yb, xa, udp, 81, true},
		{"named port other number", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nil, nt.Named(udp, "serve-81-udp"))))}, yb, xa, udp, 80, false},
		{"ipBlock except", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nt.Peers(nt.BlockPeer(nt.ClusterCIDR, nt.IP(zc).String()+"/32")))))}, zc, xa, tcp, 80, false},
		{"ipBlock", []*networkingv1.NetworkPolicy{nt.Policy("x", "p", a, nt.Ingress(nt.From(nt.Peers(nt.BlockPeer(nt.ClusterCIDR, nt.IP(zc).String()+"/32")))))}, yb, xa, tcp, 80, true},
		{"egress isolates the source", []*networkingv1.NetworkPolicy{nt.Policy("y", "e", nil, nt.Types(networkingv1.PolicyTypeEgress))}, yb, xa, tcp, 80, false},
		{"egress default type from rules", []*networkingv1.NetworkPolicy{nt.Policy("y", "e", nil, nt.Egress(nt.To(nt.Peers(nt.NSPeer(nt.L(nt.NSLabel, "z"))))))}, yb, xa, tcp, 80, false},
		{"union", []*networkingv1.NetworkPolicy{nt.Policy("x", "d", nil, nt.Ingress()), nt.Policy("x", "p", a, nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nil)))))}, zc, xa, udp, 81, true},
		{"rejected policy isolates", []*networkingv1.NetworkPolicy{nt.Policy("x", "bad", a, nt.Ingress(nt.From(nil, nt.Port("ICMP", 80))))}, yb, xa, tcp, 80, false},
	} {
		got := oracle.World{Namespaces: w.Namespaces, Policies: c.pols}.Allowed(c.src, c.dst, c.proto, c.port)
		if got != c.want {
			t.Errorf("%s: allowed=%v, want %v", c.name, got, c.want)
		}
	}
}

func TestSideBySide(t *testing.T) {
	w := nt.Addressed()
	want := oracle.Expect(oracle.World{Namespaces: w.Namespaces}, w.Pods, []int32{80}, []corev1.Protocol{corev1.ProtocolTCP})
	got := oracle.NewMatrix(want.Pods, want.Ports, want.Protos)
	for c, v := range want.Cells {
		got.Cells[c] = v
	}
	c := oracle.Case{From: "y/b", To: "x/a", Port: 80, Proto: corev1.ProtocolTCP}
	got.Cells[c] = false
	if d := want.Diff(got); len(d) != 1 || d[0] != c {
		t.Fatalf("diff %v, want only %v", d, c)
	}
	out := oracle.SideBySide(want, got)
	if !strings.Contains(out, "TCP/80") || strings.Count(out, "!") != 1 || !strings.Contains(out, "y/b") {
		t.Fatalf("side by side:\n%s", out)
	}
	t.Logf("\n%s", out)
}
