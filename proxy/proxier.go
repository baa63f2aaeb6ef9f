// Package proxy is weft's service proxy: Services and EndpointSlices go into
// a change tracker (proxy/model), a bounded-frequency runner (proxy/runner)
// syncs the model into a backend (proxy/iptables, later nftables, IPVS,
// eBPF), and around the sync sit the health-check node ports, the UDP
// conntrack cleanup and the metrics. weft-proxy runs it standalone;
// weft-agent runs the same code on every node.
package proxy

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/proxy/healthcheck"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/runner"
)

// Backend programs the data plane from the model.
type Backend interface {
	// Sync makes the data plane match st; full rewrites everything.
	Sync(st model.State, full bool) error
	// Cleanup removes everything the backend installed.
	Cleanup() error
}

// Options configure a Proxier.
type Options struct {
	NodeName, Zone string
	MinSyncPeriod  time.Duration // default 100ms
	SyncPeriod     time.Duration // full resync, default 1h
	Log            *slog.Logger
	// Health serves health-check node ports; nil disables them.
	Health *healthcheck.Server
	// FlushUDP deletes stale UDP conntrack entries; nil disables it.
	FlushUDP func(StaleUDP) error
	// ResetTCP resets the TCP connections to endpoints that left their
	// Service (drain.go); nil: the backend cannot.
	ResetTCP func([]GoneEndpoint) ResetResult
	// TakeOver, run once after the first successful sync, removes what
	// other proxy modes left on the node (anything it leaves running stops
	// with ctx, Run's); nil: nothing.
	TakeOver func(ctx context.Context) error
}

// Proxier ties the tracker, the runner and a backend together.
type Proxier struct {
	opts    Options
	backend Backend
	tracker *model.Tracker
	runner  *runner.Runner
	metrics *Metrics
	started time.Time // trigger times before it are not this proxier's to measure

	synced     chan struct{} // closed by OnSynced
	syncedOnce sync.Once

	// triggers are the last-change-trigger-times of slice changes not yet
	// programmed: one per change since the last successful sync (while
	// syncs fail, they accumulate until one succeeds).
	mu       sync.Mutex
	triggers []time.Time

	// Owned by the sync loop. unflushed are the ports changed since the
	// last successful sync, with what that sync programmed (for the UDP
	// conntrack cleanup); healthPorts are the ports with a health-check
	// node port, kept from each snapshot's changes.
	unflushed   map[model.ServicePortName]model.Prior
	healthPorts map[model.ServicePortName]bool
	everSynced  bool
	lastSyncOK  atomic.Int64
	// Resets of gone endpoints run off the sync loop (one waits for its
	// clients' answers), one at a time (resetMu); pending counts those
	// queued and not done (under pendingMu, idle signalled at 0), which
	// Run waits for.
	resetMu   sync.Mutex
	pendingMu sync.Mutex
	pending   int
	idle      *sync.Cond
}

// New returns a proxier; feed it events, then Run it.
func New(b Backend, o Options) *Proxier {
	if o.MinSyncPeriod == 0 {
		o.MinSyncPeriod = 100 * time.Millisecond
	}
	if o.SyncPeriod == 0 {
		o.SyncPeriod = time.Hour
	}
	p := &Proxier{opts: o, backend: b, tracker: model.NewTracker(), metrics: NewMetrics(), started: time.Now(),
		synced: make(chan struct{}), unflushed: map[model.ServicePortName]model.Prior{},
		healthPorts: map[model.ServicePortName]bool{}}
	p.idle = sync.NewCond(&p.pendingMu)
	p.runner = runner.New(p.sync, o.MinSyncPeriod, o.SyncPeriod)
	return p
}

// Metrics returns the proxier's Prometheus metrics.
func (p *Proxier) Metrics() *Metrics { return p.metrics }

// OnService records a Service add (old nil), update or delete (new nil).
func (p *Proxier) OnService(old, new *corev1.Service) {
	p.tracker.OnService(old, new)
	p.runner.Trigger()
}

// OnEndpointSlice records an EndpointSlice add, update or delete. The
// slice's endpoints.kubernetes.io/last-change-trigger-time (when the
// EndpointSlice controller saw the Pod or Service change behind it) is kept
// until a sync programs the change, for network programming latency.
func (p *Proxier) OnEndpointSlice(old, new *discoveryv1.EndpointSlice) {
	p.tracker.OnEndpointSlice(old, new)
	if t, ok := p.triggerTime(new); ok {
		p.mu.Lock()
		p.triggers = append(p.triggers, t)
		p.mu.Unlock()
	}
	p.runner.Trigger()
}

