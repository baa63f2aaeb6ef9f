package topology

import (
	"fmt"
	"math"
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/ipam"
)

// UsablePodIPs is how many pods the podCIDRs can address: one address
// from every CIDR per pod, each CIDR configured as the agent configures
// the CNI plugin (the whole subnet; the network address, the gateway and
// the IPv4 broadcast address are never handed out). The smallest CIDR
// decides; a count beyond int64 (IPv6) is math.MaxInt64.
func UsablePodIPs(podCIDRs []netip.Prefix) (int64, error) {
	sets := make([]ipam.RangeSet, len(podCIDRs))
	for i, c := range podCIDRs {
		sets[i] = ipam.RangeSet{{Subnet: c}}
	}
	pool, err := ipam.NewPool(sets)
	if err != nil {
		return 0, fmt.Errorf("podCIDRs %v: %w", podCIDRs, err)
	}
	usable := uint64(math.MaxUint64)
	for _, n := range pool.Free(ipam.NewState()) {
		usable = min(usable, n)
	}
	return int64(min(usable, math.MaxInt64)), nil
}

// PodIPsInUse counts the addresses held or claimed on the node: every
// allocation of the IPAM state, plus every pod bound to the node that
// needs an address and holds none yet (not host-network, not finished,
// not being deleted). An allocation naming a pod (PodRef) covers that pod
// when the names match and the UIDs do, or the reference carries none.
func PodIPsInUse(allocs []ipam.Allocation, pods []*corev1.Pod) int64 {
	held := map[string][]string{} // namespace/name -> UIDs of its allocations ("" unknown)
	for _, al := range allocs {
		if al.Pod != nil {
			key := al.Pod.Namespace + "/" + al.Pod.Name
			held[key] = append(held[key], al.Pod.UID)
		}
	}
	n := int64(len(allocs))
	for _, p := range pods {
		if !needsAddress(p) {
			continue
		}
		covered := false
		for _, uid := range held[p.Namespace+"/"+p.Name] {
			if uid == "" || uid == string(p.UID) {
				covered = true
			}
		}
		if !covered {
			n++
		}
	}
	return n
}

// needsAddress reports whether a pod bound to the node will get an
// address from the CNI plugin.
func needsAddress(p *corev1.Pod) bool {
	return !p.Spec.HostNetwork && p.DeletionTimestamp == nil &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}
