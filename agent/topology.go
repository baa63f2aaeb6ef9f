package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/weftnet/weft/routing"
	"github.com/weftnet/weft/topology"
)

// TopologyOptions configure the topology exporter.
type TopologyOptions struct {
	NodeName    string
	Routing     routing.Mode
	MTU         int // 0: derived as the agent derives it
	Encryption  string
	IPAMDataDir string
	// BandwidthMbit is the node's bandwidth; 0: the uplink's reported
	// speed, and none published if it reports none.
	BandwidthMbit int64
	Rack, ToR     string
	Resync        time.Duration // full sync period (default 30 s)
	// MinWriteInterval spaces the exporter's API writes (default 250 ms):
	// changes within it are coalesced into the next write.
	MinWriteInterval time.Duration
	Log              *slog.Logger
}

// coalesceWindow gathers the changes of one burst (a pod start saves the
// IPAM state, then the kubelet updates the pod) into one sync.
const coalesceWindow = 20 * time.Millisecond

// TopologyExporter publishes the node's network capacity and facts on its
// Node (extended resources, the exhaustion taint, labels, annotations, a
// warning event) and shapes the pods that request bandwidth. It syncs
// when the IPAM state is saved, when its Node or a pod bound to it
// changes, and every Resync; it writes only what differs from the Node.
type TopologyExporter struct {
	opts    TopologyOptions
	client  kubernetes.Interface
	node    listers.NodeLister
	pods    listers.PodLister
	trigger chan struct{}
	shaper  *shaper
	writes  atomic.Int64

	bandwidth     int64 // resolved on the first sync with an InternalIP
	bandwidthDone bool
	warned        string            // last maxPods warning sent
	podErrs       map[string]string // pod key -> last reported request error
	tainted       bool
}

// NewTopologyExporter returns an exporter using client.
func NewTopologyExporter(client kubernetes.Interface, o TopologyOptions) *TopologyExporter {
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	if o.MinWriteInterval == 0 {
		o.MinWriteInterval = 250 * time.Millisecond
	}
	return &TopologyExporter{opts: o, client: client, trigger: make(chan struct{}, 1), shaper: newShaper(), podErrs: map[string]string{}}
}

// Writes is the number of API writes the exporter made.
func (e *TopologyExporter) Writes() int64 { return e.writes.Load() }

func (e *TopologyExporter) poke() {
	select {
	case e.trigger <- struct{}{}:
	default:
	}
}

// Run syncs until ctx ends.
func (e *TopologyExporter) Run(ctx context.Context) error {
	own := func(field, value string) informers.SharedInformerOption {
		return informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector(field, value).String()
		})
	}
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(e.client, 0, own("metadata.name", e.opts.NodeName))
	podFactory := informers.NewSharedInformerFactoryWithOptions(e.client, 0, own("spec.nodeName", e.opts.NodeName))
	nodes, pods := nodeFactory.Core().V1().Nodes(), podFactory.Core().V1().Pods()
	e.node, e.pods = nodes.Lister(), pods.Lister()
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { e.poke() }, UpdateFunc: func(_, _ any) { e.poke() }, DeleteFunc: func(any) { e.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{nodes.Informer(), pods.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	if err := watchAllocationSaves(ctx, e.opts.IPAMDataDir, e.poke); err != nil {
		return err
	}
	nodeFactory.Start(ctx.Done())
	podFactory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced, pods.Informer().HasSynced) {
		return ctx.Err()
	}
	tick := time.NewTicker(e.opts.Resync)
	defer tick.Stop()
	var lastWrite time.Time
	var retry <-chan time.Time
	full := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			full = true
		case <-retry:
		case <-e.trigger:
			// Gather the rest of the burst, and keep the writes apart.
			wait := max(coalesceWindow, time.Until(lastWrite.Add(e.opts.MinWriteInterval)))
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
			select {
			case <-e.trigger:
			default:
			}
		}
		before := e.writes.Load()
		pending, err := e.sync(ctx, full)
		if e.writes.Load() != before {
			lastWrite = time.Now()
		}
		retry = nil
		if err != nil || pending {
			if err != nil {
				e.opts.Log.Error("topology sync failed", "node", e.opts.NodeName, "err", err)
			}
			retry = time.After(time.Second)
			continue
		}
		full = false
	}
}

// sync publishes and shapes once. pending is true when a pod's veth to
// shape did not exist yet.
func (e *TopologyExporter) sync(ctx context.Context, full bool) (pending bool, err error) {
	node, err := e.node.Get(e.opts.NodeName)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("own node %s: %w", e.opts.NodeName, err)
	}
	me, _ := RoutingNode(node) // the agent's loop logs bad fields
	allocs, err := podAllocations(e.opts.IPAMDataDir)
	if err != nil {
		return false, err
	}
	pods, err := e.pods.List(labels.Everything())
	if err != nil {
		return false, err
	}
	facts := topology.Facts{Routing: string(e.opts.Routing), Rack: e.opts.Rack, ToR: e.opts.ToR}
	if mtu, err := podMTU(e.opts.MTU, e.opts.Routing, e.opts.Encryption, me); err == nil {
		facts.MTU = mtu
	}
	if ip, ok := underlayAddr(me); ok && e.opts.Routing == routing.ModeVXLAN {
		facts.VTEP = ip
	}
	e.resolveBandwidth(me)
	inUse := topology.PodIPsInUse(allocs, pods)
	d, err := topology.Compute(topology.Input{PodCIDRs: me.PodCIDRs, PodIPsInUse: inUse, BandwidthMbit: e.bandwidth, Facts: facts})
	if err != nil {
		return false, fmt.Errorf("node %s: spec.podCIDRs: %w", e.opts.NodeName, err)
	}
	if err := e.publish(ctx, node, d, inUse); err != nil {
		return false, err
	}
	shapes, perrs := topology.Shapes(pods, allocs)
	e.reportPodErrors(perrs)
	missing, err := e.shaper.apply(shapes, full)
	if err != nil {
		return false, err
	}
	return missing > 0, nil
}

