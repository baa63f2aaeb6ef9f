package ebpf

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/weftnet/weft/proxy/model"
)

// Config is the eBPF backend's view of the node.
type Config struct {
	NodeName, Zone string
	// NodePortIPs are the node addresses NodePorts answer on.
	NodePortIPs []netip.Addr
	// CgroupRoot is the cgroup v2 directory the programs attach to.
	CgroupRoot string
	// PinPath is the bpffs directory holding weft's pinned maps and links.
	PinPath string
}

// Verdict is what a frontend does with a new connection.
type Verdict uint8

// Verdicts; Forward needs at least one backend.
const (
	Forward Verdict = iota
	Reject          // no endpoint anywhere: connection refused
	Drop            // endpoints exist, none usable from this node
)

// FrontendKey is an address clients connect to.
type FrontendKey struct {
	Addr     netip.Addr // IPv4 unmapped
	Port     uint16
	Protocol model.Protocol
}

// Frontend is one frontend's desired state.
type Frontend struct {
	Service         model.ServicePortName
	Verdict         Verdict
	Backends        []netip.AddrPort // in the model's order
	AffinitySeconds int
}

// Render returns the frontends of st that the socket-level hooks serve:
// every ClusterIP (internal endpoints), and the NodePorts on cfg's node
// addresses, externalIPs and LoadBalancer IPs as reached from the node
// itself, which kube-proxy sends to the cluster-wide endpoints whatever
// the external traffic policy. LoadBalancer IPs with sourceRanges are left
// out (the source is not known at connect time; the per-packet path will
// filter them). A frontend claimed by two service ports goes to the first
// in name order. SCTP is not served. Render is pure.
func Render(cfg Config, st model.State) map[FrontendKey]Frontend {
	names := make([]model.ServicePortName, 0, len(st.Ports))
	for n := range st.Ports {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b model.ServicePortName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
	out := map[FrontendKey]Frontend{}
	add := func(sp *model.ServicePort, addr netip.Addr, port uint16, eps []model.Endpoint, sel model.Selected) {
		k := FrontendKey{Addr: addr.Unmap(), Port: port, Protocol: sp.Protocol}
		if _, taken := out[k]; taken {
			return
		}
		f := Frontend{Service: sp.Name, AffinitySeconds: sp.AffinitySeconds}
		for _, e := range eps {
			f.Backends = append(f.Backends, netip.AddrPortFrom(e.IP.Unmap(), e.Port))
		}
		switch {
		case len(f.Backends) > 0:
		case sel.HasAny:
			f.Verdict = Drop
		default:
			f.Verdict = Reject
		}
		out[k] = f
	}
	for _, name := range names {
		sp := st.Ports[name]
		if sp.Protocol != model.TCP && sp.Protocol != model.UDP {
			continue
		}
		for _, fam := range []bool{true, false} {
			is4 := func(a netip.Addr) bool { return a.Unmap().Is4() == fam }
			var eps []model.Endpoint
			for _, e := range st.Endpoints[name] {
				if is4(e.IP) {
					eps = append(eps, e)
				}
			}
			sel := model.Select(sp, eps, cfg.NodeName, cfg.Zone)
			for _, ip := range sp.ClusterIPs {
				if is4(ip) {
					add(sp, ip, sp.Port, sel.Internal, sel)
				}
			}
			if !sp.HasExternal() {
				continue
			}
			cluster := *sp
			cluster.ExternalPolicyLocal = false
			csel := model.Select(&cluster, eps, cfg.NodeName, cfg.Zone)
			if sp.NodePort != 0 {
				for _, ip := range cfg.NodePortIPs {
					if is4(ip) {
						add(sp, ip, sp.NodePort, csel.External, csel)
					}
				}
			}
			for _, ip := range sp.ExternalIPs {
				if is4(ip) {
					add(sp, ip, sp.Port, csel.External, csel)
				}
			}
			if len(sp.SourceRanges) == 0 {
				for _, ip := range sp.LoadBalancerIPs {
					if is4(ip) {
						add(sp, ip, sp.Port, csel.External, csel)
					}
				}
			}
		}
	}
	return out
}
