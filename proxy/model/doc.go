// Package model is weft's service-proxy model: what every backend
// (iptables, nftables, IPVS, eBPF) renders, computed from Services and
// EndpointSlices by pure functions. It knows nothing of any backend, never
// logs, and returns each problem as an ObjectError naming the object (Kind,
// namespace/name) and the field.
//
// # Build
//
// Build turns Services and EndpointSlices into a State: one ServicePort per
// (Service, port), named by ServicePortName, and for each of them an
// endpoint list (possibly empty, never missing). A ServicePort covers every
// family the Service has a ClusterIP of; its endpoints are those of both
// families, and a backend rendering one family picks the addresses of that
// family. ExternalIPs, LoadBalancerIPs and SourceRanges only hold values of
// a family the Service has a ClusterIP of, as kube-proxy ignores the others.
//
// Services that are not proxied (ExternalName, headless, no ClusterIP) are
// left out silently. Bad input is left out and reported, at three levels:
//
//   - Service-wide: a ClusterIP that does not parse or repeats a family, a
//     loadBalancerSourceRange that does not parse (spaces trimmed, host bits
//     masked, as in Kubernetes), a ClientIP affinity timeout out of 1-86400.
//     The whole Service is skipped: it fails closed, since a half-understood
//     Service could, for one, open a LoadBalancer to sources it restricts.
//   - A port: protocol other than TCP, UDP, SCTP ("" is TCP), port or
//     nodePort out of range, a second port with the same name and protocol.
//     That port is skipped, the Service's others are built.
//   - A value: an externalIP or LoadBalancer ingress IP that does not parse,
//     a healthCheckNodePort out of range (no health check then). That value
//     is left out.
//
// Addresses parse as the API server accepts them, including IPv4 with
// leading zeros (legacy objects; read as decimal, as Kubernetes does); zones
// and IPv4-mapped IPv6 addresses are refused.
//
// Kubernetes semantics the fields follow: ExternalPolicyLocal is
// externalTrafficPolicy Local on an externally accessible Service, which as
// in Kubernetes 1.36 (apiservice.ExternallyAccessible) is a NodePort or
// LoadBalancer Service, or a ClusterIP one with externalIPs.
// HealthCheckNodePort is set for LoadBalancer Services with
// ExternalPolicyLocal. LoadBalancerIPs are the ingress IPs with ipMode VIP or
// unset, whatever the type (as kube-proxy): with ipMode Proxy the load
// balancer rewrites the destination itself. SourceRanges empty means no
// restriction; kube-proxy restricts each family to the ranges of that family
// and leaves a family without any unrestricted. PreferClose is
// trafficDistribution PreferClose or its newer name PreferSameZone;
// PreferSameNode is PreferSameNode.
//
// An EndpointSlice belongs to the Service named by its
// kubernetes.io/service-name label in its namespace; one without the label,
// or naming no Service, is reported (a slice of a Service that is not
// proxied, such as a headless one, is not). A slice serves the family of its
// addressType, and only if the Service has a ClusterIP of that family; FQDN
// slices are ignored. A slice port serves the service port with its name
// (nil is "") and protocol (nil is TCP), with its own number (named target
// ports resolve per pod); a nil number ("all ports") is ignored. An
// endpoint's IP is its first valid address (the API defines nothing for
// others, and kube-proxy reads only the first); every bad address is
// reported. Conditions default as the API says: Ready nil is true, Serving
// nil follows Ready, Terminating nil is false. An IP:port listed twice (an
// endpoint moving between slices, an IP reused by a new pod) is kept once,
// the best one winning: Ready, then Serving, then not Terminating; ties go
// to the slice first by name. Lists are sorted by IP, then port. The result
// does not depend on the order of Build's inputs.
//
// # Select
//
// Select is kube-proxy's CategorizeEndpoints for one node: usable endpoints
// are the Ready ones, or, when none is, the Serving and Terminating ones;
// Local is computed the same way among this node's endpoints alone.
//
// Topology follows the endpoints' hints, as kube-proxy does (1.33 and
// later, PreferSameTrafficDistribution being GA and always on since 1.35):
// node hints (hints.forNodes) when every Ready endpoint has one and at least
// one names this node; else zone hints (hints.forZones) when every Ready
// endpoint has one and at least one names this zone; else no topology. Only
// Ready endpoints are filtered so; the terminating fallback ignores hints.
// The EndpointSlice controller sets hints from trafficDistribution
// (PreferSameZone/PreferClose: zone hints; PreferSameNode: node and zone
// hints) and from the topology-mode annotation, so Select reads hints
// whatever the ServicePort says, and PreferClose/PreferSameNode are
// informational: without hints, a node does not guess by endpoint zones.
//
// # Tracker
//
// Tracker holds the latest objects from informer events. Everything built
// from one Service key (the Service and the slices labelled with its name)
// is independent of every other key, so an event marks keys dirty and
// Snapshot rebuilds only those, then compares each port and endpoint list
// with the previous snapshot: it reports exactly the ports that were added,
// removed or changed, whatever the events were. Its State is always what
// Build returns for the objects it holds, errors included.
//
// A snapshot costs what changed, not the size of the cluster: the tracker
// keeps one State and edits its two maps in place (it never mutates a
// ServicePort or an endpoint list: a changed one is replaced, an equal one
// kept, so consumers tell unchanged ports by pointer), and the State's
// Delta names the changed ports with what the previous snapshot had. A
// State's maps are therefore valid until the next Snapshot. A consumer
// that rendered the previous snapshot (a Cursor tells) looks at the
// Delta's ports only; any other (a State built by hand, a snapshot
// skipped, another tracker's) compares every port. Versions are numbered
// across all trackers, so one tracker's Delta never passes for another's.
package model
