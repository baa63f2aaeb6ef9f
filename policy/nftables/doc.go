// Package nftables enforces compiled NetworkPolicy rules (policy.Desired)
// on one node with nftables, in two tables of weft's own: inet
// weft-policy (the policy rules, new pods' default deny) and bridge
// weft-policy (the source check). It touches no other table.
//
// # Design note: constant dispatch, groups of interval sets
//
// On this kernel a commit that adds a rule, or a verdict-map element that
// jumps to a chain, makes the kernel validate everything reachable from
// the table's base chains; a plain set element does not, and validation
// is per table (docs/architecture.md has the measurements). So:
//
//   - pods whose direction has the same rules share a group: one chain
//     in-<hash> (out-<hash>) and its sets, named after the rules'
//     structure (the compiler's set IDs, which carry the policy's
//     fingerprint, and the ports). A group's ports set holds every (peer
//     address range . protocol . port range) its rules allow, with the
//     peers and ports cut into disjoint boxes (interval sets hold no
//     overlapping elements; package tierbox); its any set holds the
//     peers of rules without ports. A new connection costs one dispatch
//     lookup and at most four set lookups, whatever the number of
//     policies and ports;
//   - dispatch maps send a pod address to its group (goto): ingress by
//     destination, egress by source, both from the forward hook, egress
//     also from input (pods to their node). Output is not hooked: the
//     node always reaches its pods (kubelet probes);
//   - pods and namespaces coming, going or relabelled under unchanged
//     policies are element writes of the groups' sets; a pod joining a
//     group is a dispatch element (validated with this small table
//     alone); an edited policy is a new group, switched to in the same
//     transaction as its chain and sets are written;
//   - a direction with ClusterNetworkPolicy rules is a chain of its
//     Admin tier, whose Pass goes to the rest (the NetworkPolicy part,
//     or the Baseline tier): each tier's first-match rules are cut into
//     disjoint boxes, one interval set per verdict (tiers.go), so a tier
//     costs a few lookups whatever the number of policies;
//   - the drop chains count (the dropped packets metric) and optionally
//     log, rate-limited; a base chain's accept ends only this table's
//     walk, which is what the iptables backend's RETURN is;
//   - with Config.PodBridges, the pending chain holds a new pod both ways
//     until its address is in the ready set (ready4, ready6: created here,
//     written by the CNI plugin and the agent, see policy/readyset);
//   - with Config.PodPorts, the bridge table's source check: nftables has
//     no physdev match, and in the inet hooks a bridged packet comes from
//     the bridge, so the check sits in the bridge family's prerouting
//     hook, where the frame's input device is the pod's port: one lookup
//     of (port . address) in a set.
//
// Render is pure. The Applier is thin: one transaction per table and
// apply; a partial apply sends what changed since the last one; a full
// apply (the first, after ForceFull, after a failure) lists the table,
// refills every set but the ready sets, rewrites the chains whose rules
// differ (the others keep their counters) and deletes what is not wanted.
package nftables
