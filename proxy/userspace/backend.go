package userspace

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/model"
)

// Config configures the userspace backend.
type Config struct {
	NodeName, Zone string
	// Listen, when valid, is rootless mode: every service port gets a
	// listener on this address and no kernel rule is written. Invalid:
	// redirect mode.
	Listen netip.Addr
	// Families are the IP families of redirect mode (4, 6): listeners on
	// their wildcard addresses, glue for their frontends.
	Families []int
	// NodePortIPs are the node addresses NodePorts answer on.
	NodePortIPs []netip.Addr
	// ClusterCIDRs: clients inside them, like the node itself, get the
	// cluster-wide endpoints of an externalTrafficPolicy Local Service.
	ClusterCIDRs []netip.Prefix
	// Glue is the kernel glue of redirect mode: "iptables", "nftables", or
	// "" for iptables when iptables-restore is installed, else nftables.
	Glue string
	// IPTablesVariant picks the iptables tools ("", "nft", "legacy").
	IPTablesVariant string
	// PortRange is where listeners take their ports (default
	// DefaultPortRange).
	PortRange PortRange
	// MaxConnections bounds the concurrent proxied TCP connections,
	// MaxUDPSessions the UDP sessions (defaults 4096 each).
	MaxConnections, MaxUDPSessions int
	// UDPIdleTimeout ends a UDP session without traffic either way
	// (default 10 s).
	UDPIdleTimeout time.Duration
	// DialTimeout bounds one attempt to connect to an endpoint; an endpoint
	// that does not answer within it is skipped for the next (default 1 s).
	DialTimeout time.Duration
	// Log gets the listeners opened and closed and the ports that cannot
	// be bound (default: discarded).
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.PortRange == (PortRange{}) {
		c.PortRange = DefaultPortRange
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = 4096
	}
	if c.MaxUDPSessions <= 0 {
		c.MaxUDPSessions = 4096
	}
	if c.UDPIdleTimeout <= 0 {
		c.UDPIdleTimeout = 10 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if len(c.Families) == 0 {
		c.Families = []int{4}
	}
	return c
}

// glueApplier writes the kernel glue of redirect mode.
type glueApplier interface {
	apply(g GlueSpec, full bool) error
	cleanup() error
}

// Backend is the userspace proxy backend (see the package doc).
type Backend struct {
	cfg     Config
	addrs   []netip.Addr // the addresses every listener binds
	glue    glueApplier  // nil in rootless mode
	metrics *metrics
	now     func() time.Time

	tcpLimit, udpLimit limiter
	// localAddrs are the node's own addresses (refreshed at each sync):
	// clients that, like pods, get the cluster-wide endpoints of an
	// externalTrafficPolicy Local Service.
	localAddrs atomic.Pointer[map[netip.Addr]bool]

	// syncMu serialises Sync and Cleanup (the glue's state); mu guards
	// the maps below, which the data path and the service map read too.
	syncMu    sync.Mutex
	lastGlue  GlueSpec
	glued     bool
	mu        sync.Mutex
	listeners map[Key]*listener
	failed    map[Key]failure          // listeners that could not be bound
	conns     map[*net.TCPConn]proxied // by client connection
	closed    bool
}

// proxied is one proxied TCP connection: the client's, the one to the
// endpoint, and the service port it went through.
type proxied struct {
	client, up *net.TCPConn
	port       model.ServicePortName
	endpoint   netip.AddrPort
}

// failure is a listener without a socket, and why.
type failure struct {
	spec Listener
	err  error
	// permanent: retrying cannot help (SCTP); not a sync error.
	permanent bool
}

// New returns a backend. In redirect mode it picks and checks the glue.
func New(cfg Config) (*Backend, error) {
	cfg = cfg.withDefaults()
	b := &Backend{cfg: cfg, metrics: newMetrics(cfg), now: time.Now,
		listeners: map[Key]*listener{}, failed: map[Key]failure{}, conns: map[*net.TCPConn]proxied{}}
	b.tcpLimit.max, b.udpLimit.max = int64(cfg.MaxConnections), int64(cfg.MaxUDPSessions)
	b.localAddrs.Store(&map[netip.Addr]bool{})
	if cfg.Listen.IsValid() {
		b.addrs = []netip.Addr{cfg.Listen.Unmap()}
		return b, nil
	}
	for _, f := range cfg.Families {
		if f == 6 {
			b.addrs = append(b.addrs, netip.IPv6Unspecified())
		} else {
			b.addrs = append(b.addrs, netip.IPv4Unspecified())
		}
	}
	glue := cfg.Glue
	if glue == "" {
		glue = "nftables"
		if _, err := exec.LookPath(iptablesTool(cfg.IPTablesVariant)); err == nil {
			glue = "iptables"
		}
	}
	switch glue {
	case "iptables":
		b.glue = &iptablesGlue{runner: iptables.Exec{Variant: cfg.IPTablesVariant}, families: cfg.Families, clusterCIDRs: cfg.ClusterCIDRs}
	case "nftables":
		ng, err := newNFTGlue(cfg.ClusterCIDRs)
		if err != nil {
			return nil, err
		}
		b.glue = ng
	default:
		return nil, fmt.Errorf("--userspace-glue: %q is not iptables or nftables", cfg.Glue)
	}
	return b, nil
}

func iptablesTool(variant string) string {
	if variant != "" {
		return "iptables-" + variant + "-restore"
	}
	return "iptables-restore"
}

// Rootless reports whether the backend runs without kernel rules.
func (b *Backend) Rootless() bool { return b.cfg.Listen.IsValid() }

func (b *Backend) planConfig() PlanConfig {
	return PlanConfig{NodeName: b.cfg.NodeName, Zone: b.cfg.Zone, Rootless: b.Rootless(), NodePortIPs: b.cfg.NodePortIPs}
}

// Sync makes the listeners, then the glue, match st. Every listener that
// can be bound is; the error names each Service port that could not be
// (its frontends are rejected meanwhile), and the next sync tries again.
func (b *Backend) Sync(st model.State, full bool) error {
	b.syncMu.Lock()
	defer b.syncMu.Unlock()
	plan := Plan(b.planConfig(), st)
	b.refreshLocalAddrs(plan)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return errors.New("userspace proxy: synced after cleanup")
	}
	errs, gone := b.reconcile(plan)
	bound := make(map[Key]uint16, len(b.listeners))
	for k, l := range b.listeners {
		bound[k] = l.port
	}
	b.mu.Unlock()
	if b.glue != nil {
		g := Glue(plan, bound)
		if full || !b.glued || !g.Equal(b.lastGlue) {
			if err := b.glue.apply(g, full || !b.glued); err != nil {
				b.glued = false
				errs = append(errs, fmt.Errorf("userspace proxy glue: %w", err))
			} else {
				b.lastGlue, b.glued = g, true
			}
		}
	}
	// Closed only now: the glue no longer sends anything to them.
	for _, l := range gone {
		b.closeListener(l)
	}
	b.metrics.listeners.Set(float64(len(bound)))
	b.metrics.failures.Set(float64(len(plan) - len(bound)))
	return errors.Join(errs...)
}

