package ebpf

import (
	"cmp"
	"fmt"
	"log/slog"
	"maps"
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
	// Devices are the uplinks the per-packet programs run on (on the
	// ingress, traffic from outside the node to NodePorts, externalIPs and
	// LoadBalancer IPs; on the egress, the replies to it); empty: the links
	// holding NodePortIPs.
	Devices []string
	// TCLegacy makes the per-packet path work as on a kernel without tcx
	// (Linux < 6.6) even where the kernel has it: cls_bpf filters on a
	// clsact qdisc.
	TCLegacy bool
	// Families are the IP families of the node (4, 6), those the
	// masquerade rule is written for; MasqueradeBit is the skb->mark bit
	// the per-packet program sets on traffic to masquerade (0: bit 14,
	// 0x4000, as the iptables backend); IPTablesVariant selects the
	// iptables tools ("", "nft" or "legacy").
	Families        []int
	MasqueradeBit   int
	IPTablesVariant string
	// CTMax is the size of the per-packet programs' conntrack maps
	// (weft_ct and weft_nat_rev, entries each); 0 sizes them from the
	// node's memory (CTMaxFor).
	CTMax int
	// LBMax is the capacity of the services map (--bpf-lb-map-max), from
	// which the other maps the writer fills get theirs (LBCapacities); 0
	// sizes it from the node's memory (LBMaxFor).
	LBMax int
	// LBMode is how flows from outside reach a backend of another node
	// (--bpf-lb-mode): LBModeSNAT (""), LBModeDSR or LBModeHybrid.
	LBMode string
	// XDP is where external frontends are translated ahead of tc
	// (--bpf-xdp): XDPOff (""), XDPAuto, XDPNative or XDPGeneric.
	XDP string
	// TunnelDevice is the VXLAN device DSR packets of other nodes arrive
	// on decapsulated (the receive side runs on its ingress when it
	// exists; "": routing.DefaultDevice).
	TunnelDevice string
	// Log gets the warnings of map pressure (nil: slog.Default()).
	Log *slog.Logger
}

// Load balancing modes of external eTP Cluster frontends (--bpf-lb-mode).
// snat: the ingress node masquerades the flow and the reply comes back
// through it. dsr: a backend on another node gets the client's address
// and answers the client directly, with the frontend as the source
// (IPv4; bpf/nodeport.c). hybrid: dsr for TCP, snat for UDP (whose every
// packet would carry the frontend's 8 bytes).
const (
	LBModeSNAT   = "snat"
	LBModeDSR    = "dsr"
	LBModeHybrid = "hybrid"
)

// CheckLBMode returns an error naming the flag for a mode that is not one
// of the above ("" is snat).
func CheckLBMode(mode string) error {
	switch mode {
	case "", LBModeSNAT, LBModeDSR, LBModeHybrid:
		return nil
	}
	return fmt.Errorf("--bpf-lb-mode: %q is not one of snat, dsr, hybrid", mode)
}

// lbMode is the mode's name ("" is snat).
func (c Config) lbMode() string {
	if c.LBMode == "" {
		return LBModeSNAT
	}
	return c.LBMode
}

// dsr reports whether external eTP Cluster frontends of protocol p go to
// remote backends with direct server return.
func (c Config) dsr(p model.Protocol) bool {
	return c.LBMode == LBModeDSR || (c.LBMode == LBModeHybrid && p == model.TCP)
}

// masqMark is the skb->mark bit of traffic to masquerade.
func (c Config) masqMark() uint32 {
	if c.MasqueradeBit == 0 {
		return 1 << 14
	}
	return 1 << c.MasqueradeBit
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
	// External frontends serve packets from outside the node (the
	// per-packet programs); the others serve the node's own sockets.
	External bool
}

