// Package ebpf is weft's eBPF service proxy backend. Two paths share its
// frontend and backend maps (bpf/lb.h):
//
//   - socket-level load balancing: programs on the cgroup v2 hooks
//     connect, sendmsg, recvmsg and getpeername (IPv4 and IPv6,
//     bpf/sock.c) translate a Service address to a backend when a socket
//     connects or sends a datagram, so east-west traffic is never NATed
//     per packet, and show the Service address back to the application;
//   - the per-packet path: tc programs (bpf/nodeport.c, tcx or clsact +
//     cls_bpf) on the uplinks' ingress translate the destination of
//     traffic from outside the node to NodePorts, externalIPs and
//     LoadBalancer IPs (Maglev choice, sourceRanges) and hand it to the
//     kernel, which forwards it through netfilter (NetworkPolicy applies);
//     eTP Cluster traffic carries the masquerade mark, which one constant
//     nat rule of weft's (masq.go) masquerades; eTP Local keeps the
//     client. Programs on the uplinks' egress translate the replies back,
//     with their own pinned conntrack.
//
// Compute, then apply: Render (pure) turns the proxy model into frontends,
// each an address, port, protocol and scope with its backend list and
// verdict; the map writer turns the difference into map writes, ordered so
// that every update is atomic for a reader (see bpf/lb.h): removed
// frontends first (master entry, then slots) and the backends no frontend
// names any more, then new backends, then the inactive half of a
// frontend's slot space and its Maglev table, then its master entry, which
// flips to the new half with the new count; backends the rewrites left
// unused go last. The maps and the program links are pinned under
// a bpffs directory, so programs stay attached and the maps keep their
// content across a restart; a new proxy reads the maps back and swaps its
// programs into the pinned links.
//
// The maps the writer fills grow with the Services and endpoints; their
// capacities come from --bpf-lb-map-max, by default from the node's
// memory (sizing.go: from 16 GiB on, 100,000 Services of 10 endpoints
// fit). Before it writes anything a sync counts what its state needs in
// each of them, at most, while it writes (capacity.go); a state that does
// not fit is refused whole with a CapacityError naming the map, what it
// needs and holds and the flag: the maps keep the previous state, the
// proxy's health fails, and weft_ebpf_map_entries_needed shows the need
// beside weft_ebpf_map_max_entries. Pinned maps of another capacity (the
// flag or the memory changed, or an earlier version's fixed sizes) are
// replaced as a set: the first sync fills new maps while the earlier
// programs go on serving from the old ones, then swaps its programs into
// the links and pins the new maps in place of the old (lbmaps.go); a
// state too large for the new maps leaves the earlier programs and maps
// serving.
//
// A connected UDP socket is connected to its backend itself, so after a
// sync that removed backends from UDP frontends, a socket iterator
// (bpf/udpdestroy.c) destroys the sockets translated to them, in each
// network namespace of the cgroup's threads (udpterm.go).
package ebpf
