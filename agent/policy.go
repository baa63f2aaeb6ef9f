package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/ipam"
	"github.com/weftnet/weft/policy"
)

// PolicyOptions configure NetworkPolicy enforcement on one node.
type PolicyOptions struct {
	NodeName string
	// Mode is the data plane: PolicyModeIPTables (default) or
	// PolicyModeNFTables.
	Mode     string
	LogDrops bool
	// MinSyncPeriod coalesces bursts of changes (default 100 ms).
	MinSyncPeriod time.Duration
	// Resync re-applies everything periodically, repairing drift (default 30 s).
	Resync time.Duration
	// IPAMDataDir is the CNI plugin's allocation state: when set, traffic
	// from a pod's bridge port must carry that pod's address (source
	// check, see policy/iptables ChainSource and policy/nftables
	// ChainSource), reconciled from it, and
	// new pods are default-deny until programmed (see policy_pending.go).
	IPAMDataDir string
	// Bridge is the pods' bridge (default cni.DefaultBridge).
	Bridge string
	// PendingTimeout bounds how long a new pod attachment that the agent
	// cannot tie to a Pod stays default-deny (DefaultPendingTimeout).
	PendingTimeout time.Duration
	// ClusterPolicies: ClusterNetworkPolicies are served, and the first
	// sync waits for them (kube.WatchClusterPolicies feeds them) as for
	// the NetworkPolicies.
	ClusterPolicies bool
	// ClusterStatus, when set, writes each ClusterNetworkPolicy's status
	// condition: enforced as written, or what fails closed.
	ClusterStatus ClusterStatusWriter
	Log           *slog.Logger
}

// ClusterStatusWriter writes a ClusterNetworkPolicy's condition for its
// problems (kube.ClusterPolicyStatus); done false: try again later.
type ClusterStatusWriter interface {
	Report(ctx context.Context, p *cnpv1beta1.ClusterNetworkPolicy, problems []string) (done bool, err error)
}

// PolicyController enforces NetworkPolicies and ClusterNetworkPolicies
// for the pods of its node: it keeps the Pods, Namespaces, NetworkPolicies,
// ClusterNetworkPolicies and Nodes it is fed (it is a kube.PolicyHandler
// and a kube.ClusterPolicyHandler), compiles them (policy.Compile),
// renders the node's part (policy/iptables or policy/nftables) and
// applies it, after every burst of changes.
type PolicyController struct {
	opts    PolicyOptions
	backend policyBackend
	v6      atomic.Bool // the node has IPv6 pods
	metrics *policyMetrics
	trigger chan struct{}
	synced  chan struct{}
	once    sync.Once
	// clusterSynced is closed once the ClusterNetworkPolicies arrived.
	clusterSynced chan struct{}
	clusterOnce   sync.Once
	// allocated is poked by saves of the CNI allocations: a new pod
	// waits for the next sync, which skips the coalescing delay for it.
	allocated chan struct{}
	allocSeen atomic.Int64 // unix nanos of the first save noticed since the last sync, 0 if none
	pending   pendingState // sync loop only
	deny      denyLog

	mu       sync.Mutex
	pods     map[string]*corev1.Pod
	nss      map[string]*corev1.Namespace
	pols     map[string]*networkingv1.NetworkPolicy
	cluster  map[string]*cnpv1beta1.ClusterNetworkPolicy
	nodes    map[string]*corev1.Node
	rejected map[string]string // policy key -> last logged problems
	// reported is, per ClusterNetworkPolicy, the generation and problems
	// its status says (sync loop only).
	reported map[string]string
}

