package bgp

import (
	"context"
	"log/slog"
	"net/netip"
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
	// Installs follow the RIB with a bounded duty cycle: after one that
	// took d, the next waits until 4d have passed. Every update a peer
	// sends pokes, and each install lists the whole RIB (holding the
	// speaker's main loop) and the kernel's routes: a reflector passing on
	// a thousand routes would make each client do that a thousand times.
	// A lone change is still installed at once.
	var next time.Time
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
		case <-c.sp.Changes():
		case <-later.C:
		case <-tick.C:
			// Once settled, the tick only matters for the periodic resync,
			// which also retries what the last plan could not apply.
			if settled && time.Since(lastFull) < c.o.Resync {
				continue
			}
			if settled {
				c.applyInput(ctx)
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
			c.o.Log.Info("BGP: converged after start", "after", time.Since(start).Round(time.Millisecond))
		}
		if wait := time.Until(next); wait > 0 {
			later.Reset(wait)
			continue
		}
		t0 := time.Now()
		c.install(plan, settled)
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

func (c *Controller) install(plan Plan, prune bool) {
	cands, err := c.sp.Candidates()
	if err != nil {
		c.o.Log.Error("BGP: reading the RIB", "err", err)
		return
	}
	routes := Select(cands, plan.Import)
	if err := c.o.FIB.Sync(routes, prune); err != nil {
		c.o.Log.Error("BGP: installing routes", "err", err)
	}
}