// Frontend is one frontend's desired state.
type Frontend struct {
	Service         model.ServicePortName
	Verdict         Verdict
	Backends        []netip.AddrPort // in the model's order
	AffinitySeconds int
	// Masquerade (external frontends, eTP Cluster): the backend sees the
	// node's address as the client.
	Masquerade bool
	// SourceRanges (external LoadBalancer IPs): only clients in them are
	// served, others are dropped; empty: every client.
	SourceRanges []netip.Prefix
	// DSR (external, masqueraded, IPv4, --bpf-lb-mode dsr or hybrid for
	// TCP): a backend on another node answers the client directly, which
	// it sees unmasqueraded.
	DSR bool
	// Remote[i] (with a mode other than snat; nil otherwise): Backends[i]
	// is on another node (its endpoint's nodeName is set and not this
	// node's).
	Remote []bool
}

// Render returns the frontends of st. Those the socket-level hooks serve:
// every ClusterIP (internal endpoints), and the NodePorts on cfg's node
// addresses, externalIPs and LoadBalancer IPs as reached from the node
// itself, which kube-proxy sends to the cluster-wide endpoints whatever
// the external traffic policy; LoadBalancer IPs with sourceRanges are left
// out there (the source is not known at connect time). The external ones,
// which the per-packet programs serve for traffic from outside the node:
// the same NodePorts, externalIPs and LoadBalancer IPs with the external
// endpoints (eTP Local: this node's only, and the client's address kept;
// eTP Cluster: masqueraded), LoadBalancer IPs with their sourceRanges.
// A frontend claimed by two service ports goes to the first in name order.
// SCTP is not served. Render is pure.
func Render(cfg Config, st model.State) map[FrontendKey]Frontend {
	names := make([]model.ServicePortName, 0, len(st.Ports))
	for n := range st.Ports {
		names = append(names, n)
	}
	slices.SortFunc(names, compareNames)
	out := map[FrontendKey]Frontend{}
	for _, name := range names {
		for _, pf := range renderPort(cfg, st.Ports[name], st.Endpoints[name]) {
			if _, taken := out[pf.key]; !taken {
				out[pf.key] = pf.f
			}
		}
	}
	return out
}

func compareNames(a, b model.ServicePortName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
		cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
}

// portFrontends are the frontends of one service port, each key once: a
// port has a few, for which a slice is smaller than a map and as fast to
// search.
type portFrontends []portFrontend

type portFrontend struct {
	key FrontendKey
	f   Frontend
}

// get returns the frontend of key k.
func (p portFrontends) get(k FrontendKey) (Frontend, bool) {
	for _, pf := range p {
		if pf.key == k {
			return pf.f, true
		}
	}
	return Frontend{}, false
}

