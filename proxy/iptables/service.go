package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/weftnet/weft/proxy/model"
)

// servicePort renders one service port for the renderer's family.
//
// Per port: ClusterIP dispatch rules in the VIP's bucket chain (a masquerade
// mark for sources outside the cluster CIDR, then a jump to a load-balancing
// chain); an EXT chain for NodePort, externalIPs and LoadBalancer IPs
// (masquerade or, with externalTrafficPolicy Local, source-preserving local
// endpoints); an FW chain for LoadBalancer source ranges; one SEP chain per
// endpoint doing the DNAT. Ports without usable endpoints get REJECT (none
// at all) or DROP (none usable here) rules in the filter table.
func (r *renderer) servicePort(sp *model.ServicePort, all []model.Endpoint) {
	var vips []netip.Addr
	for _, ip := range sp.ClusterIPs {
		if familyOf(ip) == r.family {
			vips = append(vips, ip)
		}
	}
	if len(vips) == 0 {
		return
	}
	var eps []model.Endpoint
	for _, e := range all {
		if familyOf(e.IP) == r.family {
			eps = append(eps, e)
		}
	}
	key := sp.Name.String()
	sel := model.Select(sp, eps, r.cfg.NodeName, r.cfg.Zone)
	p := proto(sp.Protocol)
	match := fmt.Sprintf("-p %s -m %s --dport %d", p, p, sp.Port)
	comment := fmt.Sprintf(`-m comment --comment "%s"`, key)

	for _, vip := range vips {
		dst := fmt.Sprintf("-d %s %s %s", hostLen(vip), match, comment)
		if len(sel.Internal) == 0 {
			r.rejects = append(r.rejects, fmt.Sprintf("%s -j %s", dst, noEndpointVerdict(sel)))
			continue
		}
		lb := r.lb(sp, sel.Internal)
		if m := r.internalMasq(); m != "" {
			r.addVIP(vip, fmt.Sprintf("%s %s -j %s", dst, m, chainMarkMasq))
		}
		r.addVIP(vip, fmt.Sprintf("%s -j %s", dst, lb))
	}
	if !sp.HasExternal() {
		return
	}

	ext := r.external(sp, eps, sel)
	entries := r.externalEntries(sp)
	nodePortMatch := fmt.Sprintf("-p %s -m %s --dport %d", p, p, sp.NodePort)
	entryMatch := func(e entry) string {
		if e.nodePort {
			return nodePortMatch
		}
		return match
	}
	if len(sel.External) == 0 {
		for _, e := range entries {
			r.rejects = append(r.rejects, fmt.Sprintf("%s %s %s -j %s", e.filterMatch, entryMatch(e), comment, noEndpointVerdict(sel)))
		}
	}
	if ext == "" {
		return
	}
	restricted := false // kube-proxy semantics: a family without ranges is open
	for _, src := range sp.SourceRanges {
		restricted = restricted || familyOf(src.Addr()) == r.family
	}
	for _, e := range entries {
		target := ext
		if e.lb && restricted {
			target = r.firewall(sp, ext)
		}
		rule := fmt.Sprintf("%s %s -j %s", entryMatch(e), comment, target)
		if e.nodePort {
			r.nports[bucketPort(sp.NodePort)] = append(r.nports[bucketPort(sp.NodePort)], rule)
		} else {
			r.addVIP(e.ip, fmt.Sprintf("-d %s %s", hostLen(e.ip), rule))
		}
	}
}

func noEndpointVerdict(sel model.Selected) string {
	if sel.HasAny {
		return "DROP" // endpoints exist, none usable from this node (Local policy)
	}
	return "REJECT"
}

// internalMasq is the source match whose ClusterIP traffic gets masqueraded.
func (r *renderer) internalMasq() string {
	if r.cfg.MasqueradeAll {
		return `-m comment --comment "masquerade all"`
	}
	var cidrs []netip.Prefix
	for _, c := range r.cfg.ClusterCIDRs {
		if familyOf(c.Addr()) == r.family {
			cidrs = append(cidrs, c)
		}
	}
	if len(cidrs) != 1 {
		return "" // no (or ambiguous) cluster CIDR: no masquerade of internal traffic
	}
	return "! -s " + cidrs[0].String()
}

// entry is one external way into a service port.
type entry struct {
	ip          netip.Addr
	nodePort    bool
	lb          bool
	filterMatch string // destination match usable in the filter table
}

