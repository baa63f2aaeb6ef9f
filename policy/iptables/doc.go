// Package iptables enforces compiled NetworkPolicy rules (policy.Desired)
// on one node with iptables and ipset.
//
// Design note. Render is pure: it keeps the pods scheduled on this node and
// turns them into
//
//   - ipsets, per direction of a pod (shared by the pods whose rules have
//     the same structure): one hash:net,port set of every (peer, port) its
//     rules allow, so that a new connection costs one set lookup however
//     many policies and ports select the pod; what that set cannot hold
//     (every port of a protocol, ranges wider than 32 ports, rules without
//     ports) gets one hash:net set and one rule per distinct port match.
//     Peers are pods (host prefixes) and ipBlocks minus their exceptions,
//     written as prefixes and nomatch prefixes that the kernel judges most
//     specific first (exact for any union: setEntries);
//   - filter chains: WEFT-POL-FORWARD (jumped to first from FORWARD) returns
//     at once for ESTABLISHED/RELATED packets (replies always pass), then
//     dispatches by source address to each egress-isolated pod's chain
//     (WEFT-POL-EGRESS -> WEFT-POL-E-<hash>) and by destination address to
//     each ingress-isolated pod's chain (WEFT-POL-INGRESS -> WEFT-POL-I-<hash>).
//     WEFT-POL-INPUT (first in INPUT) applies the egress chains to what local
//     pods send to the node itself. OUTPUT is not hooked: the node always
//     reaches its pods (kubelet probes). A pod chain RETURNs for each allowed
//     (peer set, port) pair and otherwise jumps to WEFT-POL-DROP-IN or
//     WEFT-POL-DROP-OUT, whose DROP rule counts the drops (metrics) and which
//     optionally log, rate-limited. Policy chains never ACCEPT, so what
//     follows in FORWARD (the agent's and the proxy's rules) still applies to
//     allowed packets;
//   - with Config.PodPorts, WEFT-POL-SOURCE (sources.go) holds what a pod
//     sends to its own address; with Config.PodBridges, WEFT-POL-PENDING
//     (pending.go) holds a new pod, both ways, until the agent has put its
//     address in the ready set (a set the backend creates but another
//     writer fills: Ruleset.External).
//
// Same-node pod traffic is bridged on weft0; the kernel shows it to iptables
// only with net.bridge.bridge-nf-call-iptables=1, which Apply ensures.
//
// Apply is the thin kernel layer, ordered so that no moment opens a hole:
// (1) one `ipset restore` creates the new sets and refreshes changed ones by
// filling a temporary set and swapping it in (atomic per set); (2) one
// `iptables-restore --noflush` transaction rewrites the changed WEFT-POL
// chains, the dispatch chains, and deletes chains no longer wanted, then the
// jumps are made sure to be first in FORWARD and INPUT (moved in one
// transaction); (3) sets no longer referenced are destroyed. Set names are
// derived from the structure of a pod's rules (the compiler's set IDs,
// which carry a fingerprint of the policy's spec, and the ports): a
// changed policy gets fresh sets that its new rules switch to atomically,
// while membership changes of an unchanged policy (pods or namespaces
// relabelled, pods added or removed) swap the set's content in place.
// An incremental apply trusts its record of the chains it wrote and reads
// back only rule 1 of FORWARD and INPUT; ForceFull makes the next apply read
// the whole table and rewrite every chain that differs from the wanted one
// (the agent's periodic resync). Chains the kernel holds as wanted are not
// rewritten, so their counters (the dropped packets metric) survive.
//
// A ruleset and an Applier are per family (Config.Family, Applier.Family):
// IPv6 uses ip6tables, its own set names (WEFT-POL6-*: ipset names are
// shared by both families) and lets neighbour discovery through, which
// policies do not cover (IPv4's ARP never meets iptables).
package iptables