// renderPort returns the frontends of one service port.
func renderPort(cfg Config, sp *model.ServicePort, all []model.Endpoint) portFrontends {
	var out portFrontends
	if sp.Protocol != model.TCP && sp.Protocol != model.UDP {
		return out
	}
	add := func(addr netip.Addr, port uint16, eps []model.Endpoint, sel model.Selected, ext *Frontend) {
		k := FrontendKey{Addr: addr.Unmap(), Port: port, Protocol: sp.Protocol, External: ext != nil}
		if _, taken := out.get(k); taken {
			return
		}
		f := Frontend{Service: sp.Name, AffinitySeconds: sp.AffinitySeconds}
		if ext != nil {
			f.Masquerade, f.SourceRanges = ext.Masquerade, ext.SourceRanges
		}
		if ext != nil && f.Masquerade && addr.Unmap().Is4() && cfg.dsr(sp.Protocol) {
			f.DSR = true
		}
		remote := cfg.LBMode != "" && cfg.LBMode != LBModeSNAT
		if len(eps) > 0 {
			f.Backends = make([]netip.AddrPort, len(eps))
			if remote {
				f.Remote = make([]bool, len(eps))
			}
			for i, e := range eps {
				f.Backends[i] = netip.AddrPortFrom(e.IP.Unmap(), e.Port)
				if remote {
					f.Remote[i] = cfg.NodeName != "" && e.NodeName != "" && e.NodeName != cfg.NodeName
				}
			}
		}
		switch {
		case len(f.Backends) > 0:
		case sel.HasAny:
			f.Verdict = Drop
		default:
			f.Verdict = Reject
		}
		out = append(out, portFrontend{k, f})
	}
	for _, fam := range []bool{true, false} {
		is4 := func(a netip.Addr) bool { return a.Unmap().Is4() == fam }
		eps := ofFamily(all, is4)
		sel := model.Select(sp, eps, cfg.NodeName, cfg.Zone)
		for _, ip := range sp.ClusterIPs {
			if is4(ip) {
				add(ip, sp.Port, sel.Internal, sel, nil)
			}
		}
		if !sp.HasExternal() {
			continue
		}
		cluster := *sp
		cluster.ExternalPolicyLocal = false
		csel := model.Select(&cluster, eps, cfg.NodeName, cfg.Zone)
		ext := &Frontend{Masquerade: !sp.ExternalPolicyLocal}
		lb := &Frontend{Masquerade: ext.Masquerade, SourceRanges: sp.SourceRanges}
		if sp.NodePort != 0 {
			for _, ip := range cfg.NodePortIPs {
				if is4(ip) {
					add(ip, sp.NodePort, csel.External, csel, nil)
					add(ip, sp.NodePort, sel.External, sel, ext)
				}
			}
		}
		for _, ip := range sp.ExternalIPs {
			if is4(ip) {
				add(ip, sp.Port, csel.External, csel, nil)
				add(ip, sp.Port, sel.External, sel, ext)
			}
		}
		for _, ip := range sp.LoadBalancerIPs {
			if is4(ip) {
				if len(sp.SourceRanges) == 0 {
					add(ip, sp.Port, csel.External, csel, nil)
				}
				add(ip, sp.Port, sel.External, sel, lb)
			}
		}
	}
	return out
}

// ofFamily returns the endpoints of all whose address is is4's family:
// all itself when that is every one of them (nothing here changes an
// endpoint list, the tracker's included), else a copy of those.
func ofFamily(all []model.Endpoint, is4 func(netip.Addr) bool) []model.Endpoint {
	n := 0
	for _, e := range all {
		if is4(e.IP) {
			n++
		}
	}
	switch n {
	case len(all):
		return all
	case 0:
		return nil
	}
	eps := make([]model.Endpoint, 0, n)
	for _, e := range all {
		if is4(e.IP) {
			eps = append(eps, e)
		}
	}
	return eps
}

// Renderer is Render's incremental form: it keeps each service port's
// frontends and re-renders only the ports whose ServicePort or endpoint
// list changed (the tracker never mutates either, so pointer identity
// tells), reporting the frontends that may differ.
type Renderer struct {
	cfg    Config
	ports  map[model.ServicePortName]renderedPort
	claims map[FrontendKey]claim
	out    map[FrontendKey]Frontend
	// cursor: the tracker's snapshot last rendered, whose Delta then names
	// the ports to look at.
	cursor model.Cursor
}

type renderedPort struct {
	sp     *model.ServicePort
	eps    []model.Endpoint
	fronts portFrontends
}

// NewRenderer returns an empty incremental renderer.
func NewRenderer(cfg Config) *Renderer {
	return &Renderer{cfg: cfg, ports: map[model.ServicePortName]renderedPort{},
		claims: map[FrontendKey]claim{}, out: map[FrontendKey]Frontend{}}
}

