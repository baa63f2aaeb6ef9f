// Package bgp distributes pod routes with BGP (weft-agent --routing bgp):
// an embedded gobgp speaker per node, no gRPC listener.
//
// # Compute, then apply
//
// Parse validates the ConfigMap (see Config); Compute turns the node's
// Input (the Nodes, the Settings, the Services, the peers' passwords) into
// a Plan: the sessions to keep, the prefixes to announce and the import
// policy. Select picks, from the speaker's RIB, the routes to install:
// one per prefix, ECMP over the equal best paths the policy accepts. These
// are pure. The Speaker (gobgp) and the FIB (netlink) apply them; the
// Controller ties the two and reacts to RIB and session changes.
//
// # Sessions
//
// By default every node peers with every other node on its InternalIP
// (IPv4 if it has one), one session carrying both families (negotiated
// explicitly), under one ASN (iBGP full mesh). With route reflectors, the
// selected nodes reflect to every other node (their clients), and clients
// peer only with reflectors. External peers (top-of-rack routers) are
// configured per cluster, for every node or the nodes a selector picks,
// with an optional TCP MD5 password from a Secret or a file, timers and
// eBGP multihop. External peers only receive what the node originates (a
// global export policy keyed on the external peers' addresses): no iBGP
// route is leaked, no node becomes a transit between two routers.
//
// # Announcements
//
// Each node announces its podCIDRs, next hop its InternalIP of the family;
// optionally the service CIDRs, and Services' externalIPs and
// load-balancer ingress IPs as host routes: with externalTrafficPolicy
// Local only while the node has a ready endpoint. Each kind carries its
// configured communities.
//
// # Import policy
//
// A node's podCIDR is installed only with that node as next hop, and only
// while the Node exists in the API: a deleted node's routes go at once,
// whatever peers still say. Anything else is installed only when it is
// not a default route, does not overlap the cluster's pod or service
// CIDRs, and lies inside the configured import prefixes.
//
// # Routes in the kernel
//
// Learned routes go into the main table with route protocol RouteProtocol
// (0x58), distinct from host-gw's and VXLAN's 0x57; several equal next
// hops make one multipath route. Only routes of that protocol are listed,
// replaced in place or deleted. FIB.Cleanup removes them all.
//
// # Graceful restart
//
// Every session advertises the graceful-restart capability (restart time
// from the configuration, default 120 s) for both families, and a
// stopping agent sends no Cease, so peers keep the node's routes while it
// restarts. The kernel keeps the learned routes too: nothing is flushed on
// exit. A starting Controller installs what it learns at once but deletes
// no route until every peer whose session came up has sent its
// End-of-RIB (peers still down after PeerWait, 5 s, are not waited for;
// Settle, 30 s, bounds the whole wait), so it converges in seconds
// instead of gobgp's 360 s deferral, which is never used: the speaker
// does not claim to be restarting.
package bgp
