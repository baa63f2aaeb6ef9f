package iptables

import (
	"fmt"

	"github.com/weftnet/weft/policy/readyset"
)

// Default deny of new pods. A pod's address is programmed once the agent
// has applied the chains that cover it (its own, and its place in other
// pods' peer sets); until then its policies are not in force. With
// Config.PodBridges set, WEFT-POL-PENDING drops unicast traffic forwarded
// onto a pod bridge to an address that is not in the family's ready set
// (policy/readyset), and traffic from a pod's bridge port (PodPorts) whose
// source is not in it: a new pod neither receives nor sends until the
// agent marks its address ready, which it does only after the chains are
// in place. The CNI plugin takes an address it hands out anew out of the
// ready set, so a reused address is not ready for its previous pod's
// rules. IPv6 link-local traffic passes, as it does the pod chains.
//
// In WEFT-POL-FORWARD the check comes before the shortcut for established
// flows (a reused address could still have conntrack entries of its
// previous pod); in WEFT-POL-INPUT after it, so that a pending pod still
// answers the node (kubelet probes: the node's own packets take OUTPUT,
// which no policy chain hooks, and the pod's replies are established).

// ChainPending is the chain holding new pods' traffic until their address
// is ready.
const ChainPending = "WEFT-POL-PENDING"

// readySetName is the family's ready set.
func (f family) readySetName() string {
	if f.v6 {
		return readyset.Name6
	}
	return readyset.Name4
}

// pendingChain renders WEFT-POL-PENDING and the ready set it matches,
// which the backend creates but never fills (the agent does).
func pendingChain(fam family, cfg Config) (Chain, Set) {
	ready := fam.readySetName()
	var rules []string
	if fam.v6 {
		rules = append(rules, "-s fe80::/10 -j RETURN", "-d fe80::/10 -j RETURN", "-s ::/128 -j RETURN")
	}
	for _, br := range cfg.PodBridges {
		rules = append(rules, fmt.Sprintf("-o %s -m set ! --match-set %s dst -m addrtype --dst-type UNICAST -m comment --comment %q -j DROP",
			br, ready, "weft: pod policy not programmed yet"))
	}
	if cfg.PodPorts != "" {
		rules = append(rules, fmt.Sprintf("-m physdev --physdev-in %s -m set ! --match-set %s src -m comment --comment %q -j DROP",
			cfg.PodPorts, ready, "weft: pod policy not programmed yet"))
	}
	return Chain{ChainPending, rules}, Set{Name: ready, Type: "hash:ip"}
}
