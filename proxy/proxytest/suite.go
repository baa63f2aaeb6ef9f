package proxytest

import (
	"context"
	"net"
	"testing"

	"github.com/weftnet/weft/lab/workload"
	"github.com/weftnet/weft/proxy"
)

// Feature is a proxy feature some scenarios need and a backend may not
// support yet; its value says what it is.
type Feature string

// The features a backend can declare unsupported.
const (
	// ExternalTraffic is traffic to NodePorts, externalIPs and LoadBalancer
	// IPs that comes from outside the node (a per-packet path).
	ExternalTraffic Feature = "NodePort, externalIPs and LoadBalancer IPs reached from outside the node"
	// Affinity is ClientIP session affinity.
	Affinity Feature = "ClientIP session affinity"
	// UDPSocketMove is a connected UDP socket leaving a backend once it is
	// removed (moved to a new backend, or terminated: see
	// Backend.TerminatesUDP).
	UDPSocketMove Feature = "connected UDP sockets moved off a removed backend"
	// ClientAddress is the endpoint seeing the client's own address (a
	// pod's from a pod; an outside client's with externalTrafficPolicy
	// Local). Scenarios check everything else without it.
	ClientAddress Feature = "the client's address seen by the endpoint"
	// ConnectionsSurviveRestart is a connection opened through a Service
	// outliving the proxy process that set it up.
	ConnectionsSurviveRestart Feature = "open connections surviving a restart of the proxy"
)

// Backend is a proxy backend under test.
type Backend struct {
	// Mode is the proxy.Config mode that builds the backend.
	Mode string
	// Setup, when not nil, prepares one test for the backend before
	// anything else is created (e.g. a cgroup the test process joins) and
	// fills the mode's fields of the node's proxy.Config. It registers its
	// own cleanup with t.
	Setup func(t *testing.T, c *proxy.Config)
	// Unsupported are the features the backend lacks, each with the reason;
	// the scenarios needing one skip, saying so.
	Unsupported map[Feature]string
	// Outside, when not nil, fetches url from the outside host's namespace
	// ns as Get does, for a backend under which the test process's own
	// sockets are not outside sockets (the eBPF backend translates every
	// socket of the test's cgroup: it runs the client elsewhere).
	Outside func(ns, src, url string) (workload.Reply, error)
	// OutsideDialer, when not nil, is how a client of the outside host's
	// namespace ns dials, for the same reason (nil: netnsutil.Dialer).
	OutsideDialer func(ns string) func(ctx context.Context, network, addr string) (net.Conn, error)
	// TerminatesUDP: the backend terminates a connected UDP socket whose
	// backend was removed, rather than moving it to a new backend (the
	// eBPF backend connects the socket to the backend itself; the NAT
	// backends flush conntrack and the next datagram is balanced again).
	// The client's socket then fails (ECONNABORTED on receive,
	// EDESTADDRREQ on send) and a new socket reaches a new backend, as for
	// a resolver that reopens its socket on an error.
	TerminatesUDP bool
}

// Need skips the calling scenario when b does not support f, naming the
// backend, the feature and the reason.
func (b Backend) Need(t *testing.T, f Feature) {
	t.Helper()
	if why, ok := b.Unsupported[f]; ok {
		t.Skipf("not supported by the %s backend yet: %s (%s)", b.Mode, f, why)
	}
}

// Supports reports whether b supports f; a scenario checks what needs f
// only then, and goes on with the rest.
func (b Backend) Supports(f Feature) bool {
	_, lacks := b.Unsupported[f]
	return !lacks
}

// Run runs every scenario of the table against b.
func Run(t *testing.T, b Backend) {
	for f, why := range b.Unsupported {
		t.Logf("the %s backend lacks %s (%s): the checks needing it are skipped", b.Mode, f, why)
	}
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) { s.run(t, b) })
	}
}

type scenario struct {
	name string
	run  func(t *testing.T, b Backend)
}

var scenarios = []scenario{
	{"Services", services},
	{"DualStack", dualStack},
	{"Uplinks", uplinks},
	{"RestartUnderOpenConnection", restart},
	{"UDPBackendReplaced", udpBackendReplaced},
	{"UDPTargetPortChanged", udpTargetPortChanged},
	{"HealthCheckNodePort", healthCheckNodePort},
	{"ResetOnEndpointRemoval", resetOnRemoval},
	{"TakeOverFromAnotherMode", takeOver},
}
