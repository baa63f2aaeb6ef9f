package nftables_test

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	nt "github.com/weftnet/weft/policy/netpoltest"
	polnft "github.com/weftnet/weft/policy/nftables"
	"github.com/weftnet/weft/policy/oracle"
	"github.com/weftnet/weft/policy/readyset"
)

// TestNoHoleDuringUpdates flips x/a's policy between two versions (edited
// in place, and by relabelling a namespace) while probers hammer the flows
// that every version forbids: none may ever connect. A relabel is a
// partial apply of element writes only; an edit swaps the pods' chain in
// the same transaction.
func TestNoHoleDuringUpdates(t *testing.T) {
	b := newBed(t)
	tcp := corev1.ProtocolTCP
	a1 := nt.Policy("x", "p", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nt.L(nt.NSLabel, "y"))), nt.Port(tcp, 80))))
	a2 := nt.Policy("x", "p", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nt.L(nt.NSLabel, "z"))), nt.Port(tcp, 81))))
	blue := nt.Policy("x", "p", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nt.L("team", "blue"))), nt.Port(tcp, 80))))
	yBlue := nt.Relabelled(b.World, "y")

	b.apply(t, b.World, []*networkingv1.NetworkPolicy{a1})
	b.check(t, b.World, []*networkingv1.NetworkPolicy{a1}, "version 1")
	forbidden := []struct{ from, port string }{{"z/a", "80"}, {"z/b", "80"}, {"y/b", "81"}, {"y/c", "81"}, {"x/b", "80"}}
	var holes, probes atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 24 {
		f := forbidden[i%len(forbidden)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
				c, err := netnsutil.Dialer(b.Targets[f.from].NSPath, nil)(pctx, "tcp", b.Targets["x/a"].IP+":"+f.port)
				pcancel()
				probes.Add(1)
				if err == nil {
					c.Close()
					holes.Add(1)
				}
			}
		}()
	}
	for range 10 {
		b.apply(t, b.World, []*networkingv1.NetworkPolicy{a2})
		b.apply(t, yBlue, []*networkingv1.NetworkPolicy{blue})
		b.apply(t, b.World, []*networkingv1.NetworkPolicy{blue})
		if st := b.last; st.Full || st.Rules+st.Objects != 0 || st.ElementDeletes == 0 {
			t.Fatalf("relabel: %+v, want a partial apply of element writes only", st)
		}
		b.apply(t, yBlue, []*networkingv1.NetworkPolicy{blue})
		b.apply(t, b.World, []*networkingv1.NetworkPolicy{a1})
	}
	cancel()
	wg.Wait()
	if holes.Load() > 0 {
		t.Fatalf("%d of %d probes of forbidden flows connected during updates", holes.Load(), probes.Load())
	}
	if probes.Load() < 100 {
		t.Fatalf("only %d probes ran", probes.Load())
	}
	t.Logf("%d probes of forbidden flows during 50 updates, none connected", probes.Load())
}

// TestSourceCheck: x/a admits only x/b (UDP 7777). x/c (same bridge) and
// z/c (other bridge, routed) forge x/b's address with a raw socket, over
// IPv4 and IPv6. Without the source check x/a gets their datagrams; with
// it none arrives, while x/b's own do and the policy grid still matches
// the oracle.
func TestSourceCheck(t *testing.T) {
	b := newBed(t)
	udp := corev1.ProtocolUDP
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "from-b", nt.L(nt.PodLabel, "a"),
		nt.Ingress(nt.From(nt.Peers(nt.PodPeer(nt.L(nt.PodLabel, "b"))), nt.Port(udp, 7777), nt.Port(udp, 80), nt.Port(udp, 81))))}
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
	paths := []struct {
		spoofer, family string
		targets         map[string]nt.Target
	}{{"x/c", "IPv4", b.Targets}, {"z/c", "IPv4", b.Targets}, {"x/c", "IPv6", b.Targets6}, {"z/c", "IPv6", b.Targets6}}
	b.apply(t, b.World, pols)
	for _, p := range paths {
		if !forgedArrives(p.spoofer, p.targets) {
			t.Fatalf("%s from %s: without the source check the forged datagram did not arrive: the probe proves nothing", p.family, p.spoofer)
		}
	}
	b.checkSources = true
	b.apply(t, b.World, pols)
	for _, p := range paths {
		if forgedArrives(p.spoofer, p.targets) {
			t.Errorf("%s: %s reached x/a with x/b's address through the source check", p.family, p.spoofer)
		}
	}
	b.check(t, b.World, pols, "policy grid with the source check")
}

