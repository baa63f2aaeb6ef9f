package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Source checking. A pod could send packets with another pod's address
// (raw sockets are allowed by default in most runtimes) and be admitted by
// the policies admitting that pod. When Config.PodPorts names the bridge
// ports of pods (an iptables interface pattern such as "weft+"), every
// packet entering the node from such a port goes first through
// WEFT-POL-SOURCE, which lets it on only from the port of the pod that
// owns its source address (Config.Sources); IPv6 link-local and
// unspecified sources pass for neighbour discovery. A port with no entry
// sends nothing: fail closed.
//
// One rule per pod attachment, matched in turn: ipset's hash:net,iface
// type could hold (address, bridge port) pairs, but the iptables set
// match cannot ask it to look at the bridge port (the kernel does so only
// for lookups carrying a flag that no option of the match sets). A node has a bounded number of
// pods (110 by default), so the chain stays short.

// ChainSource is the chain checking the source address of pod traffic.
const ChainSource = "WEFT-POL-SOURCE"

// Source is one pod attachment: its bridge port and its addresses.
type Source struct {
	Port  string
	Addrs []netip.Addr
}

// sourceChain renders WEFT-POL-SOURCE and the jump into it.
func sourceChain(fam family, cfg Config) (Chain, string) {
	var rules []string
	if fam.v6 {
		rules = append(rules, "-s fe80::/10 -j RETURN", "-s ::/128 -j RETURN")
	}
	srcs := slices.Clone(cfg.Sources)
	slices.SortFunc(srcs, func(a, b Source) int { return strings.Compare(a.Port, b.Port) })
	for _, s := range srcs {
		for _, a := range fam.only(s.Addrs) {
			rules = append(rules, fmt.Sprintf("-s %s -m physdev --physdev-in %s -j RETURN", fam.host(a.Unmap()), s.Port))
		}
	}
	rules = append(rules, `-m comment --comment "weft: pod source address not its own" -j DROP`)
	jump := fmt.Sprintf("-m physdev --physdev-in %s -j %s", cfg.PodPorts, ChainSource)
	return Chain{ChainSource, rules}, jump
}
