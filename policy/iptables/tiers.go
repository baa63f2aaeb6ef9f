package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/weftnet/weft/policy"
	"github.com/weftnet/weft/policy/tierbox"
)

// ClusterNetworkPolicy tiers. A pod's direction with tier rules is its
// chain: the Admin tier, whose Pass and fall-through go to the rest: for
// a pod a NetworkPolicy isolates, its allow rules and the drop; else the
// Baseline tier (whose Pass and fall-through return). The rest is a
// chain of its own (WEFT-POL-IR-*, WEFT-POL-ER-*) when the Admin tier has
// rules, so that a Pass skips the remaining Admin rules.
//
// A tier is first-match over (peer, protocol, destination port). Package
// tierbox cuts its ordered rules into disjoint boxes, each owned by the
// verdict (Accept: RETURN, Deny: the drop chain, Pass: the rest) of the
// first rule covering it, so the tier's rules are a few set lookups, in
// any order, however many rules select the pod. ipset has no port
// intervals (a port range added to a hash:net,port set becomes one entry
// per port), so tierLines splits the rules' port spans by width:
//
//   - narrow spans (single ports, ranges under maxSetRange ports) give,
//     per verdict, one hash:net,port set (peer prefix, protocol:port) of
//     the points they cover whose first-match verdict differs from what
//     the wide spans alone decide there; these rules come first;
//   - wide spans (every port of a protocol, wider ranges, rules without
//     ports) are partitioned alone: per piece of a protocol's port axis
//     and verdict one hash:net set and one rule with that port match; and
//     per verdict one hash:net set of the rules without ports for the
//     other protocols (ICMP, ...). TCP, UDP and SCTP need no exclusion
//     from those: an address in them is in a rule without ports, which
//     covers every port, so their packets were decided by the rules
//     before. When every wide span is a rule without ports (the common
//     case) all protocols share one lookup per verdict, with no port
//     match.
//
// So a tier has at most two rules per verdict when its wide spans are
// rules without ports, and otherwise two plus one per piece of the wide
// spans' port axes: its rules depend on the structure of the rules
// (the verdicts present, the bounds of wide port ranges), not on their
// number or peers; pods coming, going or relabelled change set members
// only. Sets are named after the tier's rules (actions, peer set IDs,
// ports: policy.TierSignature), so the pods and tiers with the same rules share
// them, and a tier is rendered once per Render.

// Chain prefixes of the rest of a direction after its Admin tier.
const (
	podInRestPrefix  = "WEFT-POL-IR-"
	podOutRestPrefix = "WEFT-POL-ER-"
)

// tierVerdicts are the actions in the fixed order their rules come in.
var tierVerdicts = []policy.Action{policy.Accept, policy.Deny, policy.Pass}

// tierLine is a rendered tier's rule without its target (its action's).
type tierLine struct {
	match  string
	action policy.Action
}

// tierCache holds the tiers rendered so far in one Render, by direction,
// tier and signature.
type tierCache map[string][]tierLine

// directionChains renders a pod's direction as its chain (named name)
// and, when its Admin tier passes, the chain of the rest (restName). dir
// is "src" (ingress) or "dst" (egress); drop the direction's drop chain.
func directionChains(fam family, d policy.Direction, name, restName, dir, drop string, addrSets map[string]policy.AddrSet, sets map[string]Set, tiers tierCache) []Chain {
	var rest []string
	if d.Isolated {
		rest = append(allowRules(fam, d.Rules, dir, addrSets, sets), "-j "+drop)
	} else {
		rest = tierRules(fam, "baseline", d.Baseline, dir, drop, "-j RETURN", addrSets, sets, tiers)
	}
	if len(d.Admin) == 0 {
		return []Chain{{name, rest}}
	}
	pass := "-g " + restName
	if len(rest) == 0 {
		pass = "-j RETURN"
	}
	chains := []Chain{{name, tierRules(fam, "admin", d.Admin, dir, drop, pass, addrSets, sets, tiers)}}
	if len(rest) > 0 {
		chains[0].Rules = append(chains[0].Rules, pass)
		chains = append(chains, Chain{restName, rest})
	}
	return chains
}

// tierRules renders one tier: pass is the target of its Pass verdict.
func tierRules(fam family, tier string, rules []policy.TierRule, dir, drop, pass string, addrSets map[string]policy.AddrSet, sets map[string]Set, tiers tierCache) []string {
	var kept []policy.TierRule
	for _, r := range rules {
		if r.AllPeers || relevant(fam, r.Peers, addrSets) {
			kept = append(kept, r)
		}
	}
	if len(kept) == 0 {
		return nil
	}
	sig := policy.TierSignature(kept)
	key := dir + "|" + tier + "|" + sig
	lines, ok := tiers[key]
	if !ok {
		lines = tierLines(fam, tier, sig, kept, dir, addrSets, sets)
		tiers[key] = lines
	}
	targets := map[policy.Action]string{policy.Accept: "-j RETURN", policy.Deny: "-j " + drop, policy.Pass: pass}
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.match + targets[l.action]
	}
	return out
}

