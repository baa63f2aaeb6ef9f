package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/weftnet/weft/policy"
)

// Chain names. Every chain this package owns starts with Prefix; the
// proxy's (WEFT-PROXY-*, WEFT-SERVICES, WEFT-NP-*, ...) and the agent's
// (WEFT-FORWARD, WEFT-POSTROUTING) never do.
const (
	Prefix        = "WEFT-POL-"
	ChainForward  = "WEFT-POL-FORWARD"
	ChainInput    = "WEFT-POL-INPUT"
	ChainIngress  = "WEFT-POL-INGRESS"
	ChainEgress   = "WEFT-POL-EGRESS"
	ChainDropIn   = "WEFT-POL-DROP-IN"
	ChainDropOut  = "WEFT-POL-DROP-OUT"
	podInPrefix   = "WEFT-POL-I-"
	podOutPrefix  = "WEFT-POL-E-"
	SetPrefix     = "WEFT-POL-"
	tempSetPrefix = "WEFT-POLT-"
	// IPv6 sets share the kernel's one namespace of set names with IPv4's,
	// so they have their own prefixes (neither starts with an IPv4 one).
	setPrefix6     = "WEFT-POL6-"
	tempSetPrefix6 = "WEFT-POL6T-"
)

// Config is what Render needs besides the compiled rules.
type Config struct {
	NodeName string
	// LogDrops adds a rate-limited LOG rule before each DROP.
	LogDrops bool
	// LogRate is the LOG limit (iptables --limit syntax), default 10/second.
	LogRate string
	// Family is 4 (the default) or 6.
	Family int
}

// Ruleset is one node's policy state.
type Ruleset struct {
	Family int     // 4 or 6
	Sets   []Set   // sorted by name
	Chains []Chain // in dependency order: sets' users after the dispatchers
	Jumps  []Jump
}

// Set is one ipset.
type Set struct {
	Name    string
	Type    string   // hash:ip or hash:net
	Members []string // "10.0.0.1", "10.0.0.0/8", "10.1.0.0/16 nomatch"
}

// Chain is one filter chain and its rules (without "-A NAME").
type Chain struct {
	Name  string
	Rules []string
}

// Jump is a rule in a built-in filter chain that must come first.
type Jump struct{ Chain, Rule string }

// Jumps are the rules entering the policy chains.
func Jumps() []Jump {
	return []Jump{
		{"FORWARD", `-m comment --comment "weft network policy" -j ` + ChainForward},
		{"INPUT", `-m comment --comment "weft network policy (pods to their node)" -j ` + ChainInput},
	}
}

// Render computes the node's ruleset.
func Render(d policy.Desired, cfg Config) *Ruleset {
	fam := familyOf(cfg.Family)
	rs := &Ruleset{Family: 4, Jumps: Jumps()}
	if fam.v6 {
		rs.Family = 6
	}
	usedSets := map[string]policy.AddrSet{}
	var ingress, egress []string
	var podChains []Chain
	for _, p := range d.Pods {
		if p.Node != cfg.NodeName {
			continue
		}
		ips := fam.only(p.IPs)
		if len(ips) == 0 {
			continue
		}
		if p.Ingress.Isolated {
			name := hashName(podInPrefix, p.Key)
			for _, ip := range ips {
				ingress = append(ingress, fmt.Sprintf("-d %s -m comment --comment %q -j %s", fam.host(ip), p.Key+" ingress", name))
			}
			rules := podRules(fam, p.Ingress.Rules, "src", d.Sets, usedSets)
			podChains = append(podChains, Chain{name, append(rules, "-j "+ChainDropIn)})
		}
		if p.Egress.Isolated {
			name := hashName(podOutPrefix, p.Key)
			for _, ip := range ips {
				egress = append(egress, fmt.Sprintf("-s %s -m comment --comment %q -j %s", fam.host(ip), p.Key+" egress", name))
			}
			rules := podRules(fam, p.Egress.Rules, "dst", d.Sets, usedSets)
			podChains = append(podChains, Chain{name, append(rules, "-j "+ChainDropOut)})
		}
	}
	ids := make([]string, 0, len(usedSets))
	for id := range usedSets {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		rs.Sets = append(rs.Sets, renderSet(fam, setName(fam, id), usedSets[id]))
	}
	sort.Slice(rs.Sets, func(i, j int) bool { return rs.Sets[i].Name < rs.Sets[j].Name })
	rs.Chains = append(rs.Chains,
		Chain{ChainDropIn, dropRules(cfg, "ingress")},
		Chain{ChainDropOut, dropRules(cfg, "egress")},
	)
	rs.Chains = append(rs.Chains, podChains...)
	// IPv6 neighbour discovery is how pods find each other on the bridge
	// (IPv4's ARP never meets iptables); policies do not cover it.
	var nd []string
	if fam.v6 {
		for _, typ := range []string{"router-solicitation", "router-advertisement", "neighbour-solicitation", "neighbour-advertisement", "redirect"} {
			nd = append(nd, "-p ipv6-icmp -m icmp6 --icmpv6-type "+typ+" -j RETURN")
		}
	}
	established := "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"
	rs.Chains = append(rs.Chains,
		Chain{ChainIngress, ingress},
		Chain{ChainEgress, egress},
		Chain{ChainForward, slices.Concat([]string{established}, nd, []string{"-j " + ChainEgress, "-j " + ChainIngress})},
		Chain{ChainInput, slices.Concat([]string{established}, nd, []string{"-j " + ChainEgress})},
	)
	return rs
}

