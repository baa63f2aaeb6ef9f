// Package topology computes what weft-agent's topology exporter publishes
// about its node and enforces on its pods. It is pure: the agent gives it
// the Node, the pods bound to the node and the CNI plugin's allocations,
// and gets back plain data (the extended resources, the taint, the labels
// and annotations, the patches that would bring the Node there, and the
// traffic shapes of the pods that request bandwidth). The agent applies
// them (agent/topology.go, agent/shaping.go).
//
// # Semantics
//
// weft.dev/pod-ips: capacity and allocatable are both the number of pod
// addresses the node's podCIDRs can hold (one per pod from every family;
// the smallest family decides), not the number free right now. Pods do not
// normally request weft.dev/pod-ips, so the stock scheduler's resource fit
// cannot count them; what keeps pods away from a full node is the taint
// weft.dev/pod-ips-exhausted:NoSchedule, present exactly while every
// address is held or claimed: by an allocation in the IPAM state, or by a
// pod bound to the node that still waits for one (so the taint follows the
// scheduler's bindings, not only the CNI). A cluster that adds a request of
// weft.dev/pod-ips: 1 to its pods gets the exact count from the scheduler
// as well, which is why allocatable is not the free count: the scheduler
// subtracts the requests of the pods already on the node itself.
//
// weft.dev/bandwidth: Mbit/s of the node's uplink (its reported speed or a
// flag); a pod requesting weft.dev/bandwidth: N is scheduled against it and
// shaped to N Mbit/s in each direction on its host-side veth.
package topology