func (r *renderer) externalEntries(sp *model.ServicePort) []entry {
	var out []entry
	for _, ip := range sp.ExternalIPs {
		if familyOf(ip) == r.family {
			out = append(out, entry{ip: ip, filterMatch: "-d " + hostLen(ip)})
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		if familyOf(ip) == r.family {
			out = append(out, entry{ip: ip, lb: true, filterMatch: "-d " + hostLen(ip)})
		}
	}
	if sp.NodePort != 0 {
		out = append(out, entry{nodePort: true, filterMatch: "-m addrtype --dst-type LOCAL"})
	}
	return out
}

// external renders the EXT chain and returns its name ("" when no external
// traffic can be served at all).
func (r *renderer) external(sp *model.ServicePort, eps []model.Endpoint, sel model.Selected) string {
	key := sp.Name.String()
	name := hashName("WEFT-EXT-", key)
	if !sp.ExternalPolicyLocal {
		if len(sel.External) == 0 {
			return ""
		}
		r.add(TableNAT, name, "-j %s", chainMarkMasq)
		r.add(TableNAT, name, "-j %s", r.lb(sp, sel.External))
		return name
	}
	// Local policy: pods and the node itself may use any endpoint (kube-proxy
	// semantics); everyone else only this node's, with the source preserved.
	cl := *sp
	cl.InternalPolicyLocal, cl.ExternalPolicyLocal = false, false
	cluster := model.Select(&cl, eps, r.cfg.NodeName, r.cfg.Zone).Internal
	if len(cluster) > 0 {
		lb := r.lb(sp, cluster)
		for _, c := range r.cfg.ClusterCIDRs {
			if familyOf(c.Addr()) == r.family {
				r.add(TableNAT, name, `-s %s -m comment --comment "pod traffic for external destinations" -j %s`, c, lb)
			}
		}
		r.add(TableNAT, name, `-m addrtype --src-type LOCAL -m comment --comment "masquerade local traffic" -j %s`, chainMarkMasq)
		r.add(TableNAT, name, `-m addrtype --src-type LOCAL -m comment --comment "route local traffic" -j %s`, lb)
	}
	if len(sel.External) > 0 {
		r.add(TableNAT, name, "-j %s", r.lb(sp, sel.External))
	}
	if len(r.chain(TableNAT, name).Rules) == 0 {
		r.dropChain(name)
		return ""
	}
	return name
}

// dropChain forgets a chain created but left empty.
func (r *renderer) dropChain(name string) {
	key := TableNAT + "/" + name
	delete(r.chains, key)
	r.order = slices.DeleteFunc(r.order, func(k string) bool { return k == key })
}

// firewall renders the LoadBalancer source-range chain in front of ext.
func (r *renderer) firewall(sp *model.ServicePort, ext string) string {
	name := hashName("WEFT-FW-", sp.Name.String())
	if len(r.chain(TableNAT, name).Rules) > 0 {
		return name
	}
	for _, src := range sp.SourceRanges {
		if familyOf(src.Addr()) == r.family {
			r.add(TableNAT, name, "-s %s -j %s", src, ext)
		}
	}
	r.add(TableNAT, name, `-m comment --comment "%s: source not in loadBalancerSourceRanges" -j %s`, sp.Name, chainMarkDrop)
	return name
}

// lb renders (once) the load-balancing chain over eps and returns its name.
func (r *renderer) lb(sp *model.ServicePort, eps []model.Endpoint) string {
	key := sp.Name.String()
	ids := make([]string, len(eps))
	for i, e := range eps {
		ids[i] = e.String()
	}
	name := hashName("WEFT-LB-", key, strings.Join(ids, ","))
	if _, done := r.chains[TableNAT+"/"+name]; done {
		return name
	}
	r.chain(TableNAT, name)
	seps := make([]string, len(eps))
	for i, e := range eps {
		seps[i] = r.endpoint(sp, e)
	}
	if sp.AffinitySeconds > 0 {
		for _, sep := range seps {
			r.add(TableNAT, name, "-m recent --name %s --rcheck --seconds %d --reap --rsource -j %s", sep, sp.AffinitySeconds, sep)
		}
	}
	for i, sep := range seps {
		if left := len(seps) - i; left > 1 {
			r.add(TableNAT, name, "-m statistic --mode random --probability %.10f -j %s", 1/float64(left), sep)
			continue
		}
		r.add(TableNAT, name, "-j %s", sep)
	}
	return name
}

// endpoint renders (once) the DNAT chain of one endpoint.
func (r *renderer) endpoint(sp *model.ServicePort, e model.Endpoint) string {
	name := hashName("WEFT-SEP-", sp.Name.String(), e.String())
	if _, done := r.chains[TableNAT+"/"+name]; done {
		return name
	}
	p := proto(sp.Protocol)
	r.add(TableNAT, name, `-s %s -m comment --comment "hairpin" -j %s`, hostLen(e.IP), chainMarkMasq)
	affinity := ""
	if sp.AffinitySeconds > 0 {
		affinity = fmt.Sprintf(" -m recent --name %s --set --rsource", name)
	}
	r.add(TableNAT, name, "-p %s -m %s%s -j DNAT --to-destination %s", p, p, affinity, netip.AddrPortFrom(e.IP, e.Port))
	return name
}