// triggerTime is es's last-change-trigger-time, if it has one from after
// the proxier started (like kube-proxy, the state found at start-up is not
// measured: its changes happened before this proxier could program them).
// A deleted slice has none: its annotation dates from its last update.
func (p *Proxier) triggerTime(es *discoveryv1.EndpointSlice) (time.Time, bool) {
	if es == nil {
		return time.Time{}, false
	}
	v, ok := es.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		p.opts.Log.Warn("ignoring unparsable trigger time", "endpointslice", es.Namespace+"/"+es.Name,
			"field", "metadata.annotations["+corev1.EndpointsLastChangeTriggerTime+"]", "err", err)
		return time.Time{}, false
	}
	return t, t.After(p.started)
}

// OnSynced tells the proxier that the sources delivered their initial
// state: Run starts syncing only then, so that a restart never programs a
// partial view of the cluster (which would cut the Services not yet seen).
func (p *Proxier) OnSynced() { p.syncedOnce.Do(func() { close(p.synced) }) }

// Run waits for OnSynced, then syncs until ctx ends. The first sync is a
// full one, over the whole initial state.
func (p *Proxier) Run(ctx context.Context) {
	if p.opts.Health != nil {
		defer p.opts.Health.Close() // the node ports are free again once Run returns
	}
	defer p.WaitResets()
	select {
	case <-ctx.Done():
		return
	case <-p.synced:
	}
	p.runner.Run(ctx)
}

// Healthy reports whether the last sync succeeded (and one happened).
func (p *Proxier) Healthy() bool { return p.lastSyncOK.Load() > 0 }

// Cleanup removes what the backend installed.
func (p *Proxier) Cleanup() error { return p.backend.Cleanup() }

// sync is one round of syncing the rules. Its duration, observed whether it
// succeeds or not, is kubeproxy_sync_proxy_rules_duration_seconds (and the
// full or partial variant), as kube-proxy measures its syncProxyRules.
func (p *Proxier) sync(ctx context.Context, full bool) error {
	start := time.Now()
	defer p.metrics.observeSync(start, full)
	p.mu.Lock()
	triggers := p.triggers
	p.triggers = nil
	p.mu.Unlock()

	st, errs := p.tracker.Snapshot()
	for _, e := range errs {
		p.opts.Log.Warn("invalid object (see err for what is left out)", "kind", e.Kind, "key", e.Key, "field", e.Field, "err", e.Err)
	}
	for name, prior := range st.Delta.Changed {
		if _, ok := p.unflushed[name]; !ok {
			p.unflushed[name] = prior
		}
		sp := st.Ports[name]
		if sp != nil && sp.ExternalPolicyLocal && sp.HealthCheckNodePort != 0 {
			p.healthPorts[name] = true
		} else {
			delete(p.healthPorts, name)
		}
	}
	if err := p.backend.Sync(st, full); err != nil {
		p.lastSyncOK.Store(0)
		p.metrics.syncErrors.Inc()
		p.opts.Log.Error("sync failed", "err", err)
		p.mu.Lock()
		p.triggers = append(triggers, p.triggers...) // programmed by the retry
		p.mu.Unlock()
		return err
	}
	if !p.everSynced && p.opts.TakeOver != nil {
		if err := p.opts.TakeOver(ctx); err != nil {
			p.opts.Log.Warn("removing what other proxy modes left", "err", err)
		}
	}
	done := time.Now()
	p.lastSyncOK.Store(done.UnixNano())
	p.metrics.lastSync.SetToCurrentTime()
	for _, t := range triggers {
		p.metrics.programming.Observe(done.Sub(t).Seconds())
	}
	p.metrics.servicePorts.Set(float64(len(st.Ports)))
	p.syncHealth(st)
	if p.everSynced {
		p.flushConntrack(st, p.unflushed)
		if p.opts.ResetTCP != nil {
			if gone := goneEndpoints(st, p.unflushed); len(gone) > 0 {
				p.queueReset(gone)
			}
		}
	}
	clear(p.unflushed)
	p.everSynced = true
	return nil
}