// TestPending: with the pending check, pods whose addresses are ready see
// exactly the policy grid, over IPv4 and IPv6, bridged and routed. A pod
// taken out of the ready set by the plugin's path (readyset.Revoke, over
// netlink) neither receives nor sends, while the node still reaches it;
// put back by the agent's path (ReadySet.Add), the grid is whole again.
func TestPending(t *testing.T) {
	b := newBed(t)
	b.checkSources, b.pending = true, true
	pols := []*networkingv1.NetworkPolicy{nt.Policy("x", "from-b", nt.L(nt.PodLabel, "a"),
		nt.Ingress(nt.From(nt.Peers(nt.PodPeer(nt.L(nt.PodLabel, "b"))), nt.Port(corev1.ProtocolTCP, 80), nt.Port(corev1.ProtocolUDP, 81))))}
	b.apply(t, b.World, pols)
	ready := polnft.ReadySet{NFT: b.a.Inet}
	ctx := context.Background()
	var all []netip.Addr
	for _, p := range b.Ports {
		all = append(all, p.Addrs...)
	}
	want := oracle.Expect(oracle.World{Namespaces: b.World.Namespaces, Policies: pols}, b.World.Pods, nt.Ports, nt.Protocols)
	grid := func(want oracle.Matrix, what string) {
		t.Helper()
		b.CheckMatrix(t, b.Targets, want, what+" (IPv4)")
		b.CheckMatrix(t, b.Targets6, want, what+" (IPv6)")
	}
	none := oracle.NewMatrix(want.Pods, want.Ports, want.Protos)
	for c, ok := range want.Cells {
		none.Cells[c] = ok && c.From == c.To
	}
	grid(none, "nothing ready")
	if err := ready.Add(ctx, all); err != nil {
		t.Fatal(err)
	}
	grid(want, "every pod ready")
	// A full apply (a resync) keeps the ready sets' elements.
	b.a.ForceFull()
	b.apply(t, b.World, pols)
	grid(want, "every pod ready after a full apply")

	pending := b.Addrs("y/a")
	if err := readyset.Revoke(pending); err != nil {
		t.Fatal(err)
	}
	if m, err := ready.Members(ctx); err != nil || m[pending[0]] || m[pending[1]] || len(m) != len(all)-2 {
		t.Fatalf("after Revoke: %v (%v), want every address but y/a's", m, err)
	}
	if err := readyset.Revoke(pending); err != nil { // absent elements: no error
		t.Fatal(err)
	}
	dark := oracle.NewMatrix(want.Pods, want.Ports, want.Protos)
	for c, ok := range want.Cells {
		dark.Cells[c] = ok && (c.From == c.To || c.From != "y/a" && c.To != "y/a")
	}
	grid(dark, "y/a not ready")
	for _, a := range pending {
		conn, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", net.JoinHostPort(a.String(), "80"))
		if err != nil {
			t.Fatalf("the node cannot reach pending pod y/a at %s: %v", a, err)
		}
		conn.Close()
	}
	if err := ready.Add(ctx, pending); err != nil {
		t.Fatal(err)
	}
	grid(want, "y/a ready again")
}

// TestForceFullRepairsDrift: a policy chain flushed behind weft's back is
// rewritten by the next full apply (the agent's periodic resync).
func TestForceFullRepairsDrift(t *testing.T) {
	b := newBed(t)
	deny := []*networkingv1.NetworkPolicy{nt.Policy("x", "deny", nil, nt.Ingress())}
	b.apply(t, b.World, deny)
	b.check(t, b.World, deny, "deny in x")
	nft(t, "flush", "chain", "inet", polnft.TableName, polnft.ChainIngress)
	b.check(t, b.World, nil, "after the drift (nothing enforced)")
	b.apply(t, b.World, deny) // partial: trusts its own record
	b.check(t, b.World, nil, "a partial apply does not look")
	b.a.ForceFull()
	b.apply(t, b.World, deny)
	b.check(t, b.World, deny, "repaired")
}
