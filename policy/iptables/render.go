package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"slices"
	"sort"

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
	// LogGroup, when not 0, sends the logged packets to this nflog group
	// (NFLOG) instead of the kernel log: the agent's deny log reads them.
	LogGroup uint16
	// Family is 4 (the default) or 6.
	Family int
	// PodPorts, when set, is the iptables interface pattern of the pods'
	// bridge ports ("weft+"): traffic entering from one must carry the
	// address of the pod on that port, as Sources say (see ChainSource).
	PodPorts string
	Sources  []Source
	// PodBridges, when set, are the bridges the node's pods hang off:
	// new pods are default-deny until the agent marks their addresses
	// ready (see ChainPending).
	PodBridges []string
}

// Ruleset is one node's policy state.
type Ruleset struct {
	Family int     // 4 or 6
	Sets   []Set   // sorted by name
	Chains []Chain // in dependency order: sets' users after the dispatchers
	Jumps  []Jump
	// External are sets the rules match whose members another writer
	// keeps (the ready set): created when missing, never rewritten.
	External []Set
}

// Set is one ipset.
type Set struct {
	Name    string
	Type    string   // hash:net,port (peers and ports) or hash:net (peers)
	Members []string // "10.0.0.0/8,tcp:80", "10.1.0.7/32"
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
	sets, tiers := map[string]Set{}, tierCache{}
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
		if !p.Ingress.Empty() {
			name := hashName(podInPrefix, p.Key)
			for _, ip := range ips {
				ingress = append(ingress, fmt.Sprintf("-d %s -m comment --comment %q -j %s", fam.host(ip), p.Key+" ingress", name))
			}
			podChains = append(podChains, directionChains(fam, p.Ingress, name, hashName(podInRestPrefix, p.Key), "src", ChainDropIn, d.Sets, sets, tiers)...)
		}
		if !p.Egress.Empty() {
			name := hashName(podOutPrefix, p.Key)
			for _, ip := range ips {
				egress = append(egress, fmt.Sprintf("-s %s -m comment --comment %q -j %s", fam.host(ip), p.Key+" egress", name))
			}
			podChains = append(podChains, directionChains(fam, p.Egress, name, hashName(podOutRestPrefix, p.Key), "dst", ChainDropOut, d.Sets, sets, tiers)...)
		}
	}
	for _, s := range sets {
		rs.Sets = append(rs.Sets, s)
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
	// The source check comes before the shortcut for established flows:
	// a forged packet could belong to another pod's connection. So does
	// the pending check in FORWARD, not in INPUT (see ChainPending).
	established := "-m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"
	var head, fwdPending, inPending []string
	if cfg.PodPorts != "" {
		src, jump := sourceChain(fam, cfg)
		rs.Chains = append(rs.Chains, src)
		head = append(head, jump)
	}
	if len(cfg.PodBridges) > 0 {
		pending, ready := pendingChain(fam, cfg)
		rs.Chains = append(rs.Chains, pending)
		rs.External = append(rs.External, ready)
		fwdPending = []string{"-j " + ChainPending}
		inPending = fwdPending
	}
	rs.Chains = append(rs.Chains,
		Chain{ChainIngress, ingress},
		Chain{ChainEgress, egress},
		Chain{ChainForward, slices.Concat(head, nd, fwdPending, []string{established, "-j " + ChainEgress, "-j " + ChainIngress})},
		Chain{ChainInput, slices.Concat(head, nd, []string{established}, inPending, []string{"-j " + ChainEgress})},
	)
	return rs
}

func dropRules(cfg Config, dir string) []string {
	var out []string
	if cfg.LogDrops {
		rate := cfg.LogRate
		if rate == "" {
			rate = "10/second"
		}
		if cfg.LogGroup != 0 {
			out = append(out, fmt.Sprintf("-m limit --limit %s --limit-burst 20 -j NFLOG --nflog-prefix %q --nflog-group %d --nflog-size 128", rate, policy.DropLogPrefix+dir, cfg.LogGroup))
		} else {
			out = append(out, fmt.Sprintf("-m limit --limit %s --limit-burst 20 -j LOG --log-prefix %q", rate, policy.DropLogPrefix+dir+": "))
		}
	}
	return append(out, fmt.Sprintf("-m comment --comment %q -j DROP", "weft policy "+dir+" drop"))
}

func setName(fam family, id string) string { return hashName(fam.setPrefix(), id) }

func hashName(prefix, id string) string {
	sum := sha256.Sum256([]byte(id))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:16]
}