// Update returns what Render(st) returns (the renderer's own map: do not
// change it) and the keys whose frontend may have changed or gone. When st
// follows the snapshot rendered last, only the ports its Delta names are
// looked at; otherwise every port.
func (r *Renderer) Update(st model.State) (map[FrontendKey]Frontend, map[FrontendKey]bool) {
	var names []model.ServicePortName
	if changed, all := r.cursor.Next(st); !all {
		names = slices.Collect(maps.Keys(changed))
	} else {
		for name := range r.ports {
			if _, ok := st.Ports[name]; !ok {
				names = append(names, name)
			}
		}
		for name := range st.Ports {
			names = append(names, name)
		}
	}
	// A port renders from itself alone: many (a first sync) render on
	// every CPU, then join the claims in turn.
	fronts := make([]portFrontends, len(names))
	model.Parallel(len(names), func(i int) {
		if sp := st.Ports[names[i]]; sp != nil && !r.rendered(names[i], st) {
			fronts[i] = renderPort(r.cfg, sp, st.Endpoints[names[i]])
		}
	})
	if len(r.ports) == 0 && len(r.out) == 0 {
		// A first render: the maps get their size at once (a port has
		// a frontend or more) rather than by doubling.
		r.ports, r.claims, r.out = make(map[model.ServicePortName]renderedPort, len(names)),
			make(map[FrontendKey]claim, len(names)), make(map[FrontendKey]Frontend, len(names))
	}
	dirty := make(map[FrontendKey]bool, min(len(names), len(st.Ports)))
	for i, name := range names {
		r.port(name, st, fronts[i], dirty)
	}
	for k := range dirty {
		if c, ok := r.claims[k]; ok {
			r.out[k], _ = r.ports[c.first].fronts.get(k)
		} else {
			delete(r.out, k)
		}
	}
	return r.out, dirty
}

// rendered reports whether the port name is rendered as st has it.
func (r *Renderer) rendered(name model.ServicePortName, st model.State) bool {
	rp, ok := r.ports[name]
	return ok && rp.sp == st.Ports[name] && sameList(rp.eps, st.Endpoints[name])
}

// port puts the port name as st has it, whose frontends are fronts, in
// place of what was rendered (or withdraws it) unless that is what was
// rendered, marking the keys that may change.
func (r *Renderer) port(name model.ServicePortName, st model.State, fronts portFrontends, dirty map[FrontendKey]bool) {
	if r.rendered(name, st) {
		return
	}
	sp, eps := st.Ports[name], st.Endpoints[name]
	rp, ok := r.ports[name]
	if ok {
		r.drop(name, rp, dirty)
		delete(r.ports, name)
	}
	if sp == nil {
		return
	}
	rp = renderedPort{sp: sp, eps: eps, fronts: fronts}
	r.ports[name] = rp
	for _, pf := range rp.fronts {
		c, ok := r.claims[pf.key]
		if !ok {
			c = claim{first: name}
		} else {
			c = c.with(name)
		}
		r.claims[pf.key] = c
		dirty[pf.key] = true
	}
}

// claim names the ports rendering a key, in name order: first, then the
// others (nearly always none: most keys take no slice).
type claim struct {
	first model.ServicePortName
	more  []model.ServicePortName
}

// with returns c with name added.
func (c claim) with(name model.ServicePortName) claim {
	all := append([]model.ServicePortName{c.first, name}, c.more...)
	slices.SortFunc(all, compareNames)
	return claim{first: all[0], more: all[1:]}
}

// without returns c without name; ok is false when no port is left.
func (c claim) without(name model.ServicePortName) (rest claim, ok bool) {
	if len(c.more) == 0 {
		return c, c.first != name
	}
	all := slices.DeleteFunc(append([]model.ServicePortName{c.first}, c.more...), func(n model.ServicePortName) bool { return n == name })
	return claim{first: all[0], more: all[1:]}, true
}

// drop withdraws a port's claims.
func (r *Renderer) drop(name model.ServicePortName, rp renderedPort, dirty map[FrontendKey]bool) {
	for _, pf := range rp.fronts {
		if c, ok := r.claims[pf.key].without(name); ok {
			r.claims[pf.key] = c
		} else {
			delete(r.claims, pf.key)
		}
		dirty[pf.key] = true
	}
}

// sameList reports whether a and b are the same slice.
func sameList(a, b []model.Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
