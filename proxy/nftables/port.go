package nftables

import (
	"net/netip"
	"slices"

	"github.com/weftnet/weft/proxy/model"
)

// frontend is one way into a service port: an address (a ClusterIP, an
// externalIP, a LoadBalancer IP or a node address for a NodePort), a
// protocol and a port.
type frontend struct {
	ip    netip.Addr
	proto model.Protocol
	port  uint16
}

// appendTo appends the frontend's key parts: address, protocol, port.
func (f frontend) appendTo(b []byte) []byte {
	return appendPort(appendProto(appendAddr(b, f.ip), f.proto), f.port)
}

// key is the frontend's key in the frontend sets.
func (f frontend) key() packed {
	var buf [44]byte
	return toPacked(f.appendTo(buf[:0]))
}

// elem is one element of a set or map: the set's name, the key and, for a
// map, the value.
type elem struct {
	set   string
	key   packed
	value packedValue
}

// frontendOut is what one service port wants for one of its frontends.
type frontendOut struct {
	elems elemList
	// backends are the addresses (ip . port) the frontend's lists DNAT to:
	// the affinity entries still valid for it (kept only with affinity).
	backends map[packedValue]bool
	affinity int // ClientIP affinity seconds, 0 without
}

// portOut is what one service port renders: its frontends (in order) and
// the hairpin elements of its local endpoints.
type portOut struct {
	name model.ServicePortName
	sp   *model.ServicePort
	eps  []model.Endpoint
	// order are the port's frontends, outs what it wants for each (a port
	// has a few: a slice is cheaper than a map for 100k ports).
	order   []frontend
	outs    []*frontendOut
	hairpin elemList
	// spSeen and epsSeen: the Renderer's last Update that found this
	// port's ServicePort, and its endpoint list, unchanged.
	spSeen, epsSeen uint64
}

// renderPort renders one service port for every configured family.
func renderPort(cfg Config, sp *model.ServicePort, all []model.Endpoint) *portOut {
	o := &portOut{name: sp.Name, sp: sp, eps: all}
	seenHairpin := map[netip.Addr]bool{}
	for _, fam := range cfg.families() {
		o.renderFamily(cfg, fam, all, seenHairpin)
	}
	return o
}

// frontend returns the output of fe, or nil when the port already rendered
// it (an address listed twice, e.g. as externalIP and LoadBalancer IP: the
// first use wins).
func (o *portOut) frontend(fe frontend) *frontendOut {
	if slices.Contains(o.order, fe) {
		return nil
	}
	w := &frontendOut{}
	o.order = append(o.order, fe)
	o.outs = append(o.outs, w)
	return w
}

// out is what the port wants for its frontend fe.
func (o *portOut) out(fe frontend) *frontendOut {
	return o.outs[slices.Index(o.order, fe)]
}

