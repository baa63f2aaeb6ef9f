package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/weftnet/weft/policy"
)

// maxSetRange is the widest port range written into a pod's (peer, port)
// set port by port; a wider range, and a protocol without a port, gets a
// rule of its own instead.
const maxSetRange = 32

// allowRules renders one direction of a pod's allow rules so that a new
// connection costs one set lookup whatever the number of policies and
// ports: every (peer, single port or narrow range) the rules allow goes
// into one hash:net,port set, matched on (peer address, destination port);
// what that set cannot hold (every port of a protocol, wide ranges, rules
// without ports) gets one rule per distinct port match, over one hash:net
// set of the union of its peers. Sets are named after the rules' structure
// (peer set IDs and ports, not their members), so pods with the same
// policies share them, a membership change swaps their contents in place,
// and a policy edit (new set IDs) switches to fresh sets atomically with
// the chain. dir is "src" (ingress: the peer sends) or "dst" (egress).
func allowRules(fam family, rules []policy.Rule, dir string, addrSets map[string]policy.AddrSet, sets map[string]Set) []string {
	sig := signature(rules)
	byPort := map[string][]peerBlock{} // "tcp:80" -> peers
	hasPorts := false
	type extra struct {
		all   bool
		peers []peerBlock
	}
	extras := map[string]*extra{} // port match ("" for all) -> peers
	addExtra := func(match string, all bool, peers []peerBlock) {
		e, ok := extras[match]
		if !ok {
			e = &extra{}
			extras[match] = e
		}
		e.all = e.all || all
		e.peers = append(e.peers, peers...)
	}
	var policies []string
	for _, r := range rules {
		peers := []peerBlock{{nets: []netip.Prefix{fam.all()}}}
		if !r.AllPeers {
			var ok bool
			if peers, ok = peerBlocks(fam, r.Peers, addrSets); !ok {
				continue
			}
		}
		if !slices.Contains(policies, r.Policy) {
			policies = append(policies, r.Policy)
		}
		if len(r.Ports) == 0 {
			addExtra("", r.AllPeers, peers)
			continue
		}
		for _, p := range r.Ports {
			if p.From == 0 || int(p.To)-int(p.From) >= maxSetRange {
				addExtra(portMatch(p), r.AllPeers, peers)
				continue
			}
			hasPorts = true
			for n := int(p.From); n <= int(p.To); n++ {
				k := fmt.Sprintf("%s:%d", strings.ToLower(string(p.Protocol)), n)
				byPort[k] = append(byPort[k], peers...)
			}
		}
	}
	comment := fmt.Sprintf("-m comment --comment %q", strings.Join(policies, ","))
	if len(comment) > 240 {
		comment = fmt.Sprintf("-m comment --comment %q", fmt.Sprintf("%s and %d more policies", policies[0], len(policies)-1))
	}
	var out []string
	if hasPorts {
		name := setName(fam, sig+"|ports")
		if _, done := sets[name]; !done {
			s := Set{Name: name, Type: "hash:net,port"}
			for _, k := range sortedKeys(byPort) {
				for _, e := range setEntries(byPort[k]) {
					p, nomatch, _ := strings.Cut(e, " ")
					s.Members = append(s.Members, strings.TrimSpace(p+","+k+" "+nomatch))
				}
			}
			sets[name] = s
		}
		out = append(out, fmt.Sprintf("-m set --match-set %s %s,dst %s -j RETURN", name, dir, comment))
	}
	for _, match := range sortedKeys(extras) {
		e := extras[match]
		if e.all {
			out = append(out, match+comment+" -j RETURN")
			continue
		}
		name := setName(fam, sig+"|"+match)
		if _, done := sets[name]; !done {
			s := Set{Name: name, Type: "hash:net"}
			s.Members = setEntries(e.peers)
			sets[name] = s
		}
		out = append(out, fmt.Sprintf("-m set --match-set %s %s %s%s -j RETURN", name, dir, match, comment))
	}
	return out
}

// peerBlocks is the union of a rule's peer sets in the family; false when
// none of them can ever hold an address of the family (ipBlocks of the
// other one), so that the rule has no place in this family's ruleset.
// Pod sets count even when empty now: whether a rule is rendered depends
// on the policies, not on which pods exist, so pods coming and going only
// change set contents.
func peerBlocks(fam family, ids []string, addrSets map[string]policy.AddrSet) ([]peerBlock, bool) {
	var out []peerBlock
	relevant := false
	for _, id := range ids {
		s := addrSets[id]
		if s.Kind == policy.SetNets && !slices.ContainsFunc(s.Nets, func(n netip.Prefix) bool { return fam.has(n.Addr()) }) {
			continue
		}
		relevant = true
		out = append(out, blockOf(fam, s))
	}
	return out, relevant
}

// signature identifies a direction's rules by their structure: the peer
// set IDs (which carry the policy's fingerprint) and the ports.
func signature(rules []policy.Rule) string {
	var parts []string
	for _, r := range rules {
		peers := "all"
		if !r.AllPeers {
			peers = strings.Join(r.Peers, "+")
		}
		parts = append(parts, fmt.Sprintf("%s%v", peers, r.Ports))
	}
	sort.Strings(parts)
	return strings.Join(slices.Compact(parts), ";")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// portMatch is the iptables match of a port range (of a protocol when the
// range is every port).
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