// NewPolicyController returns a controller; feed it with kube.WatchPolicies
// and start Run. The nftables mode checks nft and the kernel first; the
// error names what is missing.
func NewPolicyController(o PolicyOptions) (*PolicyController, error) {
	if o.MinSyncPeriod == 0 {
		o.MinSyncPeriod = 100 * time.Millisecond
	}
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	if o.Bridge == "" {
		o.Bridge = cni.DefaultBridge
	}
	if o.PendingTimeout == 0 {
		o.PendingTimeout = DefaultPendingTimeout
	}
	backend, err := newPolicyBackend(o.Mode)
	if err != nil {
		return nil, err
	}
	c := &PolicyController{allocated: make(chan struct{}, 1), opts: o, backend: backend,
		trigger: make(chan struct{}, 1), synced: make(chan struct{}), clusterSynced: make(chan struct{}),
		pods: map[string]*corev1.Pod{}, nss: map[string]*corev1.Namespace{}, pols: map[string]*networkingv1.NetworkPolicy{},
		cluster: map[string]*cnpv1beta1.ClusterNetworkPolicy{}, nodes: map[string]*corev1.Node{}, rejected: map[string]string{}, reported: map[string]string{}}
	if !o.ClusterPolicies {
		close(c.clusterSynced)
	}
	c.metrics = newPolicyMetrics(c.backend.drops)
	return c, nil
}

// Registry holds the policy metrics.
func (c *PolicyController) Registry() *prometheus.Registry { return c.metrics.registry }

// OnPolicyPod implements kube.PolicyHandler.
func (c *PolicyController) OnPolicyPod(old, new *corev1.Pod) {
	c.mu.Lock()
	if new != nil {
		c.pods[new.Namespace+"/"+new.Name] = new
	} else if old != nil {
		delete(c.pods, old.Namespace+"/"+old.Name)
	}
	c.mu.Unlock()
	c.poke()
}

// OnNamespace implements kube.PolicyHandler.
func (c *PolicyController) OnNamespace(old, new *corev1.Namespace) {
	c.mu.Lock()
	if new != nil {
		c.nss[new.Name] = new
	} else if old != nil {
		delete(c.nss, old.Name)
	}
	c.mu.Unlock()
	c.poke()
}

// OnNetworkPolicy implements kube.PolicyHandler.
func (c *PolicyController) OnNetworkPolicy(old, new *networkingv1.NetworkPolicy) {
	c.mu.Lock()
	if new != nil {
		c.pols[new.Namespace+"/"+new.Name] = new
	} else if old != nil {
		delete(c.pols, old.Namespace+"/"+old.Name)
	}
	c.mu.Unlock()
	c.poke()
}

// OnClusterNetworkPolicy implements kube.ClusterPolicyHandler.
func (c *PolicyController) OnClusterNetworkPolicy(old, new *cnpv1beta1.ClusterNetworkPolicy) {
	c.mu.Lock()
	if new != nil {
		c.cluster[new.Name] = new
	} else if old != nil {
		delete(c.cluster, old.Name)
	}
	c.mu.Unlock()
	c.poke()
}

// OnPolicyNode implements kube.ClusterPolicyHandler.
func (c *PolicyController) OnPolicyNode(old, new *corev1.Node) {
	c.mu.Lock()
	if new != nil {
		c.nodes[new.Name] = new
	} else if old != nil {
		delete(c.nodes, old.Name)
	}
	c.mu.Unlock()
	c.poke()
}

// OnClusterPoliciesSynced implements kube.ClusterPolicyHandler.
func (c *PolicyController) OnClusterPoliciesSynced() {
	c.clusterOnce.Do(func() { close(c.clusterSynced) })
	c.poke()
}

// OnPolicySynced implements kube.PolicyHandler.
func (c *PolicyController) OnPolicySynced() {
	c.once.Do(func() { close(c.synced) })
	c.poke()
}

// SyncSoon asks for a sync now (this agent became the writer of the
// ClusterNetworkPolicies' status: the sync writes what is due).
func (c *PolicyController) SyncSoon() { c.poke() }

func (c *PolicyController) poke() {
	select {
	case c.trigger <- struct{}{}:
	default:
	}
}