// reconcile binds the planned listeners that have none, hands existing ones
// their new spec, and returns the bind errors and the listeners no longer
// planned, to close once the glue has let go of them (rootless mode, which
// has no glue, closes them first, so that their ports are free for new
// listeners). b.mu is held.
func (b *Backend) reconcile(plan []Listener) ([]error, []*listener) {
	var errs []error
	want := make(map[Key]*Listener, len(plan))
	for i := range plan {
		want[plan[i].Key] = &plan[i]
	}
	var gone []*listener
	for k, l := range b.listeners {
		// A listener on its Service's own port (rootless) whose Service
		// moved to another port follows it.
		if spec := want[k]; spec == nil || (l.own && l.port != spec.ServicePort) {
			gone = append(gone, l)
			delete(b.listeners, k)
		}
	}
	for k := range b.failed {
		if want[k] == nil {
			delete(b.failed, k)
		}
	}
	if b.Rootless() {
		// No glue points at them: their ports are free for the new.
		for _, l := range gone {
			b.closeListener(l)
		}
		gone = nil
	}
	for _, spec := range plan {
		if l, ok := b.listeners[spec.Key]; ok {
			l.update(spec)
			continue
		}
		if f, ok := b.failed[spec.Key]; ok && f.permanent {
			b.failed[spec.Key] = failure{spec: spec, err: f.err, permanent: true}
			continue
		}
		l, err := b.bind(spec)
		if err != nil {
			permanent := errors.Is(err, errSCTP)
			if _, known := b.failed[spec.Key]; !known || !permanent {
				b.cfg.Log.Warn("cannot listen", "service", svcName(spec.Key), "port", spec.Key.Port.Port, "protocol", spec.Protocol, "err", err)
			}
			b.failed[spec.Key] = failure{spec: spec, err: err, permanent: permanent}
			if !permanent {
				errs = append(errs, err)
			}
			continue
		}
		delete(b.failed, spec.Key)
		b.listeners[spec.Key] = l
		b.cfg.Log.Info("listening", "service", svcName(spec.Key), "port", spec.Key.Port.Port, "protocol", spec.Protocol,
			"scope", spec.Key.Scope, "address", l.address(), "servicePort", spec.ServicePort)
	}
	return errs, gone
}

