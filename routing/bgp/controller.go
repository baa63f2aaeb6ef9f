package bgp

import (
	"context"
	"log/slog"
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
	// default 30 s.
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
func (c *Controller) Run(ctx context.Context) {
	start := time.Now()
	settled := false
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastFull := time.Now()
	// What the kernel should hold is Select(RIB, plan's import policy).
	// A RIB change (or the resync) lists the RIB again; a new input only
	// selects again from the paths last listed, and touches the kernel
	// only if the selection changed: a Node update elsewhere in the
	// cluster, which every node sees, mostly changes nothing here.
	//
	// Installs follow with a bounded duty cycle: after one that took d,
	// the next waits until 4d have passed. Every update a peer sends
	// pokes, and each RIB listing holds the speaker's main loop: a
	// reflector passing on a thousand routes would make each client list
	// and install a thousand times. A lone change is still installed at
	// once.
	var (
		next      time.Time
		ribDirty  = true
		reselect  bool
		cands     []Candidate
		installed []Route
		synced    bool // installed is what the kernel holds
	)
	later := time.NewTimer(time.Hour)
	later.Stop()
	for {
		select {
		case <-ctx.Done():
			stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c.sp.Stop(stop, true)
			cancel()
			return
		case <-c.updates:
			c.applyInput(ctx)
			reselect = true
		case <-c.sp.Changes():
			ribDirty = true
		case <-later.C:
		case <-tick.C:
			// Once settled, the tick only matters for the periodic resync,
			// which also retries what the last plan could not apply and
			// repairs routes changed behind weft's back.
			if settled && time.Since(lastFull) >= c.o.Resync {
				c.applyInput(ctx)
				ribDirty = true
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
			ribDirty = true // the install that prunes stale routes
			c.o.Log.Info("BGP: converged after start", "after", time.Since(start).Round(time.Millisecond))
		}
		if !ribDirty && !reselect {
			continue
		}
		if !ribDirty && synced && slices.EqualFunc(Select(cands, plan.Import), installed, Route.Equal) {
			reselect = false
			continue
		}
		if wait := time.Until(next); wait > 0 {
			later.Reset(wait)
			continue
		}
		t0 := time.Now()
		if ribDirty {
			listed, err := c.sp.Candidates()
			if err != nil {
				// Kept dirty: the next tick tries again.
				c.o.Log.Error("BGP: reading the RIB", "err", err)
				continue
			}
			cands = listed
		}
		installed = Select(cands, plan.Import)
		err := c.o.FIB.Sync(installed, settled)
		if err != nil {
			c.o.Log.Error("BGP: installing routes", "err", err)
		}
		synced, ribDirty, reselect = err == nil, false, false
		lastFull = time.Now()
		next = lastFull.Add(4 * lastFull.Sub(t0))
	}
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
