package policy

import (
	"fmt"
	"net/netip"
	"slices"
)

// Allows evaluates the compiled rules for one new connection from src to
// dst:port/proto, as the backends enforce them: the source pod's egress
// rules, then the destination pod's ingress rules. Traffic of a pod to its
// own address never leaves the pod and is allowed.
func (d Desired) Allows(src, dst netip.Addr, proto Protocol, port uint16) bool {
	return d.Explain(src, dst, proto, port).Allowed
}

// Explanation is the verdict of the compiled rules on one new connection
// and what decided it in each direction.
type Explanation struct {
	Allowed bool
	// Egress is the source pod's decision, Ingress the destination pod's;
	// nil where the address is no pod of this state, or the connection
	// stays inside the pod. When egress denies, ingress is not evaluated.
	Egress, Ingress *Decision
}

// Decision is one direction's verdict and where it came from.
type Decision struct {
	Pod     string // namespace/name
	Allowed bool
	// Tier decided: Admin or Baseline (a ClusterNetworkPolicy rule, named
	// by Policy, Priority and Rule, whose Action is Accept or Deny, or
	// Pass in the Baseline tier), NetworkPolicy (the pod is isolated:
	// Policy is a policy that allows; when none does, Policies select the
	// pod), or Default (no policy decided: allowed).
	Tier     Tier
	Policy   string
	Priority int32
	Rule     string
	Action   Action
	// Policies are the NetworkPolicies selecting the pod, Cluster the
	// ClusterNetworkPolicies with rules for this direction of it (Admin,
	// then Baseline, in precedence order).
	Policies []string
	Cluster  []string
	// Passed are the rules with action Pass that sent the decision on
	// from an earlier tier.
	Passed []TierRule
}

func (x Decision) String() string {
	verdict := "denied"
	if x.Allowed {
		verdict = "allowed"
	}
	switch x.Tier {
	case TierAdmin, TierBaseline:
		return fmt.Sprintf("%s by %s ClusterNetworkPolicy %s (priority %d) rule %s: %s", verdict, x.Tier, x.Policy, x.Priority, x.Rule, x.Action)
	case TierNetworkPolicy:
		if x.Allowed {
			return fmt.Sprintf("allowed by NetworkPolicy %s", x.Policy)
		}
		return fmt.Sprintf("denied: isolated by NetworkPolicies %v, none allows", x.Policies)
	default:
		return verdict + ": no policy decides"
	}
}

// Explain evaluates the compiled rules for one new connection, as Allows,
// saying what decided.
func (d Desired) Explain(src, dst netip.Addr, proto Protocol, port uint16) Explanation {
	s, t := d.pod(src), d.pod(dst)
	x := Explanation{Allowed: true}
	if s != nil && s == t {
		return x
	}
	if s != nil {
		e := d.decide(s.Key, s.Egress, s.Policies, dst, proto, port)
		x.Egress, x.Allowed = &e, e.Allowed
		if !e.Allowed {
			return x
		}
	}
	if t != nil {
		i := d.decide(t.Key, t.Ingress, t.Policies, src, proto, port)
		x.Ingress, x.Allowed = &i, i.Allowed
	}
	return x
}

// decide walks one direction's tiers for a packet whose peer is peer.
func (d Desired) decide(pod string, dir Direction, policies []string, peer netip.Addr, proto Protocol, port uint16) Decision {
	x := Decision{Pod: pod, Policies: policies}
	for _, r := range slices.Concat(dir.Admin, dir.Baseline) {
		if !slices.Contains(x.Cluster, r.Policy) {
			x.Cluster = append(x.Cluster, r.Policy)
		}
	}
	if r, ok := d.firstMatch(dir.Admin, peer, proto, port); ok {
		if r.Action != Pass {
			return d.tierDecision(x, TierAdmin, r)
		}
		x.Passed = append(x.Passed, r)
	}
	if dir.Isolated {
		x.Tier = TierNetworkPolicy
		for _, r := range dir.Rules {
			if d.matches(r.AllPeers, r.Peers, r.Ports, peer, proto, port) {
				x.Allowed, x.Policy = true, r.Policy
				return x
			}
		}
		return x
	}
	if r, ok := d.firstMatch(dir.Baseline, peer, proto, port); ok {
		return d.tierDecision(x, TierBaseline, r)
	}
	x.Allowed, x.Tier = true, TierDefault
	return x
}

func (d Desired) tierDecision(x Decision, tier Tier, r TierRule) Decision {
	x.Tier, x.Policy, x.Priority, x.Rule, x.Action = tier, r.Policy, r.Priority, r.Rule, r.Action
	x.Allowed = r.Action != Deny
	return x
}

// firstMatch returns the first of rules that matches the packet.
func (d Desired) firstMatch(rules []TierRule, peer netip.Addr, proto Protocol, port uint16) (TierRule, bool) {
	for _, r := range rules {
		if d.matches(r.AllPeers, r.Peers, r.Ports, peer, proto, port) {
			return r, true
		}
	}
	return TierRule{}, false
}

func (d Desired) pod(ip netip.Addr) *PodRules {
	for i := range d.Pods {
		for _, a := range d.Pods[i].IPs {
			if a == ip {
				return &d.Pods[i]
			}
		}
	}
	return nil
}

// matches reports whether a rule's peers and ports match the packet.
func (d Desired) matches(allPeers bool, peers []string, ports []PortRange, peer netip.Addr, proto Protocol, port uint16) bool {
	if len(ports) > 0 {
		ok := false
		for _, p := range ports {
			ok = ok || p.Matches(proto, port)
		}
		if !ok {
			return false
		}
	}
	if allPeers {
		return true
	}
	for _, id := range peers {
		if d.Sets[id].Contains(peer) {
			return true
		}
	}
	return false
}
