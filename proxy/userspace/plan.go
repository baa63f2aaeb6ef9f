package userspace

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/weftnet/weft/proxy/model"
)

// Scope is which entry points of a service port a listener serves.
type Scope string

// The scopes. Rootless mode has Internal listeners only.
const (
	Internal Scope = "internal" // the ClusterIPs
	External Scope = "external" // NodePorts, externalIPs, LoadBalancer IPs
)

// Key names one listener.
type Key struct {
	Port  model.ServicePortName
	Scope Scope
}

func (k Key) String() string { return k.Port.String() + "#" + string(k.Scope) }

// compareKeys orders keys by service port name, then scope.
func compareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Port.Namespace, b.Port.Namespace), cmp.Compare(a.Port.Name, b.Port.Name),
		cmp.Compare(a.Port.Port, b.Port.Port), cmp.Compare(a.Port.Protocol, b.Port.Protocol), cmp.Compare(a.Scope, b.Scope))
}

// Listener is what one listener serves: Plan's output, plain data.
type Listener struct {
	Key      Key
	Protocol model.Protocol
	// ServicePort is the Service's port number (what the map shows, and,
	// in rootless mode, the first port tried).
	ServicePort uint16
	// Family is, in rootless mode, the family whose endpoints clients get
	// (the Service's primary ClusterIP's); 0 in redirect mode, where a
	// client gets the endpoints of the family it connected over.
	Family int
	// Affinity is the ClientIP affinity timeout; 0 means none.
	Affinity time.Duration
	// ByFamily are the endpoints per family: [0] IPv4, [1] IPv6.
	ByFamily [2]Endpoints
	// Frontends are the addresses the glue redirects to the listener
	// (none in rootless mode).
	Frontends []Frontend
}

// Endpoints are one family's endpoints of a listener.
type Endpoints struct {
	// HasAny: some endpoint of the family is usable anywhere. Without
	// one, clients are rejected; with one but Serve empty (Local traffic
	// policies), dropped.
	HasAny bool
	// Serve are the endpoints clients of the scope get.
	Serve []netip.AddrPort
	// Cluster, set for an External listener with externalTrafficPolicy
	// Local, are the cluster-wide endpoints, which pods and the node
	// itself get on external frontends (as kube-proxy does).
	Cluster []netip.AddrPort
}

// Frontend is one entry point the glue sends to a listener: an address,
// protocol and port.
type Frontend struct {
	Addr     netip.Addr
	Protocol model.Protocol
	Port     uint16
	// SourceRanges restrict a LoadBalancer IP (empty: anyone).
	SourceRanges []netip.Prefix
}

func (f Frontend) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(f.Addr, f.Port), f.Protocol)
}

// PlanConfig is what Plan needs of the node.
type PlanConfig struct {
	NodeName, Zone string
	// Rootless: Internal listeners only, no frontends.
	Rootless bool
	// NodePortIPs are the node addresses NodePorts answer on.
	NodePortIPs []netip.Addr
}

// familyIndex is 0 for IPv4, 1 for IPv6.
func familyIndex(a netip.Addr) int {
	if a.Is4() || a.Is4In6() {
		return 0
	}
	return 1
}

