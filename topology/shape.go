package topology

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/ipam"
)

// PodBandwidth is the pod's weft.dev/bandwidth request in Mbit/s, as the
// scheduler counts it: the containers' requests (a limit stands for an
// unset request) summed, or the largest init container's if larger. 0:
// none. A request that is not a positive whole number is an error naming
// the container; the API server refuses those for extended resources, so
// only an object that bypassed validation carries one.
func PodBandwidth(p *corev1.Pod) (int64, error) {
	one := func(c corev1.Container, kind string) (int64, error) {
		q, ok := c.Resources.Requests[BandwidthResource]
		if !ok {
			q, ok = c.Resources.Limits[BandwidthResource]
		}
		if !ok {
			return 0, nil
		}
		v, exact := q.AsInt64()
		if !exact || v <= 0 {
			return 0, fmt.Errorf("%s %q: resources %s: %s is not a positive whole number of Mbit/s", kind, c.Name, BandwidthResource, q.String())
		}
		return v, nil
	}
	var sum, initMax int64
	for _, c := range p.Spec.Containers {
		v, err := one(c, "container")
		if err != nil {
			return 0, err
		}
		sum += v
	}
	for _, c := range p.Spec.InitContainers {
		v, err := one(c, "init container")
		if err != nil {
			return 0, err
		}
		initMax = max(initMax, v)
	}
	return max(sum, initMax), nil
}

// Shape is the traffic shaping of one pod attachment: both directions
// limited to RateBytes per second by a token bucket. Traffic to the pod
// is shaped by a TBF qdisc at the root of the host-side veth; traffic
// from the pod enters the host at the veth's ingress, where a filter
// redirects it to the IFB device, whose root TBF shapes it before the
// IFB hands it back to the stack as if received on the veth.
type Shape struct {
	Pod       string // namespace/name, for logs
	HostVeth  string
	IFB       string
	RateBytes uint64 // bytes per second
	Burst     uint32 // bucket size in bytes
	Limit     uint32 // queue length in bytes
}

// IFBPrefix starts the name of every IFB device weft makes; its
// suffix is the host veth's, so the pair is found from either.
const IFBPrefix = "wftb"

// IFBName is the IFB device shaping the traffic from a host veth.
func IFBName(hostVeth string) string { return IFBPrefix + hostVeth[len(cni.HostVethPrefix):] }

const (
	minBurst     = 32 << 10 // a few full-size packets: a smaller bucket cannot pass a GSO packet whole
	burstWindow  = 100      // the bucket holds 1/100 s of traffic at the rate, 10 ms
	queueLatency = 50       // the queue holds 50 ms of traffic at the rate, beyond the bucket
)

// NewShape shapes a host veth to mbit Mbit/s.
func NewShape(pod, hostVeth string, mbit int64) Shape {
	rate := uint64(mbit) * 1_000_000 / 8
	burst := max(rate/burstWindow, minBurst)
	limit := burst + rate*queueLatency/1000
	return Shape{Pod: pod, HostVeth: hostVeth, IFB: IFBName(hostVeth), RateBytes: rate,
		Burst: uint32(min(burst, 1<<30)), Limit: uint32(min(limit, 1<<30))}
}

// PodError is a pod whose request is ignored, with the reason.
type PodError struct {
	Pod string // namespace/name
	Err error
}

func (e PodError) Error() string { return fmt.Sprintf("pod %s: %v", e.Pod, e.Err) }

// Shapes are the shapes of the node's attachments whose pods request
// bandwidth, sorted by host veth. An attachment belongs to the pod its
// PodRef names (same UID, or none recorded). A malformed request is
// reported and its pod left unshaped.
func Shapes(pods []*corev1.Pod, allocs []ipam.Allocation) ([]Shape, []PodError) {
	type want struct {
		uid  string
		mbit int64
	}
	byKey := map[string]want{}
	var errs []PodError
	for _, p := range pods {
		if !needsAddress(p) {
			continue
		}
		key := p.Namespace + "/" + p.Name
		mbit, err := PodBandwidth(p)
		if err != nil {
			errs = append(errs, PodError{Pod: key, Err: err})
			continue
		}
		if mbit > 0 {
			byKey[key] = want{uid: string(p.UID), mbit: mbit}
		}
	}
	var out []Shape
	for _, al := range allocs {
		if al.Pod == nil {
			continue
		}
		key := al.Pod.Namespace + "/" + al.Pod.Name
		w, ok := byKey[key]
		if !ok || (al.Pod.UID != "" && al.Pod.UID != w.uid) {
			continue
		}
		out = append(out, NewShape(key, cni.HostVethName(al.ContainerID, al.IfName), w.mbit))
	}
	slices.SortFunc(out, func(a, b Shape) int { return strings.Compare(a.HostVeth, b.HostVeth) })
	return out, errs
}
