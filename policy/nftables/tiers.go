package nftables

import (
	"fmt"
	"slices"
	"strings"

	"github.com/weftnet/weft/policy"
	"github.com/weftnet/weft/policy/tierbox"
)

// ClusterNetworkPolicy tiers. A direction with tier rules is a chain of
// its Admin tier, whose Pass and fall-through go to the rest (the
// NetworkPolicy part, as renderGroup writes it for an isolated pod, or
// else the Baseline tier). A tier is first-match over (peer, protocol,
// port); tierbox.TierBoxes turns its ordered rules into disjoint boxes,
// each the property of one verdict, so a tier is one interval set per
// verdict and kind (ports: TCP, UDP and SCTP by destination port; other:
// the remaining protocols, which only rules without ports match), looked
// up in any order: a new connection costs at most six lookups per tier
// and family, whatever the number of policies and rules. Like a group's
// other sets, which sets and rules exist depends on the rules' structure
// only; pods coming, going or relabelled change elements. A tier's sets
// are named after its rules, shared by every group with that tier.

// renderDirection renders a direction's group: renderGroup's for a
// direction without tier rules, else the tier chains.
func renderDirection(name, peer, drop string, dir policy.Direction, addrSets map[string]policy.AddrSet) *group {
	if len(dir.Admin) == 0 && len(dir.Baseline) == 0 {
		return renderGroup(name, peer, drop, dir.Rules, addrSets)
	}
	rest := name
	if len(dir.Admin) > 0 {
		rest = name + "-rest"
	}
	var r *group
	if dir.Isolated {
		r = renderGroup(rest, peer, drop, dir.Rules, addrSets)
	} else {
		r = &group{chain: rest}
		r.rules, r.sets = tierRules(peer, drop, "return", dir.Baseline, addrSets)
	}
	if len(dir.Admin) == 0 {
		return r
	}
	pass := "goto " + rest
	if len(r.rules) == 0 {
		pass = "return"
	}
	g := &group{chain: name}
	g.rules, g.sets = tierRules(peer, drop, pass, dir.Admin, addrSets)
	g.rules = append(g.rules, pass)
	if len(r.rules) > 0 {
		g.extra = append(g.extra, Chain{Name: rest, Rules: r.rules})
		g.sets = append(g.sets, r.sets...)
	}
	return g
}

// tierRules renders one tier's rules as sets and the rules that look
// them up: Accept returns (this table lets the packet go), Deny goes to
// drop, Pass does pass. The sets are named after the tier's rules
// (policy.TierSignature), not after the group: the groups with the same
// tier share them (Render writes each once), and a group renamed by a
// change elsewhere in its direction (a NetworkPolicy edited) keeps them.
func tierRules(peer, drop, pass string, rules []policy.TierRule, addrSets map[string]policy.AddrSet) ([]string, []Set) {
	prefix := "tier-" + hashName(policy.TierSignature(rules))
	verdicts := map[policy.Action]string{policy.Accept: "return", policy.Deny: "goto " + drop, policy.Pass: pass}
	names := map[policy.Action]string{policy.Accept: "accept", policy.Deny: "deny", policy.Pass: "pass"}
	var out []string
	var sets []Set
	for _, v6 := range []bool{false, true} {
		ip, typ, fam := "ip", "ipv4_addr", "4"
		if v6 {
			ip, typ, fam = "ip6", "ipv6_addr", "6"
		}
		spans, other := tierbox.TierSpans(v6, rules, addrSets)
		// The sets the rules' structure calls for, in a fixed order.
		boxes, otherClaims := tierbox.TierBoxes(spans), tierbox.FirstClaims(other)
		for _, a := range []policy.Action{policy.Accept, policy.Deny, policy.Pass} {
			if slices.ContainsFunc(spans, func(s tierbox.TierSpan) bool { return s.Verdict == string(a) }) {
				s := Set{Name: fmt.Sprintf("%s-%s-ports%s", prefix, names[a], fam), Type: typ + " . inet_proto . inet_service", Interval: true}
				for _, b := range boxes {
					for _, r := range b.V[string(a)] {
						s.Elements = append(s.Elements, Element{Key: []string{r.String(), b.Proto, b.Ports()}})
					}
				}
				sets = append(sets, s)
				out = append(out, fmt.Sprintf("%s %s . meta l4proto . th dport @%s %s", ip, peer, s.Name, verdicts[a]))
			}
			if slices.ContainsFunc(other, func(s tierbox.TierSpan) bool { return s.Verdict == string(a) }) {
				s := Set{Name: fmt.Sprintf("%s-%s-other%s", prefix, names[a], fam), Type: typ, Interval: true}
				for _, r := range otherClaims[string(a)] {
					s.Elements = append(s.Elements, Element{Key: []string{r.String()}})
				}
				sets = append(sets, s)
				out = append(out, fmt.Sprintf("meta l4proto != { %s } %s %s @%s %s", strings.Join(tierbox.PortProtocols, ", "), ip, peer, s.Name, verdicts[a]))
			}
		}
	}
	return out, sets
}
