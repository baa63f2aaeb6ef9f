package nftables

import (
	"context"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Errorf("%s differs (go test -update to accept):\n%s", name, got)
	}
}

func fakeApplier() *Applier {
	return &Applier{Inet: knftables.NewFake(knftables.InetFamily, TableName), Bridge: knftables.NewFake(knftables.BridgeFamily, TableName),
		BridgeNetfilter: func() error { return nil }}
}

// bedState is the made-up bed with x/a isolated both ways: ingress from
// y's pods on TCP 80-81 and from an ipBlock with an exception on SCTP,
// egress anywhere on UDP 53 and to z's pods on every port.
func bedState() (policy.Desired, Config) {
	w := nt.Addressed()
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "p", nt.L(nt.PodLabel, "a"),
		nt.Types(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress),
		nt.Ingress(
			nt.From(nt.Peers(nt.NSPeer(nt.L(nt.NSLabel, "y"))), nt.Range(corev1.ProtocolTCP, 80, 81)),
			nt.From(nt.Peers(nt.BlockPeer("10.0.0.0/8", "10.1.0.0/16")), nt.Port(corev1.ProtocolSCTP, 9000))),
		nt.Egress(
			nt.To(nil, nt.Port(corev1.ProtocolUDP, 53)),
			nt.To(nt.Peers(nt.NSPeer(nt.L(nt.NSLabel, "z"))))))}
	d := policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: pols})
	var srcs []Source
	for _, p := range w.Pods {
		if p.Spec.NodeName == nt.NodeName(0) {
			srcs = append(srcs, Source{Port: "weft" + p.Name, Addrs: policy.PodIPs(p)})
		}
	}
	return d, Config{NodeName: nt.NodeName(0), PodPorts: "weft*", Sources: srcs, PodBridges: []string{"weft0"}}
}

// TestGolden: the tables of the made-up bed, as knftables' fake holds
// them after a first apply.
func TestGolden(t *testing.T) {
	d, cfg := bedState()
	a := fakeApplier()
	st, err := a.Apply(context.Background(), Render(d, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Full {
		t.Fatalf("first apply: %+v, want full", st)
	}
	golden(t, "bed.golden", a.Inet.(*knftables.Fake).Dump()+"\n"+a.Bridge.(*knftables.Fake).Dump())
}

// TestMembershipIsElements: pods coming and going, and a namespace
// relabelled, under unchanged policies, are partial applies of element
// writes only; a policy edit adds the new chain and deletes the old one in
// the same transaction; every result equals a fresh render.
func TestMembershipIsElements(t *testing.T) {
	d, cfg := bedState()
	a := fakeApplier()
	ctx := context.Background()
	if _, err := a.Apply(ctx, Render(d, cfg)); err != nil {
		t.Fatal(err)
	}
	// y/b leaves: y's set loses an address.
	d2 := d
	d2.Sets = map[string]policy.AddrSet{}
	for id, s := range d.Sets {
		if s.Kind == policy.SetAddrs {
			s.Addrs = slicesDelete(s.Addrs, netip.MustParseAddr("10.244.1.3"))
		}
		d2.Sets[id] = s
	}
	st, err := a.Apply(ctx, Render(d2, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if st.Full || st.Rules != 0 || st.Objects != 0 || st.ElementDeletes == 0 {
		t.Fatalf("a peer pod leaving: %+v, want element writes only", st)
	}
	// A new local pod (a source pair, a dispatch element of an existing group).
	cfg2 := cfg
	cfg2.Sources = append(cfg2.Sources, Source{Port: "weftnew", Addrs: []netip.Addr{netip.MustParseAddr("10.244.0.9")}})
	st, err = a.Apply(ctx, Render(d2, cfg2))
	if err != nil {
		t.Fatal(err)
	}
	if st.Full || st.Rules != 0 || st.Objects != 0 || st.ElementAdds != 1 || st.ElementDeletes != 0 {
		t.Fatalf("a new pod's source pair: %+v, want one element added", st)
	}
	fresh := fakeApplier()
	if _, err := fresh.Apply(ctx, Render(d2, cfg2)); err != nil {
		t.Fatal(err)
	}
	for i, pair := range [][2]knftables.Interface{{a.Inet, fresh.Inet}, {a.Bridge, fresh.Bridge}} {
		if got, want := pair[0].(*knftables.Fake).Dump(), pair[1].(*knftables.Fake).Dump(); got != want {
			t.Fatalf("table %d after partial applies differs from a fresh one:\n%s\nwant\n%s", i, got, want)
		}
	}
	// An edited policy: new group chain, the old one deleted.
	w := nt.Addressed()
	edited := policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: []*networkingv1.NetworkPolicy{
		nt.Policy("x", "p", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nt.L(nt.NSLabel, "z"))), nt.Port(corev1.ProtocolTCP, 81))))}})
	st, err = a.Apply(ctx, Render(edited, cfg2))
	if err != nil {
		t.Fatal(err)
	}
	if st.Full || st.Objects == 0 {
		t.Fatalf("policy edit: %+v", st)
	}
	if dump := a.Inet.(*knftables.Fake).Dump(); strings.Count(dump, "add chain inet weft-policy in-") != 1 || strings.Contains(dump, "add chain inet weft-policy out-") {
		t.Fatalf("after the edit, want one ingress group chain and no egress one:\n%s", dump)
	}
}

func slicesDelete(s []netip.Addr, a netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, x := range s {
		if x != a {
			out = append(out, x)
		}
	}
	return out
}
