package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/weftnet/weft/proxy/model"
)

// portOut is what one service port renders for one family: the nat chains
// it owns (leaves first) and its contributions to the shared dispatch
// chains, the filter chain and the hairpin set.
type portOut struct {
	sp   *model.ServicePort
	eps  []model.Endpoint
	name string

	chains  []*Chain
	vips    map[netip.Prefix][]string // VIP bucket -> dispatch rules
	nports  map[uint16][]string       // NodePort bucket start -> dispatch rules
	rejects []string                  // filter rules while no endpoint is usable
	hairpin []string                  // hairpin set entries
}

// portRenderer renders one service port.
type portRenderer struct {
	cfg    Config
	family int
	sp     *model.ServicePort
	key    string
	out    *portOut
	seen   map[string]bool // chain names already in out.chains
}

// renderPort renders one service port for a family.
//
// Per port: ClusterIP dispatch rules in the VIP's bucket chain (a masquerade
// mark for sources outside the cluster CIDR, then a jump to a load-balancing
// chain); an EXT chain for NodePort, externalIPs and LoadBalancer IPs
// (masquerade or, with externalTrafficPolicy Local, source-preserving local
// endpoints); an FW chain for LoadBalancer source ranges. A load-balancing
// chain DNATs straight to the endpoints (kube-proxy adds one chain and two
// rules per endpoint; a hairpin set replaces its per-endpoint masquerade
// rule), except with ClientIP affinity, which needs a chain per endpoint to
// record the client. Ports without usable endpoints get REJECT (none at
// all) or DROP (none usable here) rules in the filter table.
func renderPort(cfg Config, family int, sp *model.ServicePort, all []model.Endpoint) *portOut {
	o := &portOut{sp: sp, eps: all, name: sp.Name.String(), vips: map[netip.Prefix][]string{}, nports: map[uint16][]string{}}
	p := &portRenderer{cfg: cfg, family: family, sp: sp, key: o.name, out: o, seen: map[string]bool{}}
	p.render(all)
	return o
}

// chain adds a content-addressed nat chain (once) and returns its name.
func (p *portRenderer) chain(prefix string, rules []string, identity ...string) string {
	c := addressed(TableNAT, prefix, rules, append([]string{p.key}, identity...)...)
	if !p.seen[c.Name] {
		p.seen[c.Name] = true
		p.out.chains = append(p.out.chains, c)
	}
	return c.Name
}

