package bgp

import (
	"context"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// ControllerOptions configure a Controller.
type ControllerOptions struct {
	Speaker SpeakerOptions
	FIB     FIB
	// Resync re-applies the learned routes to the kernel (repairs drift);
	// default 30 s, each period drawn between 3/4 and 5/4 of it so that
	// agents started together (a DaemonSet rollout) do not resync in
	// step.
	Resync time.Duration
	// Settle bounds how long a starting controller keeps routes a previous
	// run installed while waiting for its peers' End-of-RIB; default 30 s.
	// Once every peer has sent it, stale routes go at once.
	Settle time.Duration
	// PeerWait is how long a starting controller waits for peers whose
	// session is not up yet before it stops counting them (default 5 s):
	// one unreachable peer must not hold stale routes for Settle.
	PeerWait time.Duration
	Log      *slog.Logger
}

// Controller runs a node's BGP: it computes the Plan from the latest
// Input, drives the Speaker with it, and installs what Select picks from
// the RIB through the FIB. Routes stay in the kernel when it stops (an
// agent restart keeps forwarding); FIB.Cleanup removes them.
type Controller struct {
	o       ControllerOptions
	sp      *Speaker
	updates chan struct{}

	mu    sync.Mutex
	input Input
	hasIn bool
	plan  Plan
}

// NewController returns a controller; Run starts it.
func NewController(o ControllerOptions) *Controller {
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	if o.Settle == 0 {
		o.Settle = 30 * time.Second
	}
	if o.PeerWait == 0 {
		o.PeerWait = 5 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Speaker.Log == nil {
		o.Speaker.Log = o.Log.With("component", "gobgp")
	}
	return &Controller{o: o, sp: NewSpeaker(o.Speaker), updates: make(chan struct{}, 1)}
}

// Update hands the controller a new Input; the latest one wins.
func (c *Controller) Update(in Input) {
	c.mu.Lock()
	c.input, c.hasIn = in, true
	c.mu.Unlock()
	select {
	case c.updates <- struct{}{}:
	default:
	}
}

// Established lists the peers whose session is up.
func (c *Controller) Established() []netip.Addr { return c.sp.Established() }

// Run applies updates until ctx ends, then stops the speaker gracefully:
// peers keep this node's routes for the restart time, and the kernel keeps
// the learned ones.
//
// The controller keeps a copy of the RIB and the routes it put in the
// kernel. A full sync lists the whole RIB, selects, and makes the kernel's
// table match: at start, when the speaker starts, a session goes up or down
// or a peer sends End-of-RIB, at every Resync, and to retry what failed.
// Anything else changes a few prefixes: the speaker hands over the paths
// peers sent or lost (the copy follows them), and a new input changes the
// import policy for some. Only those prefixes are selected and written
// (FIB.Update), with no listing of the RIB or read of the kernel: a podCIDR
// assigned anywhere in a cluster of a hundred nodes costs each node a
// route write, not a listing of its RIB and its table.
func (c *Controller) Run(ctx context.Context) {
	start := time.Now()
	settled := false
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var (
		rib       map[netip.Prefix][]Candidate
		installed map[netip.Prefix][]netip.Addr // nil: a full sync is due
		policy    ImportPolicy                  // installed was selected with it
		replanned bool                          // the plan may have changed since
		dirty     = map[netip.Prefix]bool{}
		lastFull  = time.Now()
		resyncIn  = c.resyncPeriod()
		// Full syncs keep a duty cycle: after one that took d, the next
		// waits until 4d have passed (listing the RIB holds the speaker's
		// main loop), but never more than fullGap: changes that come
		// meanwhile wait for it (a listing under a burst of updates can
		// take seconds).
		next    time.Time
		retryAt time.Time // a failed change is retried then by a full sync
		backoff = time.Second
	)
	later := time.NewTimer(time.Hour)
	later.Stop()
	failed := func(err error, what string) {
		c.o.Log.Error("BGP: "+what, "err", err)
		retryAt = time.Now().Add(backoff)
		backoff = min(2*backoff, c.o.Resync)
	}
	for {
		select {
		case <-ctx.Done():
			stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c.sp.Stop(stop, true)
			cancel()
			return
		case <-c.updates:
			c.applyInput(ctx)
			replanned = true
		case <-c.sp.Changes():
		case <-later.C:
		case <-tick.C:
			// The periodic resync also retries what the last plan could
			// not apply and repairs routes changed behind weft's back.
			if settled && time.Since(lastFull) >= resyncIn {
				c.applyInput(ctx)
				installed = nil
			}
			if !retryAt.IsZero() && !time.Now().Before(retryAt) {
				installed = nil
			}
		}
		changes, relist := c.sp.TakeChanges()
		if relist {
			installed = nil
		}
		if installed != nil { // else a listing to come holds them
			for _, ch := range changes {
				applyChange(rib, ch)
				dirty[ch.Prefix] = true
			}
		}
		c.mu.Lock()
		plan := c.plan
		c.mu.Unlock()
		if !plan.RouterID.IsValid() {
			continue
		}
		if !settled && (c.sp.Converged(plan, time.Since(start) > c.o.PeerWait) || time.Since(start) > c.o.Settle) {
			settled = true
			installed = nil // the sync that prunes stale routes
			c.o.Log.Info("BGP: converged after start", "after", time.Since(start).Round(time.Millisecond))
		}
		if installed == nil {
			if wait := time.Until(next); wait > 0 {
				later.Reset(wait)
				continue
			}
			t0 := time.Now()
			cands, err := c.sp.Candidates()
			if err != nil {
				failed(err, "reading the RIB")
				continue
			}
			rib = map[netip.Prefix][]Candidate{}
			addPaths(rib, cands)
			routes := Select(cands, plan.Import)
			installed = make(map[netip.Prefix][]netip.Addr, len(routes))
			for _, r := range routes {
				installed[r.Dst] = r.NextHops
			}
			policy, replanned = plan.Import, false
			clear(dirty)
			retryAt = time.Time{}
			if err := c.o.FIB.Sync(routes, settled); err != nil {
				failed(err, "installing routes")
			} else {
				backoff = time.Second
			}
			lastFull, resyncIn = time.Now(), c.resyncPeriod()
			if d := lastFull.Sub(t0); d > time.Second {
				c.o.Log.Info("BGP: slow full sync", "routes", len(routes), "took", d.Round(time.Millisecond))
			}
			next = lastFull.Add(min(4*lastFull.Sub(t0), fullGap))
			continue
		}
		// The policy is compared only when a new input came: a burst of
		// updates from peers leaves it alone.
		var check []netip.Prefix
		all := false
		if replanned {
			check, all = policy.changes(plan.Import)
			policy, replanned = plan.Import, false
		}
		if len(dirty) == 0 && len(check) == 0 && !all {
			continue
		}
		check = slices.AppendSeq(check, maps.Keys(dirty))
		clear(dirty)
		if all {
			check = slices.AppendSeq(slices.AppendSeq(check, maps.Keys(rib)), maps.Keys(installed))
		}
		set, del := reselect(rib, installed, check, policy)
		if err := c.o.FIB.Update(set, del); err != nil {
			failed(err, "installing routes")
		}
	}
}

// fullGap bounds the wait between two full syncs.
const fullGap = time.Second

// resyncPeriod draws the time until the next resync.
func (c *Controller) resyncPeriod() time.Duration {
	return c.o.Resync*3/4 + rand.N(c.o.Resync/2+1)
}

// applyInput computes the plan of the latest input and applies it.
func (c *Controller) applyInput(ctx context.Context) {
	c.mu.Lock()
	in, ok := c.input, c.hasIn
	c.mu.Unlock()
	if !ok {
		return
	}
	plan, errs := Compute(in)
	for _, err := range errs {
		c.o.Log.Warn("BGP: left out of the plan", "node", in.Self, "err", err)
	}
	if !plan.RouterID.IsValid() {
		// The node itself is gone from the API: its routes must go from
		// every peer now, so no graceful restart.
		c.sp.Stop(ctx, false)
		plan = Plan{}
	} else if err := c.sp.Apply(ctx, plan); err != nil {
		c.o.Log.Error("BGP: applying the plan", "node", in.Self, "err", err)
	}
	c.mu.Lock()
	c.plan = plan
	c.mu.Unlock()
}

// addPaths files paths in rib by prefix.
func addPaths(rib map[netip.Prefix][]Candidate, paths []Candidate) {
	for _, cd := range paths {
		p := cd.Prefix.Masked()
		rib[p] = append(rib[p], cd)
	}
}

// applyChange updates rib with a path a peer sent or lost.
func applyChange(rib map[netip.Prefix][]Candidate, ch PathChange) {
	paths := slices.DeleteFunc(rib[ch.Prefix], func(c Candidate) bool { return c.Peer == ch.Peer })
	if ch.Path != nil {
		paths = append(paths, *ch.Path)
	}
	if len(paths) == 0 {
		delete(rib, ch.Prefix)
		return
	}
	rib[ch.Prefix] = paths
}

// reselect selects again, with policy, the routes to the prefixes in check
// from rib, and returns what changed from installed (which it updates):
// the routes to write and the destinations to delete.
func reselect(rib map[netip.Prefix][]Candidate, installed map[netip.Prefix][]netip.Addr, check []netip.Prefix, policy ImportPolicy) (set []Route, del []netip.Prefix) {
	for _, p := range check {
		want := Select(rib[p], policy)
		cur, had := installed[p]
		switch {
		case len(want) == 1 && (!had || !slices.Equal(cur, want[0].NextHops)):
			set = append(set, want[0])
			installed[p] = want[0].NextHops
		case len(want) == 0 && had:
			del = append(del, p)
			delete(installed, p)
		}
	}
	return set, del
}