// closeListener closes a listener no longer planned.
func (b *Backend) closeListener(l *listener) {
	l.close()
	b.cfg.Log.Info("stopped listening", "service", svcName(l.key), "port", l.key.Port.Port, "protocol", l.proto, "scope", l.key.Scope)
}

var errSCTP = errors.New("SCTP is not supported by the userspace proxy")

// describe names a listener's Service and port for errors.
func describe(k Key, servicePort uint16) string {
	port := fmt.Sprintf("%d/%s", servicePort, k.Port.Protocol)
	if k.Port.Port != "" {
		port = fmt.Sprintf("%s (%s)", k.Port.Port, port)
	}
	s := fmt.Sprintf("service %s port %s", svcName(k), port)
	if k.Scope == External {
		s += " (NodePort, externalIPs, LoadBalancer IPs)"
	}
	return s
}

func svcName(k Key) string { return k.Port.Namespace + "/" + k.Port.Name }

// refreshLocalAddrs re-reads the node's addresses when a listener needs
// them (externalTrafficPolicy Local: the node's own connections get the
// cluster-wide endpoints).
func (b *Backend) refreshLocalAddrs(plan []Listener) {
	need := slices.ContainsFunc(plan, func(l Listener) bool { return l.ByFamily[0].Cluster != nil || l.ByFamily[1].Cluster != nil })
	if !need {
		return
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		b.cfg.Log.Warn("listing the node's addresses", "err", err)
		return
	}
	set := map[netip.Addr]bool{}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			set[p.Addr()] = true
		}
	}
	b.localAddrs.Store(&set)
}

// internalClient reports whether a is a pod or the node itself.
func (b *Backend) internalClient(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() || (*b.localAddrs.Load())[a] {
		return true
	}
	return slices.ContainsFunc(b.cfg.ClusterCIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
}

// Cleanup closes every listener, connection and session and removes the
// glue, including one an earlier process left.
func (b *Backend) Cleanup() error {
	b.syncMu.Lock()
	defer b.syncMu.Unlock()
	b.mu.Lock()
	b.closed = true
	ls := b.listeners
	b.listeners = map[Key]*listener{}
	conns := b.conns
	b.conns = map[*net.TCPConn]proxied{}
	b.mu.Unlock()
	for _, l := range ls {
		l.close()
	}
	for _, p := range conns {
		reset(p.client)
		reset(p.up)
	}
	if b.glue == nil {
		return nil
	}
	b.glued = false
	return b.glue.cleanup()
}

// track and untrack keep the proxied connections, which Cleanup ends.
func (b *Backend) track(p proxied) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.conns[p.client] = p
	return true
}

func (b *Backend) untrack(p proxied) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.conns, p.client)
}

// ResetTCP resets, on both sides, the proxied connections to endpoints
// that left their service port (gone reports which) and returns how many.
// The client's socket fails with ECONNRESET.
func (b *Backend) ResetTCP(gone func(port model.ServicePortName, endpoint netip.AddrPort) bool) int {
	b.mu.Lock()
	var hit []proxied
	for _, p := range b.conns {
		if gone(p.port, p.endpoint) {
			hit = append(hit, p)
		}
	}
	b.mu.Unlock()
	for _, p := range hit {
		reset(p.client)
		reset(p.up)
	}
	return len(hit)
}

// limiter bounds a count of things (connections, sessions).
type limiter struct {
	max int64
	n   atomic.Int64
}

func (l *limiter) acquire() bool {
	if l.n.Add(1) > l.max {
		l.n.Add(-1)
		return false
	}
	return true
}

func (l *limiter) release() { l.n.Add(-1) }
