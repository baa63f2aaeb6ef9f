package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/tcpreset"
	"github.com/weftnet/weft/proxy/model"
)

// Drain, then reset. An endpoint that is terminating stays in its
// EndpointSlice (serving or not) and keeps its connections: they drain.
// Once it leaves the slice (the pod is gone, its grace period over, or it
// no longer matches the Service), the TCP connections clients opened to
// it through the Service are reset at the clients (tcpreset): a client
// waiting for a reply from a backend that vanished without closing gets
// ECONNRESET at once instead of hanging until its own timeout (a client on
// the node itself, whose socket is aborted, ECONNABORTED). Connections
// to endpoints still in the slice are never touched; a Service annotated
// weft.dev/reset-connections: "false" keeps them all; a deleted Service's
// connections keep their conntrack path, as in kube-proxy.

// GoneEndpoint is an endpoint (address and target port) that left a TCP
// service port, with the port's frontends as clients address them.
type GoneEndpoint struct {
	Service  model.ServicePortName
	Endpoint netip.AddrPort
	// Frontends are the ClusterIPs, externalIPs and LoadBalancer IPs with
	// the port; NodePort is the node port (0: none), on any node address.
	Frontends []netip.AddrPort
	NodePort  uint16
}

// fronts reports whether a client addressing dst reaches g's port.
func (g GoneEndpoint) fronts(dst netip.AddrPort) bool {
	return (g.NodePort != 0 && dst.Port() == g.NodePort) || slices.Contains(g.Frontends, dst)
}

// ResetResult counts what one reset did.
type ResetResult struct {
	Reset       int // connections reset at their clients
	Aborted     int // connections of clients on the node itself, their sockets destroyed
	Unanswered  int // clients that did not answer (gone, or already closed)
	Unreachable int // clients the node cannot reach
	Err         error
}

// resetWait bounds the wait for the clients' answers of one reset (a
// client answers within its round-trip time; one asked twice, after
// tcpreset's retry at 600 ms).
const resetWait = 1500 * time.Millisecond

// goneEndpoints returns the endpoints that left each changed TCP port
// that still exists and has not opted out; changed are the ports changed
// since the previous successful sync, with what it programmed.
func goneEndpoints(st model.State, changed map[model.ServicePortName]model.Prior) []GoneEndpoint {
	var out []GoneEndpoint
	for name, prev := range changed {
		sp := st.Ports[name]
		if sp == nil || sp.Protocol != model.TCP || sp.KeepConnections || len(prev.Endpoints) == 0 {
			continue
		}
		now := map[netip.AddrPort]bool{}
		for _, e := range st.Endpoints[name] {
			now[netip.AddrPortFrom(e.IP, e.Port)] = true
		}
		var fronts []netip.AddrPort
		nodePort := sp.NodePort
		for _, p := range []*model.ServicePort{sp, prev.Port} {
			if p == nil {
				continue
			}
			for _, a := range slices.Concat(p.ClusterIPs, p.ExternalIPs, p.LoadBalancerIPs) {
				if f := netip.AddrPortFrom(a, p.Port); !slices.Contains(fronts, f) {
					fronts = append(fronts, f)
				}
			}
			if nodePort == 0 {
				nodePort = p.NodePort
			}
		}
		for _, e := range prev.Endpoints {
			ep := netip.AddrPortFrom(e.IP, e.Port)
			if !now[ep] {
				out = append(out, GoneEndpoint{Service: name, Endpoint: ep, Frontends: fronts, NodePort: nodePort})
			}
		}
	}
	return out
}

// goneFilter is the gone endpoints by address and port. As a conntrack
// filter it selects the entries of the open TCP connections (established,
// or closing but not closed) to them through the ports they left.
type goneFilter map[netip.AddrPort][]GoneEndpoint

func newGoneFilter(gone []GoneEndpoint) goneFilter {
	f := goneFilter{}
	for _, g := range gone {
		f[g.Endpoint] = append(f[g.Endpoint], g)
	}
	return f
}

// Conntrack's TCP states of an open connection.
const (
	ctEstablished = 3
	ctLastAck     = 6
)

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (f goneFilter) MatchConntrackFlow(c *netlink.ConntrackFlow) bool {
	if c.Forward.Protocol != unix.IPPROTO_TCP {
		return false
	}
	if tcp, ok := c.ProtoInfo.(*netlink.ProtoInfoTCP); !ok || tcp.State < ctEstablished || tcp.State > ctLastAck {
		return false
	}
	ep, ok := addrPort(c.Reverse.SrcIP, c.Reverse.SrcPort)
	if !ok {
		return false
	}
	dst, _ := addrPort(c.Forward.DstIP, c.Forward.DstPort)
	return f.through(ep, dst)
}

// through reports whether a connection to endpoint ep addressed to dst
// went through a port ep left.
func (f goneFilter) through(ep, dst netip.AddrPort) bool {
	return slices.ContainsFunc(f[ep], func(g GoneEndpoint) bool { return g.fronts(dst) })
}

func addrPort(ip []byte, port uint16) (netip.AddrPort, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port), ok
}

// conntrackFlows returns the connections f selects, as their clients see
// them (conntrack's original direction).
func conntrackFlows(f goneFilter) ([]tcpreset.Flow, error) {
	var out []tcpreset.Flow
	var errs []error
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing conntrack entries: %w", err))
			continue
		}
		for _, c := range flows {
			if !f.MatchConntrackFlow(c) {
				continue
			}
			client, _ := addrPort(c.Forward.SrcIP, c.Forward.SrcPort)
			server, _ := addrPort(c.Forward.DstIP, c.Forward.DstPort)
			out = append(out, tcpreset.Flow{Client: client, Server: server})
		}
	}
	return out, errors.Join(errs...)
}

// resetConntrack is the reset of the backends whose translations live in
// conntrack (iptables, nftables, IPVS): it resets the connections
// conntrack holds to the gone endpoints through their Services, then
// deletes their entries, which lead nowhere now.
func resetConntrack(gone []GoneEndpoint) ResetResult {
	f := newGoneFilter(gone)
	res := resetFlows(conntrackFlows(f))
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f); err != nil {
			res.Err = errors.Join(res.Err, fmt.Errorf("deleting the conntrack entries of reset connections: %w", err))
		}
	}
	return res
}

// resetFlows resets flows at their clients; err is the error of finding
// them, reported with the reset's.
func resetFlows(flows []tcpreset.Flow, err error) ResetResult {
	res := tcpreset.Reset(flows, resetWait)
	return ResetResult{Reset: len(res.Reset), Aborted: len(res.Aborted), Unanswered: len(res.Unanswered), Unreachable: len(res.Unreachable),
		Err: errors.Join(err, res.Err)}
}
