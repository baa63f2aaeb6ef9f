package topology

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// What the exporter owns on a Node. It writes these keys and no others.
const (
	// PodIPsResource is the node's pod address capacity.
	PodIPsResource corev1.ResourceName = "weft.dev/pod-ips"
	// BandwidthResource is the node's uplink bandwidth in Mbit/s.
	BandwidthResource corev1.ResourceName = "weft.dev/bandwidth"
	// ExhaustedTaint is on the node while it has no free pod address.
	ExhaustedTaint = "weft.dev/pod-ips-exhausted"

	// RoutingLabel is the routing mode between nodes (hostgw, vxlan).
	RoutingLabel = "weft.dev/routing"
	// RackLabel and ToRLabel place the node in the physical network, when
	// the operator says (weft-agent --rack, --tor).
	RackLabel = "weft.dev/rack"
	ToRLabel  = "weft.dev/tor"
	// MTUAnnotation is the pods' MTU on the node.
	MTUAnnotation = "weft.dev/mtu"
	// VTEPAnnotation is the node's VXLAN tunnel endpoint address.
	VTEPAnnotation = "weft.dev/vtep-address"
)

var (
	ownedResources   = []corev1.ResourceName{PodIPsResource, BandwidthResource}
	ownedLabels      = []string{RoutingLabel, RackLabel, ToRLabel}
	ownedAnnotations = []string{MTUAnnotation, VTEPAnnotation}
)

// Facts are the node's network facts the exporter publishes as they are.
type Facts struct {
	Routing string     // routing mode
	MTU     int        // pods' MTU; 0: not known yet
	VTEP    netip.Addr // VXLAN only
	Rack    string     // optional
	ToR     string     // optional
}

// Input is what the exporter knows about its node.
type Input struct {
	PodCIDRs    []netip.Prefix
	PodIPsInUse int64
	// BandwidthMbit is the uplink's rate; 0: not published.
	BandwidthMbit int64
	Facts         Facts
}

// Desired is what the node should carry under the exporter's keys.
type Desired struct {
	Resources   corev1.ResourceList // capacity and allocatable alike
	Exhausted   bool
	Labels      map[string]string
	Annotations map[string]string
	// UsablePodIPs is the podCIDRs' capacity (0: no podCIDR yet).
	UsablePodIPs int64
}

// Compute turns the input into the node's desired state. Without a
// podCIDR the node publishes no pod addresses and is not tainted (the
// agent waits for one before the CNI works at all).
func Compute(in Input) (Desired, error) {
	d := Desired{Resources: corev1.ResourceList{}, Labels: map[string]string{}, Annotations: map[string]string{}}
	if len(in.PodCIDRs) > 0 {
		usable, err := UsablePodIPs(in.PodCIDRs)
		if err != nil {
			return Desired{}, err
		}
		d.UsablePodIPs = usable
		d.Resources[PodIPsResource] = *resource.NewQuantity(usable, resource.DecimalSI)
		d.Exhausted = in.PodIPsInUse >= usable
	}
	if in.BandwidthMbit > 0 {
		d.Resources[BandwidthResource] = *resource.NewQuantity(in.BandwidthMbit, resource.DecimalSI)
	}
	f := in.Facts
	for k, v := range map[string]string{RoutingLabel: f.Routing, RackLabel: f.Rack, ToRLabel: f.ToR} {
		if v != "" {
			d.Labels[k] = v
		}
	}
	if f.MTU > 0 {
		d.Annotations[MTUAnnotation] = strconv.Itoa(f.MTU)
	}
	if f.VTEP.IsValid() {
		d.Annotations[VTEPAnnotation] = f.VTEP.String()
	}
	return d, nil
}

