// Package nftables is weft's nftables service proxy backend: it renders the
// model (proxy/model) into one table, inet weft, and applies it through
// sigs.k8s.io/knftables in one nft transaction per sync.
//
// # Design note: constant rules, data maps
//
// Adding a rule, or a verdict-map element that jumps to a chain, makes the
// kernel re-validate everything reachable from the table's base chains at
// commit; adding, changing or deleting a plain data-map element does not
// (docs/architecture.md, "nftables backend", has the measurements). So the
// table has a few dozen rules that never depend on the Services, and every
// Service lives in sets and data maps keyed by its frontends:
//
//   - a frontend is an address, protocol and port: a ClusterIP, an
//     externalIP, a LoadBalancer IP, or a node address with a NodePort;
//   - sets say what a frontend is (ClusterIP, external, external with
//     externalTrafficPolicy Local, restricted by loadBalancerSourceRanges,
//     rejecting or dropping for want of endpoints) and the constant rules
//     look the packet's frontend up in them;
//   - the backends of a frontend with n endpoints are n elements of the map
//     lb4-<n> (lb6-<n>), keyed by frontend . slot, and the rule of that map
//     DNATs to "frontend . numgen random mod n" looked up in it. The modulus
//     is a constant of the rule, so there is one map and one rule per
//     endpoint count; counts 1-16 always exist, larger ones come and go with
//     the Services that need them;
//   - externalTrafficPolicy Local frontends have a second list, the
//     cluster-wide endpoints that pods and the node itself use, in the
//     lb-cluster maps;
//   - ClientIP affinity is a dynamic map, client . frontend -> backend,
//     written by the packet path in postrouting (after the DNAT chose) with
//     the Service's timeout, and read before the random choice. When a
//     frontend loses a backend or its affinity, the applier deletes the
//     entries that point to it, in the same transaction.
//
// So a Service added, removed or changed, and an endpoint added, removed or
// changed, are element writes only, all in one transaction: a packet sees
// either the old or the new endpoint list of a frontend, never a mix.
//
// Render (and the incremental Renderer) is pure: the model in, the desired
// chains, sets and elements out, with the element changes since the last
// render. The Applier is thin: a partial sync sends those changes; a full
// sync (the first, a periodic resync, and any sync after a failed one)
// rewrites the chains and the elements of every set, keeping the affinity
// entries, and deletes what the table has that is no longer wanted.
// Nothing outside the table is ever touched.
//
// Chains, rules and set declarations go through knftables (nft); the
// elements of the plain sets and maps go to the kernel as one nfnetlink
// batch (netlink.go), because nft's user space, not the kernel, was the
// cost of both a change and a large load. A sync that only writes elements
// is that one batch; one that also adds or deletes objects commits them
// before and after it, so that each commit leaves a consistent table.
package nftables
