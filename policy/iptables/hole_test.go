package iptables_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

// TestNoHoleDuringUpdates flips x/a's policy between two versions (edited
// in place, and by relabelling a namespace) while probers hammer the flows
// that both versions forbid: none may ever connect.
func TestNoHoleDuringUpdates(t *testing.T) {
	b := newBed(t)
	var a polipt.Applier
	tcp := corev1.ProtocolTCP
	a1 := nt.Policy("x", "p", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nt.L(nt.NSLabel, "y"))), nt.Port(tcp, 80))))
	a2 := nt.Policy("x", "p", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nt.L(nt.NSLabel, "z"))), nt.Port(tcp, 81))))
	// Relabel variant: the policy allows team=blue on 80; y gains and loses
	// the label.
	blue := nt.Policy("x", "p", nt.L(nt.PodLabel, "a"), nt.Ingress(nt.From(nt.Peers(nt.NSPeer(nt.L("team", "blue"))), nt.Port(tcp, 80))))
	yBlue := nt.Relabelled(b.World, "y")

	b.apply(t, &a, b.World, []*networkingv1.NetworkPolicy{a1})
	b.check(t, b.World, []*networkingv1.NetworkPolicy{a1}, "version 1")
	// Every state allows y on 80 or z on 81 or nobody: z -> x/a:80 and
	// y -> x/a:81 are forbidden by all of them, but a rule of one state
	// matched against the peers of another would let them through.
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
		b.apply(t, &a, b.World, []*networkingv1.NetworkPolicy{a2})
		b.apply(t, &a, yBlue, []*networkingv1.NetworkPolicy{blue})
		b.apply(t, &a, b.World, []*networkingv1.NetworkPolicy{blue})
		b.apply(t, &a, yBlue, []*networkingv1.NetworkPolicy{blue})
		b.apply(t, &a, b.World, []*networkingv1.NetworkPolicy{a1})
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