func (p *portRenderer) render(all []model.Endpoint) {
	sp := p.sp
	var vips []netip.Addr
	for _, ip := range sp.ClusterIPs {
		if familyOf(ip) == p.family {
			vips = append(vips, ip)
		}
	}
	if len(vips) == 0 {
		return
	}
	var eps []model.Endpoint
	for _, e := range all {
		if familyOf(e.IP) == p.family {
			eps = append(eps, e)
		}
	}
	sel := model.Select(sp, eps, p.cfg.NodeName, p.cfg.Zone)
	pr := proto(sp.Protocol)
	match := fmt.Sprintf("-p %s -m %s --dport %d", pr, pr, sp.Port)
	comment := fmt.Sprintf(`-m comment --comment "%s"`, p.key)
	o := p.out

	for _, vip := range vips {
		dst := fmt.Sprintf("-d %s %s %s", hostLen(vip), match, comment)
		if len(sel.Internal) == 0 {
			o.rejects = append(o.rejects, fmt.Sprintf("%s -j %s", dst, noEndpointVerdict(sel)))
			continue
		}
		lb := p.lb(sel.Internal)
		b := vipBucket(vip)
		if m := p.internalMasq(); m != "" {
			o.vips[b] = append(o.vips[b], fmt.Sprintf("%s %s -j %s", dst, m, chainMarkMasq))
		}
		o.vips[b] = append(o.vips[b], fmt.Sprintf("%s -j %s", dst, lb))
	}
	if !sp.HasExternal() {
		return
	}

	ext := p.external(eps, sel)
	entries := p.externalEntries()
	nodePortMatch := fmt.Sprintf("-p %s -m %s --dport %d", pr, pr, sp.NodePort)
	entryMatch := func(e entry) string {
		if e.nodePort {
			return nodePortMatch
		}
		return match
	}
	if len(sel.External) == 0 {
		for _, e := range entries {
			o.rejects = append(o.rejects, fmt.Sprintf("%s %s %s -j %s", e.filterMatch, entryMatch(e), comment, noEndpointVerdict(sel)))
		}
	}
	if ext == "" {
		return
	}
	restricted := false // kube-proxy semantics: a family without ranges is open
	for _, src := range sp.SourceRanges {
		restricted = restricted || familyOf(src.Addr()) == p.family
	}
	fw := ""
	for _, e := range entries {
		target := ext
		if e.lb && restricted {
			if fw == "" {
				fw = p.firewall(ext)
			}
			target = fw
		}
		rule := fmt.Sprintf("%s %s -j %s", entryMatch(e), comment, target)
		if e.nodePort {
			s := bucketPort(sp.NodePort)
			o.nports[s] = append(o.nports[s], rule)
		} else {
			b := vipBucket(e.ip)
			o.vips[b] = append(o.vips[b], fmt.Sprintf("-d %s %s", hostLen(e.ip), rule))
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
func (p *portRenderer) internalMasq() string {
	if p.cfg.MasqueradeAll {
		return `-m comment --comment "masquerade all"`
	}
	var cidrs []netip.Prefix
	for _, c := range p.cfg.ClusterCIDRs {
		if familyOf(c.Addr()) == p.family {
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

func (p *portRenderer) externalEntries() []entry {
	var out []entry
	for _, ip := range p.sp.ExternalIPs {
		if familyOf(ip) == p.family {
			out = append(out, entry{ip: ip, filterMatch: "-d " + hostLen(ip)})
		}
	}
	for _, ip := range p.sp.LoadBalancerIPs {
		if familyOf(ip) == p.family {
			out = append(out, entry{ip: ip, lb: true, filterMatch: "-d " + hostLen(ip)})
		}
	}
	if p.sp.NodePort != 0 {
		out = append(out, entry{nodePort: true, filterMatch: "-m addrtype --dst-type LOCAL"})
	}
	return out
}

// external renders the EXT chain and returns its name ("" when no external
// traffic can be served at all).
func (p *portRenderer) external(eps []model.Endpoint, sel model.Selected) string {
	sp := p.sp
	if !sp.ExternalPolicyLocal {
		if len(sel.External) == 0 {
			return ""
		}
		return p.chain("WEFT-EXT-", []string{"-j " + chainMarkMasq, "-j " + p.lb(sel.External)})
	}
	// Local policy: pods and the node itself may use any endpoint (kube-proxy
	// semantics); everyone else only this node's, with the source preserved.
	var rules []string
	cl := *sp
	cl.InternalPolicyLocal, cl.ExternalPolicyLocal = false, false
	if cluster := model.Select(&cl, eps, p.cfg.NodeName, p.cfg.Zone).Internal; len(cluster) > 0 {
		lb := p.lb(cluster)
		for _, c := range p.cfg.ClusterCIDRs {
			if familyOf(c.Addr()) == p.family {
				rules = append(rules, fmt.Sprintf(`-s %s -m comment --comment "pod traffic for external destinations" -j %s`, c, lb))
			}
		}
		rules = append(rules,
			fmt.Sprintf(`-m addrtype --src-type LOCAL -m comment --comment "masquerade local traffic" -j %s`, chainMarkMasq),
			fmt.Sprintf(`-m addrtype --src-type LOCAL -m comment --comment "route local traffic" -j %s`, lb))
	}
	if len(sel.External) > 0 {
		rules = append(rules, "-j "+p.lb(sel.External))
	}
	if len(rules) == 0 {
		return ""
	}
	return p.chain("WEFT-EXT-", rules)
}

// firewall renders the LoadBalancer source-range chain in front of ext.
func (p *portRenderer) firewall(ext string) string {
	var rules []string
	for _, src := range p.sp.SourceRanges {
		if familyOf(src.Addr()) == p.family {
			rules = append(rules, fmt.Sprintf("-s %s -j %s", src, ext))
		}
	}
	rules = append(rules, fmt.Sprintf(`-m comment --comment "%s: source not in loadBalancerSourceRanges" -j %s`, p.key, chainMarkDrop))
	return p.chain("WEFT-FW-", rules)
}

// lb renders the load-balancing chain over eps and returns its name.
func (p *portRenderer) lb(eps []model.Endpoint) string {
	sp := p.sp
	pr := proto(sp.Protocol)
	targets := make([]string, len(eps))
	for i, e := range eps {
		dest := netip.AddrPortFrom(e.IP, e.Port)
		if e.NodeName == "" || e.NodeName == p.cfg.NodeName {
			p.hairpin(dest, pr) // only a pod on this node can reach itself here
		}
		if sp.AffinitySeconds > 0 {
			targets[i] = "-j " + p.endpoint(e)
		} else {
			targets[i] = fmt.Sprintf("-p %s -j DNAT --to-destination %s", pr, dest)
		}
	}
	var rules []string
	if sp.AffinitySeconds > 0 {
		for _, t := range targets {
			sep := strings.TrimPrefix(t, "-j ")
			rules = append(rules, fmt.Sprintf("-m recent --name %s --rcheck --seconds %d --reap --rsource -j %s", sep, sp.AffinitySeconds, sep))
		}
	}
	for i, t := range targets {
		if left := len(targets) - i; left > 1 {
			rules = append(rules, fmt.Sprintf("-m statistic --mode random --probability %.10f %s", 1/float64(left), t))
			continue
		}
		rules = append(rules, t)
	}
	return p.chain("WEFT-LB-", rules)
}

// hairpin records that a connection DNATed to dest from dest's own address
// must be masqueraded.
func (p *portRenderer) hairpin(dest netip.AddrPort, pr string) {
	e := fmt.Sprintf("%s,%s:%d,%s", dest.Addr(), pr, dest.Port(), dest.Addr())
	if !slices.Contains(p.out.hairpin, e) { // at most two LB chains per port share endpoints
		p.out.hairpin = append(p.out.hairpin, e)
	}
}

// endpoint renders the DNAT chain of one endpoint of a ClientIP-affinity
// port: it records the client (the recent list is named after the chain)
// and DNATs.
func (p *portRenderer) endpoint(e model.Endpoint) string {
	pr := proto(p.sp.Protocol)
	dest := netip.AddrPortFrom(e.IP, e.Port).String()
	name := hashName("WEFT-SEP-", p.key, pr, dest)
	if !p.seen[name] {
		p.seen[name] = true
		p.out.chains = append(p.out.chains, &Chain{Table: TableNAT, Name: name,
			Rules: []string{fmt.Sprintf("-p %s -m recent --name %s --set --rsource -j DNAT --to-destination %s", pr, name, dest)}})
	}
	return name
}