// Plan returns the listeners st asks for, ordered by key. It is pure.
func Plan(cfg PlanConfig, st model.State) []Listener {
	var out []Listener
	for name, sp := range st.Ports {
		eps := st.Endpoints[name]
		var sel [2]model.Selected
		var cluster [2][]model.Endpoint
		for f := range 2 {
			mine := familyEndpoints(eps, f)
			sel[f] = model.Select(sp, mine, cfg.NodeName, cfg.Zone)
			if sp.ExternalPolicyLocal && sp.HasExternal() {
				// The cluster-wide list: the same choice without the
				// traffic policies (kube-proxy's cluster policy chain).
				open := *sp
				open.ExternalPolicyLocal, open.InternalPolicyLocal = false, false
				cluster[f] = model.Select(&open, mine, cfg.NodeName, cfg.Zone).External
			}
		}
		base := Listener{Protocol: sp.Protocol, ServicePort: sp.Port, Affinity: time.Duration(sp.AffinitySeconds) * time.Second}
		in := base
		in.Key = Key{name, Internal}
		for f := range 2 {
			in.ByFamily[f] = Endpoints{HasAny: sel[f].HasAny, Serve: addrPorts(sel[f].Internal)}
		}
		if cfg.Rootless {
			in.Family = 4
			if len(sp.ClusterIPs) > 0 && sp.ClusterIPs[0].Is6() {
				in.Family = 6
			}
			out = append(out, in)
			continue
		}
		for _, ip := range sp.ClusterIPs {
			in.Frontends = append(in.Frontends, Frontend{Addr: ip, Protocol: sp.Protocol, Port: sp.Port})
		}
		out = append(out, in)
		if !sp.HasExternal() {
			continue
		}
		ext := base
		ext.Key = Key{name, External}
		for f := range 2 {
			ext.ByFamily[f] = Endpoints{HasAny: sel[f].HasAny, Serve: addrPorts(sel[f].External), Cluster: addrPorts(cluster[f])}
		}
		if sp.NodePort != 0 {
			for _, ip := range cfg.NodePortIPs {
				if slices.ContainsFunc(sp.ClusterIPs, func(c netip.Addr) bool { return c.Is6() == ip.Is6() }) {
					ext.Frontends = append(ext.Frontends, Frontend{Addr: ip, Protocol: sp.Protocol, Port: sp.NodePort})
				}
			}
		}
		for _, ip := range sp.ExternalIPs {
			ext.Frontends = append(ext.Frontends, Frontend{Addr: ip, Protocol: sp.Protocol, Port: sp.Port})
		}
		for _, ip := range sp.LoadBalancerIPs {
			var ranges []netip.Prefix
			for _, r := range sp.SourceRanges {
				if r.Addr().Is6() == ip.Is6() {
					ranges = append(ranges, r)
				}
			}
			ext.Frontends = append(ext.Frontends, Frontend{Addr: ip, Protocol: sp.Protocol, Port: sp.Port, SourceRanges: ranges})
		}
		out = append(out, ext)
	}
	slices.SortFunc(out, func(a, b Listener) int { return compareKeys(a.Key, b.Key) })
	return out
}

// familyEndpoints are the endpoints of eps in family f (0: IPv4, 1: IPv6).
func familyEndpoints(eps []model.Endpoint, f int) []model.Endpoint {
	var out []model.Endpoint
	for _, e := range eps {
		if familyIndex(e.IP) == f {
			out = append(out, e)
		}
	}
	return out
}

func addrPorts(eps []model.Endpoint) []netip.AddrPort {
	if len(eps) == 0 {
		return nil
	}
	out := make([]netip.AddrPort, len(eps))
	for i, e := range eps {
		out[i] = netip.AddrPortFrom(e.IP, e.Port)
	}
	return out
}

// PortRange is an inclusive range of ports listeners take their ports from.
type PortRange struct{ First, Last uint16 }

// DefaultPortRange is below the NodePort range (30000-32767) and below
// Linux's ephemeral ports (32768-60999), so that neither a NodePort nor an
// outgoing connection of the node holds a listener's port.
var DefaultPortRange = PortRange{20000, 29999}

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// ParsePortRange parses "first-last".
func ParsePortRange(s string) (PortRange, error) {
	bad := fmt.Errorf("%q is not a port range first-last (1-65535)", s)
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return PortRange{}, bad
	}
	first, err1 := strconv.ParseUint(a, 10, 16)
	last, err2 := strconv.ParseUint(b, 10, 16)
	if err1 != nil || err2 != nil || first == 0 || last < first {
		return PortRange{}, bad
	}
	return PortRange{uint16(first), uint16(last)}, nil
}

// maxProbes bounds the ports of the range one listener tries.
const maxProbes = 64

// Candidates are the ports a listener tries, in order: its service port
// first when own is true (rootless mode), then up to maxProbes ports of r,
// starting at one derived from the key (FNV-1a), so that the same
// listener gets the same port from one run to the next.
func Candidates(k Key, servicePort uint16, own bool, r PortRange) []uint16 {
	var out []uint16
	if own {
		out = append(out, servicePort)
	}
	size := uint32(r.Last-r.First) + 1
	h := fnv.New32a()
	h.Write([]byte(k.String()))
	start := h.Sum32() % size
	for i := range min(size, maxProbes) {
		p := r.First + uint16((start+i)%size)
		if !(own && p == servicePort) {
			out = append(out, p)
		}
	}
	return out
}