// podRules renders allow rules. Rules with the same ports are grouped so
// that a pod's chain grows with the distinct port lists of its policies, not
// with their number: the pod-address sets of a group are matched through
// one set (their union, shared by every pod with the same combination),
// ipBlocks each through their own set.
func podRules(fam family, rules []policy.Rule, dir string, sets map[string]policy.AddrSet, used map[string]policy.AddrSet) []string {
	type group struct {
		ports    []policy.PortRange
		all      bool
		policies []string
		addrIDs  []string
		netIDs   []string
	}
	var order []string
	groups := map[string]*group{}
	for _, r := range rules {
		sig := fmt.Sprint(r.Ports)
		g, ok := groups[sig]
		if !ok {
			g = &group{ports: r.Ports}
			groups[sig] = g
			order = append(order, sig)
		}
		if !slices.Contains(g.policies, r.Policy) {
			g.policies = append(g.policies, r.Policy)
		}
		if r.AllPeers {
			g.all = true
			continue
		}
		for _, id := range r.Peers {
			s := sets[id]
			switch {
			case s.Kind == policy.SetNets:
				if !slices.Contains(g.netIDs, id) {
					g.netIDs = append(g.netIDs, id)
				}
			case slices.ContainsFunc(s.Addrs, fam.has) && !slices.Contains(g.addrIDs, id):
				g.addrIDs = append(g.addrIDs, id)
			}
		}
	}
	var out []string
	for _, sig := range order {
		g := groups[sig]
		comment := fmt.Sprintf("-m comment --comment %q", strings.Join(g.policies, ","))
		if len(comment) > 240 {
			comment = fmt.Sprintf("-m comment --comment %q", fmt.Sprintf("%s and %d more policies", g.policies[0], len(g.policies)-1))
		}
		var peers []string
		if g.all {
			peers = []string{""}
		} else {
			if len(g.addrIDs) > 0 {
				id := g.addrIDs[0]
				if len(g.addrIDs) > 1 {
					slices.Sort(g.addrIDs)
					id = "union:" + strings.Join(g.addrIDs, "|")
					if _, done := used[id]; !done { // pods with the same policies share it
						var all []netip.Addr
						for _, m := range g.addrIDs {
							all = append(all, sets[m].Addrs...)
						}
						used[id] = policy.AddrSet{Kind: policy.SetAddrs, Addrs: uniq(all)}
					}
				} else {
					used[id] = sets[id]
				}
				peers = append(peers, fmt.Sprintf("-m set --match-set %s %s ", setName(fam, id), dir))
			}
			for _, id := range g.netIDs {
				used[id] = sets[id]
				peers = append(peers, fmt.Sprintf("-m set --match-set %s %s ", setName(fam, id), dir))
			}
		}
		ports := []string{""}
		if len(g.ports) > 0 {
			ports = ports[:0]
			for _, p := range g.ports {
				ports = append(ports, portMatch(p))
			}
		}
		for _, peer := range peers {
			for _, port := range ports {
				out = append(out, peer+port+comment+" -j RETURN")
			}
		}
	}
	return out
}

func uniq(a []netip.Addr) []netip.Addr {
	slices.SortFunc(a, func(x, y netip.Addr) int { return x.Compare(y) })
	return slices.Compact(a)
}

func portMatch(p policy.PortRange) string {
	proto := strings.ToLower(string(p.Protocol))
	switch {
	case p.From == 0:
		return "-p " + proto + " "
	case p.From == p.To:
		return fmt.Sprintf("-p %s -m %s --dport %d ", proto, proto, p.From)
	default:
		return fmt.Sprintf("-p %s -m %s --dport %d:%d ", proto, proto, p.From, p.To)
	}
}

func dropRules(cfg Config, dir string) []string {
	var out []string
	if cfg.LogDrops {
		rate := cfg.LogRate
		if rate == "" {
			rate = "10/second"
		}
		out = append(out, fmt.Sprintf("-m limit --limit %s --limit-burst 20 -j LOG --log-prefix %q", rate, "weft-policy-drop "+dir+": "))
	}
	return append(out, fmt.Sprintf("-m comment --comment %q -j DROP", "weft policy "+dir+" drop"))
}

func renderSet(fam family, name string, s policy.AddrSet) Set {
	out := Set{Name: name, Type: "hash:ip"}
	if s.Kind == policy.SetAddrs {
		for _, a := range fam.only(s.Addrs) {
			out.Members = append(out.Members, a.String())
		}
		return out
	}
	out.Type = "hash:net"
	for _, n := range s.Nets {
		switch {
		case !fam.has(n.Addr()):
		case n.Bits() == 0: // hash:net has no /0: two halves
			out.Members = append(out.Members, fam.everything()...)
		default:
			out.Members = append(out.Members, netString(n))
		}
	}
	for _, n := range s.Except {
		if fam.has(n.Addr()) {
			out.Members = append(out.Members, netString(n)+" nomatch")
		}
	}
	return out
}

// netString writes a prefix the way ipset accepts it (it has no /0).
func netString(n netip.Prefix) string { return n.Masked().String() }

// SetName is the ipset of a set ID.
func SetName(id string) string { return setName(family{}, id) }

func setName(fam family, id string) string { return hashName(fam.setPrefix(), id) }

func hashName(prefix, id string) string {
	sum := sha256.Sum256([]byte(id))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:16]
}
