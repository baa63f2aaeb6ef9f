// Package dns is weft's cluster DNS (weft-dns): an authoritative server for
// the cluster zone per the Kubernetes DNS-Based Service Discovery
// specification 1.1.0, and a forwarder with a cache for every other name.
//
// The pieces:
//
//   - records.go: pure functions from one Service (and its EndpointSlices and
//     matching Pods) or one Pod to the resource records it contributes.
//   - index.go: the record index, fed incrementally by kube events; answers
//     lookups by lower-cased name under a read lock, with nodes that are
//     immutable once published.
//   - fast.go: the UDP hot path: parses the header and question of a plain
//     query without allocating and answers cluster names from a packed reply
//     cached on the index node.
//   - handler.go: the general path on miekg/dns messages (TCP, EDNS
//     corner cases, truncation, forwarding, errors).
//   - forward.go, cache.go: upstream failover with health checks, and a
//     TTL-capped cache of forwarded answers (positive and negative).
//   - server.go, metrics.go: sockets, readiness and Prometheus metrics.
//
// The package never logs except through the Logger a Server is given.
package dns
