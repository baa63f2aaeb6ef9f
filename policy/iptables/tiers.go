package iptables

import (
	"fmt"
	"strings"

	"github.com/weftnet/weft/policy"
)

// ClusterNetworkPolicy tiers. A pod's direction with tier rules is its
// chain: the Admin tier's rules in precedence order (Accept returns, Deny
// goes to the drop chain, Pass goes to the rest chain), then the rest:
// for a pod a NetworkPolicy isolates, its allow rules and the drop; else
// the Baseline tier's rules (Pass returns). The rest is a chain of its
// own (WEFT-POL-IR-*, WEFT-POL-ER-*) when the Admin tier has rules, so
// that a Pass skips the remaining Admin rules. Each tier rule is one
// iptables rule per port match, its peers one hash:net set (shared by
// every rule with the same peers): the cost of a new connection grows
// with the tier rules that select its pod, unlike the nftables backend's
// (docs/architecture.md).

// Chain prefixes of the rest of a direction after its Admin tier.
const (
	podInRestPrefix  = "WEFT-POL-IR-"
	podOutRestPrefix = "WEFT-POL-ER-"
)

// directionChains renders a pod's direction as its chain (named name)
// and, when its Admin tier passes, the chain of the rest (restName). dir
// is "src" (ingress) or "dst" (egress); drop the direction's drop chain.
func directionChains(fam family, d policy.Direction, name, restName, dir, drop string, addrSets map[string]policy.AddrSet, sets map[string]Set) []Chain {
	var rest []string
	if d.Isolated {
		rest = append(allowRules(fam, d.Rules, dir, addrSets, sets), "-j "+drop)
	} else {
		rest = tierRules(fam, d.Baseline, dir, drop, "-j RETURN", addrSets, sets)
	}
	if len(d.Admin) == 0 {
		return []Chain{{name, rest}}
	}
	pass := "-g " + restName
	if len(rest) == 0 {
		pass = "-j RETURN"
	}
	chains := []Chain{{name, tierRules(fam, d.Admin, dir, drop, pass, addrSets, sets)}}
	if len(rest) > 0 {
		chains[0].Rules = append(chains[0].Rules, pass)
		chains = append(chains, Chain{restName, rest})
	}
	return chains
}

// tierRules renders one tier's rules in order; pass is the target of its
// Pass rules.
func tierRules(fam family, rules []policy.TierRule, dir, drop, pass string, addrSets map[string]policy.AddrSet, sets map[string]Set) []string {
	targets := map[policy.Action]string{policy.Accept: "-j RETURN", policy.Deny: "-j " + drop, policy.Pass: pass}
	var out []string
	for _, r := range rules {
		peers := ""
		if !r.AllPeers {
			if !relevant(fam, r.Peers, addrSets) {
				continue
			}
			name := setName(fam, "tier|"+strings.Join(r.Peers, "+"))
			if _, done := sets[name]; !done {
				var blocks []peerBlock
				for _, id := range r.Peers {
					blocks = append(blocks, blockOf(fam, addrSets[id]))
				}
				sets[name] = Set{Name: name, Type: "hash:net", Members: setEntries(blocks)}
			}
			peers = fmt.Sprintf("-m set --match-set %s %s ", name, dir)
		}
		text := r.Policy + " " + r.Rule
		if len(text) > 200 {
			text = text[:200]
		}
		comment := fmt.Sprintf("-m comment --comment %q", text)
		if len(r.Ports) == 0 {
			out = append(out, peers+comment+" "+targets[r.Action])
			continue
		}
		for _, p := range r.Ports {
			out = append(out, portMatch(p)+peers+comment+" "+targets[r.Action])
		}
	}
	return out
}