func (o *portOut) renderFamily(cfg Config, fam int, all []model.Endpoint, seenHairpin map[netip.Addr]bool) {
	sp := o.sp
	eps := all
	if slices.ContainsFunc(all, func(e model.Endpoint) bool { return familyOf(e.IP) != fam }) {
		eps = slices.DeleteFunc(slices.Clone(all), func(e model.Endpoint) bool { return familyOf(e.IP) != fam })
	}
	sel := model.Select(sp, eps, cfg.NodeName, cfg.Zone)
	names := familySets[fam]
	list := func(w *frontendOut, fe frontend, cluster bool, l []model.Endpoint) {
		set := lbMap(cluster, fam, len(l))
		w.elems.grow(len(l) + 2) // the list, the verdict set and affinity
		var buf [44]byte
		for i, e := range l {
			key := toPacked(appendInt(fe.appendTo(buf[:0]), uint32(i)))
			val := toValue(appendPort(appendAddr(buf[:0], e.IP), e.Port))
			w.elems.add(elem{set: set, key: key, value: val})
			if sp.AffinitySeconds > 0 { // only affinity entries are checked against backends
				if w.backends == nil {
					w.backends = map[packedValue]bool{}
				}
				w.backends[val] = true
			}
			if (e.NodeName == "" || e.NodeName == cfg.NodeName) && !seenHairpin[e.IP] {
				seenHairpin[e.IP] = true
				o.hairpin.add(elem{set: names.hairpin, key: toPacked(appendAddr(appendAddr(buf[:0], e.IP), e.IP))})
			}
		}
	}
	common := func(w *frontendOut, fe frontend, served []model.Endpoint) {
		switch {
		case len(served) > 0:
			list(w, fe, false, served)
		case sel.HasAny: // endpoints exist, none usable from this node (Local policy)
			w.elems.add(elem{set: names.drop, key: fe.key()})
		default:
			w.elems.add(elem{set: names.reject, key: fe.key()})
		}
		if sp.AffinitySeconds > 0 {
			w.affinity = sp.AffinitySeconds
			w.elems.add(elem{set: affinitySet(fam, sp.AffinitySeconds), key: fe.key()})
		}
	}
	served := false
	for _, ip := range sp.ClusterIPs {
		if familyOf(ip) != fam {
			continue
		}
		served = true
		fe := frontend{ip, sp.Protocol, sp.Port}
		if w := o.frontend(fe); w != nil {
			w.elems.add(elem{set: names.clusterip, key: fe.key()})
			common(w, fe, sel.Internal)
		}
	}
	if !served || !sp.HasExternal() {
		return
	}
	var cluster []model.Endpoint // externalTrafficPolicy Local: what pods and the node use
	if sp.ExternalPolicyLocal {
		cl := *sp
		cl.InternalPolicyLocal, cl.ExternalPolicyLocal = false, false
		cluster = model.Select(&cl, eps, cfg.NodeName, cfg.Zone).Internal
	}
	restricted := false // kube-proxy semantics: a family without ranges is open
	for _, src := range sp.SourceRanges {
		restricted = restricted || familyOf(src.Addr()) == fam
	}
	for _, x := range o.externalFrontends(cfg, fam) {
		w := o.frontend(x.fe)
		if w == nil {
			continue
		}
		key := x.fe.key()
		if sp.ExternalPolicyLocal {
			w.elems.add(elem{set: names.externalLocal, key: key})
			if len(cluster) > 0 {
				list(w, x.fe, true, cluster)
			}
		} else {
			w.elems.add(elem{set: names.external, key: key})
		}
		if x.lb && restricted {
			w.elems.add(elem{set: names.firewall, key: key})
			var buf [44]byte
			for i, src := range sp.SourceRanges {
				// a range listed twice (masked, "10.0.0.0/8" and "10.1.0.0/8"
				// are) is one element
				if familyOf(src.Addr()) == fam && !slices.Contains(sp.SourceRanges[:i], src) {
					w.elems.add(elem{set: names.firewallAllow, key: toPacked(appendPrefix(x.fe.appendTo(buf[:0]), src))})
				}
			}
		}
		common(w, x.fe, sel.External)
	}
}

// external is one external frontend of a port.
type external struct {
	fe frontend
	lb bool // a LoadBalancer IP (sourceRanges apply)
}

// externalFrontends are the port's externalIPs, LoadBalancer IPs and
// NodePort on each node address, of one family.
func (o *portOut) externalFrontends(cfg Config, fam int) []external {
	sp := o.sp
	var out []external
	for _, ip := range sp.ExternalIPs {
		if familyOf(ip) == fam {
			out = append(out, external{fe: frontend{ip, sp.Protocol, sp.Port}})
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		if familyOf(ip) == fam {
			out = append(out, external{fe: frontend{ip, sp.Protocol, sp.Port}, lb: true})
		}
	}
	if sp.NodePort != 0 {
		for _, ip := range cfg.NodePortIPs {
			if familyOf(ip) == fam {
				out = append(out, external{fe: frontend{ip, sp.Protocol, sp.NodePort}})
			}
		}
	}
	return out
}