// syncHealth serves a health-check port for each Service with
// externalTrafficPolicy Local, counting this node's Ready endpoints. Only
// Ready ones count, as in kube-proxy: while a node's endpoints are all
// terminating, its connections still drain to them (Select falls back to
// them) but the check fails, so a load balancer sends new ones elsewhere.
func (p *Proxier) syncHealth(st model.State) {
	if p.opts.Health == nil {
		return
	}
	want := map[uint16]healthcheck.Service{}
	for name := range p.healthPorts {
		sp := st.Ports[name]
		local := 0
		for _, e := range st.Endpoints[name] {
			if e.Ready && e.NodeName != "" && e.NodeName == p.opts.NodeName {
				local++
			}
		}
		cur := want[sp.HealthCheckNodePort]
		cur.Namespace, cur.Name = name.Namespace, name.Name
		cur.LocalEndpoints = max(cur.LocalEndpoints, local)
		want[sp.HealthCheckNodePort] = cur
	}
	if err := p.opts.Health.Sync(want); err != nil {
		p.opts.Log.Warn("health check node ports", "err", err)
	}
}

// flushConntrack removes UDP conntrack entries that would keep clients on
// an endpoint no longer used (gone, unusable, or moved to another target
// port), or on a Service address or node port that used to have no
// endpoints; changed are the ports changed since the previous successful
// sync, with what it programmed.
func (p *Proxier) flushConntrack(st model.State, changed map[model.ServicePortName]model.Prior) {
	if p.opts.FlushUDP == nil {
		return
	}
	for name, prev := range changed {
		sp := st.Ports[name]
		old := prev.Port
		if (sp != nil && sp.Protocol != model.UDP) || (sp == nil && (old == nil || old.Protocol != model.UDP)) {
			continue
		}
		var stale []StaleUDP
		now := usableEndpoints(st.Endpoints[name])
		had := usableEndpoints(prev.Endpoints)
		for ep := range had {
			if !now[ep] {
				stale = append(stale, StaleUDP{Endpoint: ep})
			}
		}
		if sp != nil && len(had) == 0 && len(now) > 0 {
			for _, vip := range slices.Concat(sp.ClusterIPs, sp.ExternalIPs, sp.LoadBalancerIPs) {
				stale = append(stale, StaleUDP{Dest: netip.AddrPortFrom(vip, sp.Port)})
			}
			if sp.NodePort != 0 {
				stale = append(stale, StaleUDP{Dest: netip.AddrPortFrom(netip.Addr{}, sp.NodePort)})
			}
		}
		for _, s := range stale {
			if err := p.opts.FlushUDP(s); err != nil {
				p.opts.Log.Warn("conntrack cleanup", "service", name.String(), "err", err)
			}
		}
	}
}

// WaitResets waits until no reset of gone endpoints is queued or running.
func (p *Proxier) WaitResets() {
	p.pendingMu.Lock()
	defer p.pendingMu.Unlock()
	for p.pending > 0 {
		p.idle.Wait()
	}
}

// queueReset resets the connections to gone endpoints in the background,
// after any reset still running, counting and logging what it did.
func (p *Proxier) queueReset(gone []GoneEndpoint) {
	p.pendingMu.Lock()
	p.pending++
	p.pendingMu.Unlock()
	go func() {
		defer func() {
			p.pendingMu.Lock()
			if p.pending--; p.pending == 0 {
				p.idle.Broadcast()
			}
			p.pendingMu.Unlock()
		}()
		p.resetMu.Lock()
		defer p.resetMu.Unlock()
		res := p.opts.ResetTCP(gone)
		p.metrics.observeReset(res)
		eps := make([]string, len(gone))
		for i, g := range gone {
			eps[i] = g.Service.String() + " " + g.Endpoint.String()
		}
		if res.Reset+res.Aborted+res.Unanswered+res.Unreachable > 0 {
			p.opts.Log.Info("reset the connections of removed endpoints", "endpoints", eps,
				"reset", res.Reset, "aborted", res.Aborted, "unanswered", res.Unanswered, "unreachable", res.Unreachable)
		}
		if res.Err != nil {
			p.opts.Log.Warn("resetting the connections of removed endpoints", "endpoints", eps, "err", res.Err)
		}
	}()
}

// usableEndpoints is the set of addresses and ports traffic may go to.
func usableEndpoints(eps []model.Endpoint) map[netip.AddrPort]bool {
	set := make(map[netip.AddrPort]bool, len(eps))
	for _, e := range eps {
		if model.Usable(e) {
			set[netip.AddrPortFrom(e.IP, e.Port)] = true
		}
	}
	return set
}
