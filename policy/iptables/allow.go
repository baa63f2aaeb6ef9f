package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/weftnet/weft/policy"
	"github.com/weftnet/weft/policy/tierbox"
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
	// visit calls fn for each allow of the rules that applies to this
	// family: key is a set port ("tcp:80"), or else match the iptables
	// port match of a rule of its own ("" for every port and protocol).
	visit := func(fn func(r policy.Rule, key, match string)) {
		for _, r := range rules {
			if !r.AllPeers && !relevant(fam, r.Peers, addrSets) {
				continue
			}
			if len(r.Ports) == 0 {
				fn(r, "", "")
				continue
			}
			for _, p := range r.Ports {
				if p.From == 0 || int(p.To)-int(p.From) >= maxSetRange {
					fn(r, "", portMatch(p))
					continue
				}
				for n := int(p.From); n <= int(p.To); n++ {
					fn(r, fmt.Sprintf("%s:%d", strings.ToLower(string(p.Protocol)), n), "")
				}
			}
		}
	}
	// The structure first; set contents only for sets not rendered yet
	// (another pod with the same rules shares them).
	var policies []string
	hasPorts := false
	extras := map[string]bool{} // port match -> allows every peer
	visit(func(r policy.Rule, key, match string) {
		if !slices.Contains(policies, r.Policy) {
			policies = append(policies, r.Policy)
		}
		if key != "" {
			hasPorts = true
		} else {
			extras[match] = extras[match] || r.AllPeers
		}
	})
	sig := policy.Signature(rules)
	peers := func(r policy.Rule) []tierbox.Block {
		if r.AllPeers {
			return []tierbox.Block{tierbox.AllOf(fam.v6)}
		}
		var out []tierbox.Block
		for _, id := range r.Peers {
			out = append(out, tierbox.BlockOf(fam.v6, addrSets[id]))
		}
		return out
	}
	comment := fmt.Sprintf("-m comment --comment %q", strings.Join(policies, ","))
	if len(comment) > 240 {
		comment = fmt.Sprintf("-m comment --comment %q", fmt.Sprintf("%s and %d more policies", policies[0], len(policies)-1))
	}
	var out []string
	if hasPorts {
		name := setName(fam, sig+"|ports")
		if _, done := sets[name]; !done {
			byPort := map[string][]tierbox.Block{}
			visit(func(r policy.Rule, key, _ string) {
				if key != "" {
					byPort[key] = append(byPort[key], peers(r)...)
				}
			})
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
		if extras[match] {
			out = append(out, match+comment+" -j RETURN")
			continue
		}
		name := setName(fam, sig+"|"+match)
		if _, done := sets[name]; !done {
			var blocks []tierbox.Block
			visit(func(r policy.Rule, key, m string) {
				if key == "" && m == match {
					blocks = append(blocks, peers(r)...)
				}
			})
			sets[name] = Set{Name: name, Type: "hash:net", Members: setEntries(blocks)}
		}
		out = append(out, fmt.Sprintf("-m set --match-set %s %s %s%s -j RETURN", name, dir, match, comment))
	}
	return out
}

// relevant reports whether a rule's peers can hold an address of the
// family: false when they are ipBlocks of the other one only. Pod sets
// count even when empty now: whether a rule is rendered depends on the
// policies, not on which pods exist, so pods coming and going only change
// set contents.
func relevant(fam family, ids []string, addrSets map[string]policy.AddrSet) bool {
	for _, id := range ids {
		s := addrSets[id]
		if s.Kind != policy.SetNets || slices.ContainsFunc(s.Nets, func(n netip.Prefix) bool { return fam.has(n.Addr()) }) {
			return true
		}
	}
	return false
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
