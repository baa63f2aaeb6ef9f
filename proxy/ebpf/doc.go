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
// that every update is atomic for a reader (see bpf/lb.h): backends first,
// then the inactive half of a frontend's slot space and its Maglev table,
// then its master entry, which flips to the new half with the new count;
// orphan backends go last. The maps and the program links are pinned under
// a bpffs directory, so programs stay attached and the maps keep their
// content across a restart; a new proxy reads the maps back and swaps its
// programs into the pinned links.
//
// A connected UDP socket is connected to its backend itself, so after a
// sync that removed backends from UDP frontends, a socket iterator
// (bpf/udpdestroy.c) destroys the sockets translated to them, in each
// network namespace of the cgroup's threads (udpterm.go).
package ebpf