// StatusPatch is the merge patch of the Node's status that sets the
// desired weft.dev resources in capacity and allocatable and removes the
// ones no longer published, touching no other key (the kubelet owns the
// rest); nil when the node already matches.
func StatusPatch(node *corev1.Node, d Desired) []byte {
	patch := map[string]map[string]any{}
	for field, have := range map[string]corev1.ResourceList{"capacity": node.Status.Capacity, "allocatable": node.Status.Allocatable} {
		changes := map[string]any{}
		for _, name := range ownedResources {
			want, wanted := d.Resources[name]
			cur, present := have[name]
			switch {
			case wanted && (!present || cur.Cmp(want) != 0):
				changes[string(name)] = want.String()
			case !wanted && present:
				changes[string(name)] = nil
			}
		}
		if len(changes) > 0 {
			patch[field] = changes
		}
	}
	if len(patch) == 0 {
		return nil
	}
	return mustJSON(map[string]any{"status": patch})
}

// MetadataPatch is the merge patch that sets the exporter's labels and
// annotations and removes those it no longer publishes; nil when the node
// already matches.
func MetadataPatch(node *corev1.Node, d Desired) []byte {
	meta := map[string]map[string]any{}
	for _, f := range []struct {
		field string
		owned []string
		want  map[string]string
		have  map[string]string
	}{{"labels", ownedLabels, d.Labels, node.Labels}, {"annotations", ownedAnnotations, d.Annotations, node.Annotations}} {
		changes := map[string]any{}
		for _, k := range f.owned {
			want, wanted := f.want[k]
			cur, present := f.have[k]
			switch {
			case wanted && (!present || cur != want):
				changes[k] = want
			case !wanted && present:
				changes[k] = nil
			}
		}
		if len(changes) > 0 {
			meta[f.field] = changes
		}
	}
	if len(meta) == 0 {
		return nil
	}
	return mustJSON(map[string]any{"metadata": meta})
}

// TaintPatch is the merge patch of spec.taints that adds or removes the
// exhaustion taint and keeps every other taint as the node has it; nil
// when the node already matches. A list is replaced whole by a merge
// patch, so the patch carries the node's resourceVersion: if anyone
// changed the node since it was read, the API server refuses the patch
// (a conflict) instead of losing their taint, and the caller retries on a
// fresh read.
func TaintPatch(node *corev1.Node, exhausted bool) []byte {
	has := slices.ContainsFunc(node.Spec.Taints, isExhaustedTaint)
	if has == exhausted {
		return nil
	}
	taints := slices.DeleteFunc(slices.Clone(node.Spec.Taints), isExhaustedTaint)
	if exhausted {
		taints = append(taints, corev1.Taint{Key: ExhaustedTaint, Effect: corev1.TaintEffectNoSchedule})
	}
	if taints == nil {
		taints = []corev1.Taint{}
	}
	return mustJSON(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": taints},
	})
}

func isExhaustedTaint(t corev1.Taint) bool { return t.Key == ExhaustedTaint }

// Tainted reports whether the node carries the exhaustion taint.
func Tainted(node *corev1.Node) bool { return slices.ContainsFunc(node.Spec.Taints, isExhaustedTaint) }

// MaxPodsWarning says why the kubelet's pod limit (the node's pods
// capacity) exceeds what its podCIDRs can address; "" when it does not.
func MaxPodsWarning(node *corev1.Node, usable int64) string {
	maxPods, ok := node.Status.Capacity[corev1.ResourcePods]
	if !ok || usable <= 0 || maxPods.Value() <= usable {
		return ""
	}
	return fmt.Sprintf("the kubelet accepts %d pods (maxPods) but the node's podCIDRs %v hold %d pod addresses: pods beyond that cannot start here; weft taints the node %s:NoSchedule while it has no free address",
		maxPods.Value(), podCIDRs(node), usable, ExhaustedTaint)
}

func podCIDRs(node *corev1.Node) []string {
	if len(node.Spec.PodCIDRs) > 0 {
		return node.Spec.PodCIDRs
	}
	if node.Spec.PodCIDR != "" {
		return []string{node.Spec.PodCIDR}
	}
	return nil
}

// mustJSON encodes plain maps of strings, lists and quantities, which
// cannot fail.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encoding a node patch: %v", err))
	}
	return b
}