// tierLines renders a tier's rules (relevant to the family) as lines
// and the sets they match (added to sets unless there already).
func tierLines(fam family, tier, sig string, rules []policy.TierRule, dir string, addrSets map[string]policy.AddrSet, sets map[string]Set) []tierLine {
	spans, other := tierbox.TierSpans(fam.v6, rules, addrSets)
	has := func(ss []tierbox.TierSpan, a policy.Action) bool {
		return slices.ContainsFunc(ss, func(s tierbox.TierSpan) bool { return s.Verdict == string(a) })
	}
	wide := slices.DeleteFunc(slices.Clone(spans), narrow)
	comment := func(a policy.Action, what string) string {
		return fmt.Sprintf("-m comment --comment %q ", tier+" "+strings.ToLower(string(a))+" "+what)
	}
	set := func(id, typ string, members func() []string) string {
		name := setName(fam, "tier|"+sig+"|"+id)
		if _, done := sets[name]; !done {
			sets[name] = Set{Name: name, Type: typ, Members: members()}
		}
		return name
	}
	// cut cuts spans' port axes into pieces, each with the spans covering it.
	cut := func(ss []tierbox.TierSpan) []tierbox.Box[[]tierbox.TierSpan] {
		return tierbox.CutPorts(ss, spanBounds, func(c []tierbox.TierSpan) []tierbox.TierSpan { return c },
			func(c []tierbox.TierSpan) bool { return len(c) == 0 }, noEqual)
	}
	var lines []tierLine

	// Narrow points whose verdict the wide pieces do not give, port by
	// port: the pieces of all spans that a narrow span covers.
	var points []tierbox.Box[[]tierbox.TierSpan]
	for _, b := range cut(spans) {
		if slices.ContainsFunc(b.V, narrow) {
			points = append(points, b)
		}
	}
	exact := make([]map[string][]tierbox.Range, len(points)) // per point: verdict -> ranges
	for i, b := range points {
		all, wideHere := tierbox.FirstClaims(b.V), tierbox.FirstClaims(slices.DeleteFunc(slices.Clone(b.V), narrow))
		exact[i] = map[string][]tierbox.Range{}
		for v, rs := range all {
			exact[i][v] = tierbox.Subtract(rs, wideHere[v])
		}
	}
	for _, a := range tierVerdicts {
		if !slices.ContainsFunc(points, func(b tierbox.Box[[]tierbox.TierSpan]) bool { return has(b.V, a) }) {
			continue
		}
		name := set("ports|"+string(a), "hash:net,port", func() []string {
			var members []string
			for i, b := range points {
				for _, p := range prefixes(exact[i][string(a)]) {
					members = append(members, p+","+b.Proto+":"+b.Ports())
				}
			}
			return members
		})
		lines = append(lines, tierLine{fmt.Sprintf("-m set --match-set %s %s,dst %s", name, dir, comment(a, "ports")), a})
	}

	// lookups adds, per verdict present in spans, the hash:net set of the
	// addresses its first matches claim (named id|verdict) and its rule,
	// after the port match match.
	lookups := func(spans []tierbox.TierSpan, id, match, what string) {
		claims := tierbox.FirstClaims(spans)
		for _, a := range tierVerdicts {
			if has(spans, a) {
				name := set(id+"|"+string(a), "hash:net", func() []string { return prefixes(claims[string(a)]) })
				lines = append(lines, tierLine{fmt.Sprintf("%s-m set --match-set %s %s %s", match, name, dir, comment(a, what)), a})
			}
		}
	}

	// Wide pieces: one lookup per verdict for every protocol when only
	// rules without ports are wide, else per protocol and piece.
	if uniform(wide, other) {
		lookups(other, "any", "", "any")
		return lines
	}
	for _, b := range cut(wide) {
		lookups(b.V, "wide|"+b.Proto+":"+b.Ports(), piecePortMatch(b.Proto, b.From, b.To), b.Proto+" "+b.Ports())
	}
	if len(other) > 0 {
		// The other protocols meet the sets of the rules without ports.
		// TCP, UDP and SCTP need no exclusion: an address in these sets is
		// in a rule without ports, which covers each of their ports, so
		// their packets from it were decided above.
		lookups(other, "other", "", "other protocols")
	}
	return lines
}

// narrow reports whether a span's ports go into a hash:net,port set port
// by port.
func narrow(s tierbox.TierSpan) bool { return s.To-s.From < maxSetRange }

func spanBounds(s tierbox.TierSpan) (string, int, int) { return s.Proto, s.From, s.To }

// noEqual keeps neighbouring pieces apart: their covering spans differ
// anyway (pieces are cut where a span starts or ends).
func noEqual(a, b []tierbox.TierSpan) bool { return false }

// uniform reports whether the wide spans are all from rules without
// ports (other): then TCP, UDP and SCTP, on every port, and the other
// protocols have the same first-match verdicts, and one lookup per
// verdict decides them all.
func uniform(wide, other []tierbox.TierSpan) bool {
	for _, proto := range tierbox.PortProtocols {
		var rules []int
		for _, s := range wide {
			if s.Proto == proto {
				if s.From != 0 || s.To != 65535 {
					return false
				}
				rules = append(rules, s.Rule)
			}
		}
		if len(rules) != len(other) {
			return false
		}
		for i, s := range other {
			if rules[i] != s.Rule {
				return false
			}
		}
	}
	return true
}

// piecePortMatch is the iptables match of a protocol's port range.
func piecePortMatch(proto string, from, to int) string {
	switch {
	case from == 0 && to == 65535:
		return "-p " + proto + " "
	case from == to:
		return fmt.Sprintf("-p %s -m %s --dport %d ", proto, proto, from)
	default:
		return fmt.Sprintf("-p %s -m %s --dport %d:%d ", proto, proto, from, to)
	}
}

// prefixes writes address ranges as the prefixes of ipset's hash:net
// types, which lack /0: that is written as its two halves.
func prefixes(rs []tierbox.Range) []string {
	var out []string
	for _, r := range rs {
		for _, p := range tierbox.Prefixes(r) {
			if p.Bits() == 0 {
				out = append(out, netip.PrefixFrom(p.Addr(), 1).String(), netip.PrefixFrom(tierbox.PrefixRange(p).Hi, 1).Masked().String())
				continue
			}
			out = append(out, p.String())
		}
	}
	return out
}