// allocationsChanged notes a save of the CNI allocations (or a pending
// attachment's bound) and wakes the loop at once.
func (c *PolicyController) allocationsChanged() {
	c.allocSeen.CompareAndSwap(0, time.Now().UnixNano())
	select {
	case c.allocated <- struct{}{}:
	default:
	}
	c.poke()
}

// Run syncs after the initial state arrived, on every change (at most once
// per MinSyncPeriod) and every Resync, until ctx ends.
func (c *PolicyController) Run(ctx context.Context) {
	for _, synced := range []chan struct{}{c.synced, c.clusterSynced} {
		select {
		case <-ctx.Done():
			return
		case <-synced:
		}
	}
	if c.opts.IPAMDataDir != "" {
		if err := c.watchAllocations(ctx); err != nil {
			// The periodic resync still picks new pods up.
			c.opts.Log.Error("not watching the CNI allocations: new pods may wait for the resync to send", "err", err)
		}
	}
	tick := time.NewTicker(c.opts.Resync)
	defer tick.Stop()
	wait := c.opts.MinSyncPeriod
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.trigger:
		case <-tick.C:
			c.backend.forceFull()  // read the kernel back: repairs drift
			c.pending.settled = "" // and the ready sets
		}
		select {
		case <-c.allocated: // this sync reads the allocations
		default:
		}
		start := time.Now()
		err := c.sync()
		c.metrics.observe(time.Since(start), err)
		allocated := c.allocated
		if err != nil {
			c.opts.Log.Error("network policy sync failed", "node", c.opts.NodeName, "err", err)
			c.poke() // retry, backing off up to 10 s while it keeps failing
			wait = min(2*wait, 10*time.Second)
			allocated = nil
		} else {
			wait = c.opts.MinSyncPeriod
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		case <-allocated: // a new pod is default-deny until the next sync: no coalescing delay
			c.poke()
		}
	}
}

// input is the compiler's input, with this node's attachments (allocs)
// filled in as the addresses of their pods, and the attachments whose pod
// it covers.
func (c *PolicyController) input(allocs []ipam.Allocation) (policy.Input, covered) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := policy.Input{}
	var cov covered
	in.Pods, cov = c.localPods(allocs)
	for _, n := range c.nss {
		in.Namespaces = append(in.Namespaces, n)
	}
	for _, p := range c.pols {
		in.Policies = append(in.Policies, p)
	}
	for _, p := range c.cluster {
		in.ClusterPolicies = append(in.ClusterPolicies, p)
	}
	for _, n := range c.nodes {
		in.Nodes = append(in.Nodes, n)
	}
	return in, cov
}

func (c *PolicyController) sync() error {
	var seen time.Time
	if ns := c.allocSeen.Swap(0); ns != 0 {
		seen = time.Unix(0, ns)
	}
	var allocs []ipam.Allocation
	if c.opts.IPAMDataDir != "" {
		var err error
		if allocs, err = podAllocations(c.opts.IPAMDataDir); err != nil {
			return fmt.Errorf("pod attachments: %w", err)
		}
	}
	in, cov := c.input(allocs)
	d := policy.Compile(in)
	c.logRejected(d.Errors)
	c.reportClusterStatus(in.ClusterPolicies, d.Errors)
	cfg := policyConfig{node: c.opts.NodeName, logDrops: c.opts.LogDrops, bridge: c.opts.Bridge}
	if c.opts.IPAMDataDir != "" {
		cfg.sources = podSources(allocs)
		for _, al := range allocs {
			if slices.ContainsFunc(al.Addresses, netip.Addr.Is6) {
				c.v6.Store(true)
			}
		}
		if !c.v6.Load() && bridgeHasIPv6(c.opts.Bridge) { // ready for the first IPv6 pod
			c.v6.Store(true)
		}
	}
	local := 0
	for _, p := range d.Pods {
		if p.Node == c.opts.NodeName {
			local++
			if slices.ContainsFunc(p.IPs, netip.Addr.Is6) {
				c.v6.Store(true)
			}
		}
	}
	unsettled := c.opts.IPAMDataDir != "" && fingerprint(allocs) != c.pending.settled
	if unsettled && c.backend.readyMade(c.v6.Load()) {
		// A new pod no policy selects needs no chain of its own: it may
		// receive at once (what it sends waits for its source rule).
		if err := c.markReady(unselected(cov, d), c.v6.Load(), seen); err != nil {
			return fmt.Errorf("marking pods no policy selects ready: %w", err)
		}
	}
	res, err := c.backend.apply(d, cfg, c.v6.Load())
	if err != nil {
		return err
	}
	if c.opts.LogDrops {
		c.deny.update(d, podNames(in.Pods))
	}
	if unsettled {
		if err := c.markReady(cov, c.v6.Load(), seen); err != nil {
			return fmt.Errorf("marking programmed pods ready: %w", err)
		}
	}
	c.metrics.isolated.Set(float64(local))
	c.metrics.sets.Set(float64(res.sets))
	c.metrics.rejected.Set(float64(countPolicies(d.Errors)))
	if len(res.changes) > 0 {
		c.opts.Log.Info("network policy applied", append([]any{"node", c.opts.NodeName, "isolatedPods", local}, res.changes...)...)
	}
	return nil
}

