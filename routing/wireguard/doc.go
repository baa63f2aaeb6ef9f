// Package wireguard encrypts pod traffic between nodes with WireGuard, in
// every routing mode (host-gw, VXLAN, BGP).
//
// # Shape
//
// Each node has one device, DefaultDevice, listening on DefaultPort of its
// underlay address, with a private key made in the agent's process at start
// (and on Rotate) that is never written to disk or sent anywhere. The node
// publishes the public key and its endpoint as Node annotations
// (PublicKeyAnnotation, EndpointAnnotation). Compute, which is pure, turns
// the Nodes into the device's peers (one per other node, its podCIDRs as
// allowed IPs) and the routes of Table:
//
//	route     <peer podCIDR> dev weft.wg scope link src <own podCIDR network address>
//	blackhole <peer podCIDR> metric 4096              (strict mode only)
//
// and a rule `priority 99 lookup 87` per family puts Table before the main
// table. The routing mode's own routes stay in the main table: a
// destination Table lacks (a peer whose annotations are missing or bad,
// outside strict mode) falls through to them, in clear; in strict mode the
// blackhole drops it instead, also while the device is missing. The device
// carries each own podCIDR's network address as a host address, so that
// the node's own traffic to pods elsewhere (masqueraded NodePort traffic
// among it) leaves with a source the peers route back into the tunnel.
//
// # Implementations
//
// The kernel's device where the kernel has WireGuard (configured over
// generic netlink), else wireguard-go in the agent's process over a TUN
// device, which is made persistent so that its routes outlive an agent
// restart: meanwhile packets queue or drop in the TUN device, none leave
// in clear. Auto picks the kernel's when it can create the link.
//
// # Ownership
//
// weft owns the device, Table's routes with RouteProtocol and the two
// rules; Cleanup removes them. Apply lists only those.
package wireguard