// publish writes the differences between the node and d.
func (e *TopologyExporter) publish(ctx context.Context, node *corev1.Node, d topology.Desired, inUse int64) error {
	nodes := e.client.CoreV1().Nodes()
	if p := topology.MetadataPatch(node, d); p != nil {
		e.writes.Add(1)
		if _, err := nodes.Patch(ctx, node.Name, types.MergePatchType, p, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("publishing the topology labels of node %s: %w", node.Name, err)
		}
	}
	if p := topology.StatusPatch(node, d); p != nil {
		e.writes.Add(1)
		if _, err := nodes.Patch(ctx, node.Name, types.MergePatchType, p, metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("publishing the extended resources of node %s: %w", node.Name, err)
		}
		e.opts.Log.Info("published node resources", "node", node.Name, "resources", d.Resources)
	}
	if err := e.setTaint(ctx, node, d.Exhausted); err != nil {
		return err
	}
	if d.Exhausted != e.tainted {
		e.tainted = d.Exhausted
		msg := "node has a free pod address again: taint removed"
		if d.Exhausted {
			msg = "node has no free pod address: tainted"
		}
		e.opts.Log.Info(msg, "node", node.Name, "taint", topology.ExhaustedTaint, "inUse", inUse, "usable", d.UsablePodIPs)
	}
	if w := topology.MaxPodsWarning(node, d.UsablePodIPs); w != "" && w != e.warned {
		if err := e.warn(ctx, node, w); err != nil {
			return err
		}
		e.warned = w
	}
	return nil
}

// setTaint adds or removes the exhaustion taint, retrying on a fresh read
// when the node changed under the patch.
func (e *TopologyExporter) setTaint(ctx context.Context, node *corev1.Node, exhausted bool) error {
	for attempt := 0; ; attempt++ {
		p := topology.TaintPatch(node, exhausted)
		if p == nil {
			return nil
		}
		e.writes.Add(1)
		_, err := e.client.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, p, metav1.PatchOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == 4 {
			return fmt.Errorf("setting the taint %s on node %s: %w", topology.ExhaustedTaint, node.Name, err)
		}
		if node, err = e.client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("reading node %s: %w", node.Name, err)
		}
	}
}

// warn records a Warning event on the node.
func (e *TopologyExporter) warn(ctx context.Context, node *corev1.Node, msg string) error {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: node.Name + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node.Name, UID: node.UID, APIVersion: "v1"},
		Reason:         "PodCIDRSmallerThanMaxPods", Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "weft-agent", Host: node.Name},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	e.writes.Add(1)
	if _, err := e.client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("recording the maxPods warning on node %s: %w", node.Name, err)
	}
	e.opts.Log.Warn("maxPods exceeds the podCIDR", "node", node.Name, "detail", msg)
	return nil
}

// resolveBandwidth settles, once, where the node's bandwidth comes from,
// and says so in the log.
func (e *TopologyExporter) resolveBandwidth(me routing.Node) {
	if e.bandwidthDone {
		return
	}
	if e.opts.BandwidthMbit > 0 {
		e.bandwidth, e.bandwidthDone = e.opts.BandwidthMbit, true
		e.opts.Log.Info("node bandwidth from --node-bandwidth", "node", me.Name, "mbit", e.bandwidth)
		return
	}
	ip, ok := underlayAddr(me)
	if !ok {
		return // no InternalIP yet: no uplink to ask
	}
	e.bandwidthDone = true
	link, err := linkWithAddr(ip)
	if err != nil {
		e.opts.Log.Warn("node bandwidth not published: no uplink found and no --node-bandwidth", "node", me.Name, "err", err)
		return
	}
	speed, err := linkSpeedMbit(link.Attrs().Name)
	if err != nil || speed == 0 {
		e.opts.Log.Warn("node bandwidth not published: the uplink reports no speed and no --node-bandwidth is set",
			"node", me.Name, "uplink", link.Attrs().Name, "err", err)
		return
	}
	e.bandwidth = speed
	e.opts.Log.Info("node bandwidth from the uplink's speed", "node", me.Name, "uplink", link.Attrs().Name, "mbit", speed)
}

// reportPodErrors logs each malformed bandwidth request once (until it
// changes); its pod is not shaped.
func (e *TopologyExporter) reportPodErrors(errs []topology.PodError) {
	seen := map[string]bool{}
	for _, pe := range errs {
		seen[pe.Pod] = true
		if e.podErrs[pe.Pod] != pe.Err.Error() {
			e.podErrs[pe.Pod] = pe.Err.Error()
			e.opts.Log.Warn("ignoring the pod's bandwidth request", "pod", pe.Pod, "err", pe.Err)
		}
	}
	for k := range e.podErrs {
		if !seen[k] {
			delete(e.podErrs, k)
		}
	}
}
