package runner

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// recorder counts syncs and remembers which were full.
type recorder struct {
	mu    sync.Mutex
	syncs []bool
	fail  int // fail this many syncs first
	seen  chan struct{}
}

func (r *recorder) sync(_ context.Context, full bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.syncs = append(r.syncs, full)
	select {
	case r.seen <- struct{}{}:
	default:
	}
	if r.fail > 0 {
		r.fail--
		return errors.New("injected failure")
	}
	return nil
}

func (r *recorder) list() []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.syncs...)
}

func waitSyncs(t *testing.T, r *recorder, n int) []bool {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for len(r.list()) < n {
		select {
		case <-r.seen:
		case <-deadline:
			t.Fatalf("saw %d syncs, want %d", len(r.list()), n)
		}
	}
	return r.list()
}

// A burst of triggers within MinInterval costs one sync after the first.
func TestBurstCoalesces(t *testing.T) {
	rec := &recorder{seen: make(chan struct{}, 1)}
	r := New(rec.sync, 300*time.Millisecond, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	if got := waitSyncs(t, rec, 1); !got[0] {
		t.Fatal("the first sync is not full")
	}
	for i := 0; i < 100; i++ {
		r.Trigger()
	}
	waitSyncs(t, rec, 2)
	time.Sleep(700 * time.Millisecond) // room for any extra sync the burst would wrongly cause
	if got := rec.list(); len(got) != 2 || got[1] {
		t.Fatalf("100 triggers gave syncs %v, want exactly one more, partial", got)
	}
}

// A failed sync is retried, and the retry is full.
func TestRetryAfterFailure(t *testing.T) {
	rec := &recorder{fail: 2, seen: make(chan struct{}, 1)}
	r := New(rec.sync, 10*time.Millisecond, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	got := waitSyncs(t, rec, 3)
	for i, full := range got[:3] {
		if !full {
			t.Fatalf("sync %d after a failure is not full: %v", i, got)
		}
	}
	r.Trigger()
	if got = waitSyncs(t, rec, 4); got[3] {
		t.Fatalf("a trigger after recovery gave a full sync: %v", got)
	}
}

// The periodic full resync happens without triggers.
func TestPeriodicFull(t *testing.T) {
	rec := &recorder{seen: make(chan struct{}, 1)}
	r := New(rec.sync, time.Millisecond, 50*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	if got := waitSyncs(t, rec, 3); !got[1] || !got[2] {
		t.Fatalf("no periodic full syncs: %v", got)
	}
}
