package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// A sync's new backend lists take effect when it updates the master
// entries, but a program that read a master entry just before the update
// goes on with the old list: a socket program between its reads of the
// master entry, the slot and the backend. So the old lists' slots (the
// inactive halves), the backends a sync takes out of every list and the
// connected UDP sockets of backends removed from UDP frontends are not
// deleted at once. The sync marks the
// backends BACKEND_GONE (bpf/lb.h: the per-packet programs treat them as
// gone at once; a stale socket program still finds its backend) and
// starts a grace period; when it ends, no program that read an old master
// entry is still running, and the old halves and the backends are
// deleted, the UDP sockets terminated: in steady state a frontend of n
// backends takes 1+n entries of the services map, 1+2n only between a
// rewrite and the end of the grace period after it. The TCP resets of removed endpoints (TCPFlows) and the next
// sync wait for it, so a connection a stale reader made is reset with the
// others, and the next sync's rewrite of the halves the old lists used
// reaches no reader. A grace period costs one RCU grace period of the
// kernel (8-20 ms here), off the sync's path: the sync has returned.

// graceWaiter waits for a grace period of the BPF programs: updating a
// map of maps makes the kernel wait until every program running at that
// moment has returned (it does so that user space knows no program holds
// the map it replaced), whichever maps they read. Its maps are the
// process's own, never pinned.
type graceWaiter struct {
	outer, inner *ebpf.Map
}

func newGraceWaiter() (*graceWaiter, error) {
	innerSpec := &ebpf.MapSpec{Name: "weft_grace_in", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1}
	inner, err := ebpf.NewMap(innerSpec)
	if err != nil {
		return nil, fmt.Errorf("creating the grace period map: %w", err)
	}
	outer, err := ebpf.NewMap(&ebpf.MapSpec{Name: "weft_grace", Type: ebpf.ArrayOfMaps, KeySize: 4, ValueSize: 4,
		MaxEntries: 1, InnerMap: innerSpec})
	if err != nil {
		_ = inner.Close()
		return nil, fmt.Errorf("creating the grace period map: %w", err)
	}
	return &graceWaiter{outer: outer, inner: inner}, nil
}

func (g *graceWaiter) wait() error {
	if err := g.outer.Update(uint32(0), g.inner, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("waiting for a grace period of the programs: %w", err)
	}
	return nil
}

func (g *graceWaiter) close() {
	_ = g.outer.Close()
	_ = g.inner.Close()
}

// retirement is how a backend waits for grace periods, and the one
// running.
type retirement struct {
	// wait waits for a grace period (graceWaiter.wait; tests replace it).
	wait func() error
	// cur is the grace period running, nil when none runs.
	cur *gracePeriod
}

// gracePeriod is one wait: done is closed when it is over, with its error.
type gracePeriod struct {
	done chan struct{}
	err  error
}

// startGrace starts a grace period when the last sync rewrote lists,
// retired backends or left UDP sockets to terminate (or load found what a
// stopped process left of those); its goroutine settles when it is over,
// unless a caller (the next sync, Close) has done so first. b.mu is held.
func (b *Backend) startGrace() {
	if b.w == nil || (len(b.w.retired) == 0 && len(b.w.stale) == 0 && len(b.w.rewritten) == 0) || b.ret.cur != nil {
		return
	}
	g := &gracePeriod{done: make(chan struct{})}
	b.ret.cur = g
	go func(wait func() error) {
		g.err = wait()
		close(g.done)
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.ret.cur != g {
			return // settled by a caller
		}
		if err := b.settle(); err != nil {
			b.cfg.Log.Warn("after a grace period of the eBPF programs", "err", err)
		}
	}(b.ret.wait)
}

// settle waits for the grace period running, if any, and then deletes the
// old lists' halves and the retired backends, and terminates the UDP
// sockets of removed backends.
// What fails is tried again after the next sync. b.mu is held (the
// goroutine of startGrace ends the period without it).
func (b *Backend) settle() error {
	g := b.ret.cur
	if g == nil {
		return nil
	}
	<-g.done
	b.ret.cur = nil
	if g.err != nil {
		return g.err // nothing deleted: the next sync starts another
	}
	if b.w == nil {
		return nil
	}
	return errors.Join(b.w.dropOldHalves(), b.w.dropRetired(), b.terminateUDP())
}

// graceOver returns a channel closed when no program that read a master
// entry before the last sync's updates is still running. b.mu is held.
func (b *Backend) graceOver() <-chan struct{} {
	if b.ret.cur == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return b.ret.cur.done
}

// Settle waits for the grace period after the last sync and then deletes
// what that sync retired, as the next Sync would first: after it the maps
// hold exactly the state synced (for tools reading them, and tests).
func (b *Backend) Settle() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.settle()
}