// reportClusterStatus writes the status condition of each
// ClusterNetworkPolicy whose generation or problems changed since it was
// last written.
func (c *PolicyController) reportClusterStatus(pols []*cnpv1beta1.ClusterNetworkPolicy, errs []*policy.FieldError) {
	if c.opts.ClusterStatus == nil {
		return
	}
	problems := map[string][]string{}
	for _, e := range errs {
		if e.Kind == policy.ClusterKind {
			problems[e.Policy] = append(problems[e.Policy], e.Field+": "+e.Err.Error())
		}
	}
	seen := map[string]bool{}
	for _, p := range pols {
		seen[p.Name] = true
		key := fmt.Sprint(p.Generation, problems[p.Name])
		if c.reported[p.Name] == key {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		done, err := c.opts.ClusterStatus.Report(ctx, p, problems[p.Name])
		cancel()
		if err != nil {
			c.opts.Log.Warn("writing a clusternetworkpolicy's status", "clusterNetworkPolicy", p.Name, "err", err)
		}
		if done {
			c.reported[p.Name] = key
		}
	}
	for name := range c.reported {
		if !seen[name] {
			delete(c.reported, name)
		}
	}
}

// logRejected logs each rejected policy once per distinct problem.
func (c *PolicyController) logRejected(errs []*policy.FieldError) {
	now := map[string]string{}
	for _, e := range errs {
		now[e.Policy] += e.Field + ": " + e.Err.Error() + "; "
	}
	for _, e := range errs {
		if c.rejected[e.Policy] == now[e.Policy] {
			continue
		}
		if e.Kind == policy.ClusterKind {
			c.opts.Log.Error("clusternetworkpolicy not enforceable as written: the rule fails closed (an Accept matches nothing, a Deny or Pass denies all)",
				"clusterNetworkPolicy", e.Policy, "field", e.Field, "err", e.Err)
			continue
		}
		c.opts.Log.Error("rejected network policy: its pods stay isolated", "policy", e.Policy, "field", e.Field, "err", e.Err)
	}
	c.rejected = now
}

func countPolicies(errs []*policy.FieldError) int {
	seen := map[string]bool{}
	for _, e := range errs {
		seen[e.Policy] = true
	}
	return len(seen)
}

// Cleanup removes what the policy backend installed on the node.
func (c *PolicyController) Cleanup() error { return c.backend.cleanup() }

// podNames indexes pods by address.
func podNames(pods []*corev1.Pod) map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for _, p := range pods {
		for _, ip := range policy.PodIPs(p) {
			out[ip] = p.Namespace + "/" + p.Name
		}
	}
	return out
}
