package cni

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/weftnet/weft/ipam"
	"github.com/weftnet/weft/policy/readyset"
)

// podRef reads the pod's identity from CNI_ARGS ("K8S_POD_NAMESPACE=x;
// K8S_POD_NAME=y;K8S_POD_UID=z;..."), as Kubernetes runtimes pass it; nil
// when the runtime did not name a pod. It is recorded with the allocation
// so that the node agent can program the pod's NetworkPolicy without
// waiting for the API server to report its address.
func podRef(cniArgs string) *ipam.PodRef {
	var ref ipam.PodRef
	for _, kv := range strings.Split(cniArgs, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			ref.Namespace = v
		case "K8S_POD_NAME":
			ref.Name = v
		case "K8S_POD_UID":
			ref.UID = v
		}
	}
	if ref.Namespace == "" || ref.Name == "" {
		return nil
	}
	return &ref
}

// revokeReady takes the addresses this ADD hands out anew (not held by the
// key before) out of the NetworkPolicy ready sets: an address freed by
// another pod may still be marked programmed for that pod's policies. It
// runs under the IPAM lock, which the agent also holds while it marks
// addresses ready, so the two never cross; r is opened before the lock.
func revokeReady(r *readyset.Revoker, old, leases []ipam.Lease) error {
	var fresh []netip.Addr
	for _, l := range leases {
		if !slices.ContainsFunc(old, func(o ipam.Lease) bool { return o.Address.Addr() == l.Address.Addr() }) {
			fresh = append(fresh, l.Address.Addr())
		}
	}
	return r.Revoke(fresh)
}
