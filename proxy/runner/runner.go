// Package runner is the service proxy's bounded-frequency sync loop: changes
// trigger a sync no sooner than MinInterval after the previous one (so a
// burst of events costs one sync), a full resync runs every FullInterval,
// and a failed sync is retried with exponential backoff.
package runner

import (
	"context"
	"time"
)

// SyncFunc programs the data plane; full asks for a complete rewrite.
type SyncFunc func(ctx context.Context, full bool) error

// Runner calls a SyncFunc with bounded frequency.
type Runner struct {
	MinInterval  time.Duration
	FullInterval time.Duration
	MaxBackoff   time.Duration
	Sync         SyncFunc
	trigger      chan struct{}
}

// New returns a runner; call Trigger when state changes and Run to loop.
func New(sync SyncFunc, minInterval, fullInterval time.Duration) *Runner {
	return &Runner{MinInterval: minInterval, FullInterval: fullInterval, MaxBackoff: 30 * time.Second,
		Sync: sync, trigger: make(chan struct{}, 1)}
}

// Trigger asks for a sync; triggers coalesce.
func (r *Runner) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run syncs until ctx ends. The first sync is full.
func (r *Runner) Run(ctx context.Context) {
	full := true
	var last time.Time
	backoff := time.Duration(0)
	fullTimer := time.NewTimer(r.FullInterval)
	defer fullTimer.Stop()
	for {
		if !full && backoff == 0 {
			select {
			case <-ctx.Done():
				return
			case <-r.trigger:
			case <-fullTimer.C:
				full = true
			}
		}
		wait := r.MinInterval - time.Since(last)
		if backoff > wait {
			wait = backoff
		}
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		// Events that arrived while waiting are covered by this sync.
		select {
		case <-r.trigger:
		default:
		}
		last = time.Now()
		if err := r.Sync(ctx, full); err != nil {
			backoff = min(max(2*backoff, r.MinInterval, 100*time.Millisecond), r.MaxBackoff)
			full = true // kernel state unknown after a failure
			continue
		}
		backoff = 0
		if full {
			full = false
			if !fullTimer.Stop() {
				select {
				case <-fullTimer.C:
				default:
				}
			}
			fullTimer.Reset(r.FullInterval)
		}
	}
}
