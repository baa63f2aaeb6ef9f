package model

import (
	"fmt"
	"net/netip"
)

// Protocol is a service port's transport protocol.
type Protocol string

// The protocols Services support.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// ServicePortName identifies one port of one Service.
type ServicePortName struct {
	Namespace, Name string
	Port            string // the port's name; "" for a single unnamed port
	Protocol        Protocol
}

func (n ServicePortName) String() string {
	return fmt.Sprintf("%s/%s:%s/%s", n.Namespace, n.Name, n.Port, n.Protocol)
}

// ServicePort is everything a backend needs to program one service port.
type ServicePort struct {
	Name ServicePortName
	// ClusterIPs has one address per family the Service uses; it is empty
	// for headless Services, which are not proxied (Build leaves them out).
	ClusterIPs []netip.Addr
	Port       uint16
	Protocol   Protocol
	// NodePort is 0 unless the Service is NodePort or LoadBalancer typed.
	NodePort            uint16
	ExternalIPs         []netip.Addr
	LoadBalancerIPs     []netip.Addr   // status.loadBalancer.ingress[].ip with ipMode VIP (or unset)
	SourceRanges        []netip.Prefix // spec.loadBalancerSourceRanges (masked)
	ExternalPolicyLocal bool           // externalTrafficPolicy: Local (NodePort, LoadBalancer)
	InternalPolicyLocal bool           // internalTrafficPolicy: Local
	HealthCheckNodePort uint16         // set when ExternalPolicyLocal
	// AffinitySeconds is the ClientIP session affinity timeout; 0 means none.
	AffinitySeconds int
	// KeepConnections: the Service opts out of the reset of the TCP
	// connections to its removed endpoints (AnnotationResetConnections).
	KeepConnections bool
	// PreferClose is trafficDistribution: PreferClose (zone hints used).
	PreferClose bool
	// PreferSameNode is trafficDistribution: PreferSameNode (node hints
	// used, then zone hints). Like PreferClose it is informational: Select
	// follows the endpoints' hints, which the EndpointSlice controller sets
	// from trafficDistribution (see doc.go).
	PreferSameNode bool
}

// HasExternal reports whether the port has any external entry point.
func (p *ServicePort) HasExternal() bool {
	return p.NodePort != 0 || len(p.ExternalIPs) > 0 || len(p.LoadBalancerIPs) > 0
}

// Endpoint is one backend of a service port.
type Endpoint struct {
	IP   netip.Addr
	Port uint16
	// Conditions as EndpointSlices carry them (nil Ready counts as ready,
	// nil Serving as Ready, nil Terminating as false).
	Ready, Serving, Terminating bool
	NodeName                    string
	Zone                        string
	// Hints are the endpoint's topology hints; nil when it has none.
	Hints *Hints
}

// Hints are an endpoint's topology hints. Endpoint holds them by pointer:
// most endpoints have none, and at a million endpoints two slice headers
// each would be 48 MB.
type Hints struct {
	Zones []string // hints.forZones
	Nodes []string // hints.forNodes
}

// ForZones is e's hints.forZones.
func (e Endpoint) ForZones() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// ForNodes is e's hints.forNodes.
func (e Endpoint) ForNodes() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

func (e Endpoint) String() string {
	return netip.AddrPortFrom(e.IP, e.Port).String()
}

// State is the whole desired proxy state: what every backend renders.
// Its maps, ServicePorts and endpoint lists are read-only for consumers.
type State struct {
	Ports     map[ServicePortName]*ServicePort
	Endpoints map[ServicePortName][]Endpoint // deduplicated by IP:port, sorted
	// Delta, set by Tracker.Snapshot, names the service ports that differ
	// from the tracker's previous snapshot; nil in a State built or edited
	// otherwise (whoever edits a snapshot's maps must drop it).
	Delta *Delta
}

// Delta is what changed between two snapshots of one Tracker.
type Delta struct {
	// From is the version of the previous snapshot (0: the empty State,
	// before any snapshot), To this snapshot's. Versions are unique across
	// all trackers of the process.
	From, To uint64
	// Changed are the service ports added, removed or changed since From,
	// each with what From had.
	Changed map[ServicePortName]Prior
}

// Prior is a service port as an earlier snapshot had it: Port nil when it
// had none.
type Prior struct {
	Port      *ServicePort
	Endpoints []Endpoint
}

// Cursor is a consumer's place in a tracker's snapshots: the version of
// the last State it consumed, or lost after a State without Delta. The zero
// Cursor has consumed the empty State.
type Cursor struct {
	version uint64
	lost    bool
}

// Next moves c to st and returns the names of the service ports that may
// differ from the State c was at, or all: whether the consumer must
// compare every port instead (st has no Delta, or does not follow the
// State c was at: a snapshot skipped, another tracker, a State by hand).
func (c *Cursor) Next(st State) (changed map[ServicePortName]Prior, all bool) {
	d := st.Delta
	follows := d != nil && !c.lost && d.From == c.version
	if d == nil {
		c.version, c.lost = 0, true
		return nil, true
	}
	c.version, c.lost = d.To, false
	if !follows {
		return nil, true
	}
	return d.Changed, false
}

// Selected are the endpoints one node uses for one service port, with
// kube-proxy's semantics (see Select).
type Selected struct {
	// Internal serves traffic to ClusterIPs; External serves traffic to
	// NodePorts, externalIPs and LoadBalancer IPs. Each is the local or the
	// cluster-wide list according to the port's traffic policies.
	Internal, External []Endpoint
	// Local are the usable endpoints on this node (health check count).
	Local []Endpoint
	// HasAny is true when the port has any usable endpoint anywhere: with no
	// endpoint at all traffic is rejected; with endpoints but none usable
	// here (Local policies), it is dropped.
	HasAny bool
}

// ObjectError is a problem with one Service or EndpointSlice: the object is
// skipped (or, for one bad field of a Service, the affected port), and the
// error names the object's key and the field.
type ObjectError struct {
	Kind  string // "Service" or "EndpointSlice"
	Key   string // namespace/name
	Field string // e.g. "spec.clusterIP", "endpoints[2].addresses[0]"
	Err   error
}

func (e ObjectError) Error() string {
	return fmt.Sprintf("%s %s: %s: %v", e.Kind, e.Key, e.Field, e.Err)
}

func (e ObjectError) Unwrap() error { return e.Err }
