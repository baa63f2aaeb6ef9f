// Package routing programs the routes that carry pod traffic between nodes,
// in Flannel's two production modes, host-gw and VXLAN, and Calico's IPIP.
//
// # Compute, then apply
//
// Compute is pure: from the node's Config and the cluster's nodes it returns
// a Desired (plain, sorted data) and a NodeError for every node, or family
// of a node, it had to leave out. A Reconciler applies a Desired to the
// network namespace of the calling thread.
//
// Each address family is handled on its own: a node's IPv4 podCIDR is
// routed even if its IPv6 podCIDR is bad, and the other way round. A node
// is left out (and reported, naming the node and the field) when it has no
// podCIDR, lacks a usable InternalIP of the family it must be reached by,
// has a podCIDR overlapping self's or an earlier node's, shares an
// InternalIP or VTEP MAC with an earlier node, or, for VXLAN, has not
// published its VTEP MAC. "Earlier" is by name, so the result does not
// depend on the order of the nodes.
//
// # host-gw
//
// For each other node and family: `<podCIDR> via <InternalIP>`, the kernel
// choosing the link. The nodes must share an L2 segment.
//
// # VXLAN addressing
//
// Every node has one VXLAN device (DefaultDevice, VNI 1, UDP port 8472,
// learning off, local = the node's InternalIP of the underlay family) whose
// MAC is the node's VTEP MAC, by default VTEPMAC(node name): stable across
// restarts without any state. The device carries the network address of
// each of the node's podCIDRs as a host address (10.244.1.0/32,
// fd00:10:244:1::/128), which the kernel then picks as the source of the
// node's own traffic to remote pods. For every remote node R:
//
//	route     <R podCIDR> via <R podCIDR network address> dev weft.vxlan onlink
//	neighbour <R podCIDR network address> lladdr <R VTEP MAC>    (permanent)
//	fdb       <R VTEP MAC> dst <R InternalIP>                    (permanent)
//
// so no ARP, NDP, flooding or learning ever crosses the underlay. One device
// carries both inner families over one underlay family: IPv4 when the node
// has an IPv4 InternalIP, unless VXLANConfig.IPv6Underlay says otherwise (the
// kernel's VXLAN FDB holds remotes of the device's own family only). The
// device MTU is the underlay MTU minus 50 (IPv4 underlay) or 70 (IPv6); when
// neither MTU is configured Apply reads the MTU of the link that holds the
// local address.
//
// # IPIP
//
// One IPIP device (DefaultIPIPDevice, local the node's IPv4 InternalIP, any
// remote), carrying the IPv4 podCIDR's network address as a /32. Each
// remote IPv4 podCIDR is routed `via <R InternalIP> dev weft.ipip onlink`:
// the gateway is the tunnel's remote. With IPIPConfig.CrossSubnet, a node
// inside IPIPConfig.Subnet gets a host-gw route instead. IPv6 podCIDRs get
// host-gw routes. The device MTU is the underlay's minus OverheadIPIP.
//
// # Ownership
//
// weft owns exactly:
//   - routes in the main table with route protocol RouteProtocol (0x57, see
//     `ip route show proto 0x57`), or the one given by WithRouteProtocol;
//   - VXLAN and IPIP devices with the interface alias DeviceAlias
//     ("weft-routing"); a device of that type with the configured name is
//     adopted and marked;
//   - every permanent neighbour and FDB entry on those devices.
//
// Nothing else is listed for deletion: another protocol's routes, other
// devices, and other devices' neighbour and FDB entries are never touched.
// A wanted route whose destination is held by another owner's route is
// reported, not taken over.
//
// # What Apply guarantees
//
//   - Convergence: after a successful Apply the owned state is exactly the
//     Desired; drift (a route, neighbour or FDB entry deleted by hand, a
//     changed MTU or MAC, learning turned on, the device down) is repaired.
//   - No disturbance: entries that already match are not rewritten, so
//     re-applying the same Desired sends no change to the kernel; a changed
//     route is replaced in place (NLM_F_REPLACE), never deleted and re-added
//     (IPv6 refuses to move a route onto the VXLAN device while its onlink
//     gateway still resolves through the old route, so for that replace a
//     /128 route pins the gateway to the device and is removed right after).
//     The device is recreated only if its VNI, port or local address differ,
//     and replaced when its name changes (the kernel does not allow two
//     devices with one VNI, port and local address at once).
//   - Statelessness: the kernel is the only state, so a new Reconciler (an
//     agent restart) continues seamlessly.
//   - Mode switches: in host-gw mode weft's VXLAN devices are deleted after
//     the host-gw routes replaced theirs, so no device, neighbour or FDB
//     entry is left; host-gw to vxlan sets up the device, its neighbours and
//     FDB entries first, then replaces each route.
//   - Partial failure: a bad entry does not stop the others; Apply returns
//     all failures joined, each naming its object. A zero Desired (no Mode),
//     what Compute returns for a bad Config, is refused untouched.
//
// Cleanup removes everything weft owns.
package routing
