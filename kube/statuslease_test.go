package kube

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
)

// TestStatusLeader: of two agents one leads; when it stops (its context
// ends, and it releases the lease), the other takes over.
func TestStatusLeader(t *testing.T) {
	client := fake.NewClientset()
	type agent struct {
		l      StatusLeader
		cancel context.CancelFunc
		led    chan struct{}
	}
	var wg sync.WaitGroup
	agents := map[string]*agent{}
	for _, name := range []string{"node1", "node2"} {
		ctx, cancel := context.WithCancel(context.Background())
		a := &agent{cancel: cancel, led: make(chan struct{}, 8)}
		agents[name] = a
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.l.Run(ctx, client, "weft-system", "weft-cluster-policy-status", name, func() { a.led <- struct{}{} }, slog.Default())
		}()
	}
	defer func() {
		for _, a := range agents {
			a.cancel()
		}
		wg.Wait()
	}()
	first := ""
	select {
	case <-agents["node1"].led:
		first = "node1"
	case <-agents["node2"].led:
		first = "node2"
	case <-time.After(time.Minute):
		t.Fatal("no agent took the lease")
	}
	second := map[string]string{"node1": "node2", "node2": "node1"}[first]
	if !agents[first].l.Leading() || agents[second].l.Leading() {
		t.Fatalf("%s took the lease: leading %v, %s leading %v", first, agents[first].l.Leading(), second, agents[second].l.Leading())
	}
	agents[first].cancel()
	select {
	case <-agents[second].led:
	case <-time.After(time.Minute):
		t.Fatalf("%s did not take over from %s", second, first)
	}
	// The first one's stop callback runs after it released the lease.
	for deadline := time.Now().Add(time.Minute); agents[first].l.Leading(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still leading after %s took over", first, second)
		}
	}
	if !agents[second].l.Leading() {
		t.Fatalf("%s took over and does not lead", second)
	}
}
