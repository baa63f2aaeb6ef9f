package policy

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Input is the cluster state the compiler reads.
type Input struct {
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	Policies   []*networkingv1.NetworkPolicy
	// ClusterPolicies are the ClusterNetworkPolicies (both tiers); Nodes
	// are what their nodes peers select.
	ClusterPolicies []*cnpv1beta1.ClusterNetworkPolicy
	Nodes           []*corev1.Node
}

// Desired is the compiled state: the rules of every pod that some policy
// isolates or some ClusterNetworkPolicy selects, and the address sets
// those rules refer to.
type Desired struct {
	// Pods holds one entry per pod with a policy, sorted by key.
	Pods []PodRules
	// Sets are the address sets, by ID (stable across compiles for the same
	// policy rule, so a backend can update one in place).
	Sets map[string]AddrSet
	// Errors are the rejected policies; their pods stay isolated. A
	// ClusterNetworkPolicy's errors name it without a namespace; its bad
	// rules fail closed (an Accept matches nothing, a Deny or Pass denies
	// everything).
	Errors []*FieldError
}

// PodRules are one pod's isolation and allow rules.
type PodRules struct {
	Key      string // namespace/name
	Node     string
	IPs      []netip.Addr
	Ingress  Direction
	Egress   Direction
	Policies []string // keys of the policies selecting the pod
}

// Direction is the policy of one direction of a pod, in the order the
// tiers are evaluated: the Admin tier's ClusterNetworkPolicy rules, first
// match decides (Accept, Deny, or Pass to the next tier); then, when
// Isolated by a NetworkPolicy, a packet is allowed only if one of Rules
// allows it (the NetworkPolicy tier always decides for the pods it
// isolates); then the Baseline tier's rules, first match decides (Pass:
// allowed); then allowed.
type Direction struct {
	Admin    []TierRule
	Isolated bool
	Rules    []Rule
	Baseline []TierRule
}

// Empty reports whether d allows everything without looking at a rule.
func (d Direction) Empty() bool {
	return !d.Isolated && len(d.Admin) == 0 && len(d.Baseline) == 0
}

// DropLogPrefix, then the direction (ingress, egress), is the prefix the
// backends give the drops they log.
const DropLogPrefix = "weft-policy-drop "

// Tier is a ClusterNetworkPolicy tier.
type Tier string

// The tiers, and the names of the decisions taken outside them.
const (
	TierAdmin    Tier = "Admin"
	TierBaseline Tier = "Baseline"
	// TierNetworkPolicy is the NetworkPolicy tier's decision.
	TierNetworkPolicy Tier = "NetworkPolicy"
	// TierDefault is no tier's decision: allowed.
	TierDefault Tier = "Default"
)

// Action is what a ClusterNetworkPolicy rule does with what it matches.
type Action string

// The actions.
const (
	Accept Action = "Accept"
	Deny   Action = "Deny"
	Pass   Action = "Pass"
)

// TierRule is one ClusterNetworkPolicy rule as it applies to one pod's
// direction: it matches packets whose peer is in one of Peers (any peer
// when AllPeers) and whose destination port matches one of Ports (any
// port and protocol when Ports is empty).
type TierRule struct {
	Policy   string // the ClusterNetworkPolicy's name
	Priority int32
	// Rule names the rule: its name, or its place ("ingress[2]").
	Rule     string
	Action   Action
	AllPeers bool
	Peers    []string // set IDs
	Ports    []PortRange
}

// Rule allows packets whose peer is in one of the Peers sets (any peer when
// AllPeers) and whose destination port matches one of Ports (any port and
// protocol when Ports is empty).
type Rule struct {
	Policy   string // key of the policy the rule comes from
	AllPeers bool
	Peers    []string // set IDs
	Ports    []PortRange
}

// Protocol is a transport protocol a policy port names.
type Protocol string

// The protocols NetworkPolicy supports.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// PortRange is a protocol and an inclusive destination port range; From 0
// means every port of the protocol.
type PortRange struct {
	Protocol Protocol
	From, To uint16
}

// Matches reports whether the range covers port/proto.
func (r PortRange) Matches(proto Protocol, port uint16) bool {
	if r.Protocol != proto {
		return false
	}
	return r.From == 0 || (port >= r.From && port <= r.To)
}

// SetKind says how a set matches addresses.
type SetKind string

// Set kinds.
const (
	// SetAddrs holds single addresses (pods).
	SetAddrs SetKind = "addrs"
	// SetNets holds one ipBlock: a CIDR minus its exceptions.
	SetNets SetKind = "nets"
)

// AddrSet is a set of addresses. An address is in a SetNets set when it is
// in Nets and in none of Except.
type AddrSet struct {
	Kind   SetKind
	Addrs  []netip.Addr
	Nets   []netip.Prefix
	Except []netip.Prefix
}

// Contains reports whether ip is in the set.
func (s AddrSet) Contains(ip netip.Addr) bool {
	switch s.Kind {
	case SetAddrs:
		for _, a := range s.Addrs {
			if a == ip {
				return true
			}
		}
		return false
	default:
		in := false
		for _, n := range s.Nets {
			if n.Contains(ip) {
				in = true
			}
		}
		for _, e := range s.Except {
			if e.Contains(ip) {
				return false
			}
		}
		return in
	}
}
