package ebpf

import (
	"log/slog"
	"net/netip"
	"testing"
	"time"
)

// TestRetiredBackendsOutliveTheGracePeriod: a backend a sync takes out of
// its frontend's list stays in the map, marked gone, and the list's slots
// stay in the inactive half, until the grace period after that sync is
// over, whoever ends it (its goroutine or the next sync); the per-packet
// programs move a flow off the backend at once.
func TestRetiredBackendsOutliveTheGracePeriod(t *testing.T) {
	e := newTCEnv(t)
	release := make(chan struct{})
	b := &Backend{w: e.w, cfg: Config{Log: slog.Default()}}
	b.ret.wait = func() error { <-release; return nil }
	frontend := nodePort(nodeIP, 30080)
	e.program(map[FrontendKey]Frontend{frontend: {Masquerade: true, Backends: backends(ext(podX, 80))}})
	in := packet{src: ext(client, 40000), dst: ext(nodeIP, 30080)}.bytes()
	if got := parsePacket(t, second(e.run(e.objs.WeftNodeport, in))); got.dst != ext(podX, 80) {
		t.Fatalf("first packet to %s", got.dst)
	}
	idX, _ := e.w.backendID(ext(podX, 80))

	// podX leaves: marked, not deleted.
	e.program(map[FrontendKey]Frontend{frontend: {Masquerade: true, Backends: backends(ext(podY, 80))}})
	b.mu.Lock()
	b.startGrace()
	over := b.graceOver()
	b.mu.Unlock()
	gone := func() (present, marked bool) {
		var v sockBackend
		if err := e.objs.WeftBackends.Lookup(idX, &v); err != nil {
			return false, false
		}
		return true, v.Flags&backendGone != 0
	}
	if present, marked := gone(); !present || !marked {
		t.Fatalf("during the grace period podX's entry: present %v, marked %v; want both", present, marked)
	}
	slots := func() int {
		n := 0
		var k sockSvcKey
		var v sockSvcValue
		for it := e.objs.WeftServices.Iterate(); it.Next(&k, &v); {
			n++
		}
		return n
	}
	if got := slots(); got != 3 {
		t.Fatalf("during the grace period the services map holds %d entries, want 3 (the master entry, both halves' slot)", got)
	}
	if _, ok := e.w.backendID(ext(podX, 80)); ok {
		t.Fatal("the writer still names podX's retired entry: an endpoint coming back would reuse it")
	}
	if got := parsePacket(t, second(e.run(e.objs.WeftNodeport, in))); got.dst != ext(podY, 80) {
		t.Fatalf("the flow stayed on the retired backend: %s", got.dst)
	}
	select {
	case <-over:
		t.Fatal("the grace period ended before the wait returned")
	default:
	}

	// The next sync settles first: it waits for the period.
	settled := make(chan error)
	go func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		settled <- b.settle()
	}()
	if present, _ := gone(); !present {
		t.Fatal("podX's entry deleted while the grace period runs")
	}
	close(release)
	if err := <-settled; err != nil {
		t.Fatal(err)
	}
	if present, _ := gone(); present {
		t.Fatal("podX's entry left after the grace period")
	}
	if len(e.w.retired) != 0 {
		t.Fatalf("still retired: %v", e.w.retired)
	}
	if got := slots(); got != 2 {
		t.Fatalf("after the grace period the services map holds %d entries, want 2 (the master entry, the active slot)", got)
	}
	if got := e.w.tally.services; got != 2 {
		t.Fatalf("after the grace period the writer counts %d entries of the services map, want 2", got)
	}

	// The goroutine alone ends a period: podY leaves too.
	idY, _ := e.w.backendID(ext(podY, 80))
	e.program(map[FrontendKey]Frontend{frontend: {Masquerade: true}})
	b.mu.Lock()
	b.startGrace()
	over = b.graceOver()
	b.mu.Unlock()
	<-over
	// Then it takes the lock and settles (a minute bounds a hang).
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		b.mu.Lock()
		cur := b.ret.cur
		b.mu.Unlock()
		if cur == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the grace period's goroutine did not settle")
		}
	}
	var v sockBackend
	if err := e.objs.WeftBackends.Lookup(idY, &v); err == nil {
		t.Fatalf("podY's entry left after the grace period: %+v", v)
	}
}

// TestGraceWaiter: the kernel takes the update of the map of maps (and
// waits for a grace period of its programs before returning).
func TestGraceWaiter(t *testing.T) {
	_ = newTCEnv(t) // root, private namespace
	g, err := newGraceWaiter()
	if err != nil {
		t.Fatal(err)
	}
	defer g.close()
	for range 3 {
		if err := g.wait(); err != nil {
			t.Fatal(err)
		}
	}
}

// backendID returns the backends map's key of ap, if the writer has it.
func (t *backendTable) backendID(ap netip.AddrPort) (uint32, bool) {
	i, ok := t.byAddr[keyOf(ap)]
	if !ok || t.backs[i].id == 0 {
		return 0, false
	}
	return t.backs[i].id, true
}

// backendAddr returns the address of the backend whose key is id.
func (t *backendTable) backendAddr(id uint32) netip.AddrPort {
	for _, b := range t.backs {
		if b.id == id {
			return b.key.addrPort()
		}
	}
	return netip.AddrPort{}
}
