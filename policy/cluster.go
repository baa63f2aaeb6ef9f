package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	cnp "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// ClusterNetworkPolicies (policy.networking.k8s.io) compile to TierRules
// in the directions of the pods their subject selects, in precedence
// order: by priority (lower first), then by name (the API leaves equal
// priorities to the implementation: weft's order is stable), then in the
// order the rules are written. A rule's peers become address sets as a
// NetworkPolicy's do; its protocols become port ranges, named ports
// resolved against the destination pod (the subject for ingress, the peer
// pods for egress, one rule per port number).
//
// Bad input fails closed, rule by rule, as the API asks: a rule that
// cannot be read (an unknown action, a peer with no or several kinds, a
// bad selector, CIDR or port) matches nothing when it accepts and
// everything when it denies or passes. domainNames peers are not
// supported: they match nothing (the API allows them in Accept rules
// only). A policy whose tier, priority or subject cannot be read fails
// closed in every rule, and a subject that cannot be read selects every
// pod.

// ClusterKind names ClusterNetworkPolicies in FieldErrors.
const ClusterKind = "ClusterNetworkPolicy"

// clusterPolicies adds every ClusterNetworkPolicy's rules to the pods it
// selects.
func (c *compiler) clusterPolicies(pols []*cnp.ClusterNetworkPolicy) {
	pols = slices.Clone(pols)
	slices.SortFunc(pols, func(a, b *cnp.ClusterNetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Spec.Priority, b.Spec.Priority), cmp.Compare(a.Name, b.Name))
	})
	for _, p := range pols {
		c.clusterPolicy(p)
	}
}

// tierRuleTemplate is one ClusterNetworkPolicy rule with its peers
// resolved; ingress named ports are resolved per subject pod.
type tierRuleTemplate struct {
	rule    TierRule
	named   []string // ingress: named ports, each of any protocol
	matches bool     // false: the rule matches nothing
	egress  []TierRule
}

func (c *compiler) clusterPolicy(p *cnp.ClusterNetworkPolicy) {
	v := validator{kind: ClusterKind, key: p.Name}
	var tier Tier
	switch p.Spec.Tier {
	case cnp.AdminTier:
		tier = TierAdmin
	case cnp.BaselineTier:
		tier = TierBaseline
	default:
		// Which tier cannot be told: Admin, where a deny cannot be
		// overridden by a NetworkPolicy.
		v.add("spec.tier", fmt.Errorf("unknown tier %q (want Admin or Baseline)", p.Spec.Tier))
		tier = TierAdmin
	}
	if p.Spec.Priority < 0 || p.Spec.Priority > 1000 {
		v.add("spec.priority", fmt.Errorf("%d is out of 0 to 1000", p.Spec.Priority))
	}
	subjects := c.subjects(&v, p.Spec.Subject)
	broken := len(v.errs) > 0
	base := fmt.Sprintf("cnp:%s@%s", p.Name, specHash(p.Spec))
	var in, eg []tierRuleTemplate
	for i, r := range p.Spec.Ingress {
		field := fmt.Sprintf("spec.ingress[%d]", i)
		peers := make([]cnp.ClusterNetworkPolicyEgressPeer, len(r.From))
		for j, f := range r.From {
			peers[j] = cnp.ClusterNetworkPolicyEgressPeer{Namespaces: f.Namespaces, Pods: f.Pods}
		}
		in = append(in, c.tierTemplate(&v, p, broken, field, fmt.Sprintf("%s/ingress/%d", base, i), r.Name, r.Action, peers, r.Protocols, false))
	}
	for i, r := range p.Spec.Egress {
		field := fmt.Sprintf("spec.egress[%d]", i)
		eg = append(eg, c.tierTemplate(&v, p, broken, field, fmt.Sprintf("%s/egress/%d", base, i), r.Name, r.Action, r.To, r.Protocols, true))
	}
	c.errs = append(c.errs, v.errs...)
	for _, q := range subjects {
		pr := c.podRules(q)
		for _, t := range in {
			if r, ok := t.forSubject(q); ok {
				addTierRule(&pr.Ingress, tier, r)
			}
		}
		for _, t := range eg {
			for _, r := range t.egress {
				addTierRule(&pr.Egress, tier, r)
			}
		}
	}
}

func addTierRule(d *Direction, tier Tier, r TierRule) {
	if tier == TierAdmin {
		d.Admin = append(d.Admin, r)
	} else {
		d.Baseline = append(d.Baseline, r)
	}
}

// subjects returns the pods a subject selects (every pod when it cannot
// be read).
func (c *compiler) subjects(v *validator, s cnp.ClusterNetworkPolicySubject) []*pod {
	var nsSel, podSel labels.Selector
	var err error
	switch {
	case s.Namespaces != nil && s.Pods == nil:
		if nsSel, err = metav1.LabelSelectorAsSelector(s.Namespaces); err != nil {
			v.add("spec.subject.namespaces", err)
			return c.pods
		}
		podSel = labels.Everything()
	case s.Pods != nil && s.Namespaces == nil:
		if nsSel, err = metav1.LabelSelectorAsSelector(&s.Pods.NamespaceSelector); err != nil {
			v.add("spec.subject.pods.namespaceSelector", err)
			return c.pods
		}
		if podSel, err = metav1.LabelSelectorAsSelector(&s.Pods.PodSelector); err != nil {
			v.add("spec.subject.pods.podSelector", err)
			return c.pods
		}
	default:
		v.add("spec.subject", fmt.Errorf("exactly one of namespaces and pods must be set"))
		return c.pods
	}
	var out []*pod
	for _, q := range c.pods {
		if nsSel.Matches(c.nsLabels[q.ns]) && podSel.Matches(q.labels) {
			out = append(out, q)
		}
	}
	return out
}

// tierTemplate resolves one rule's peers and protocols; broken: the
// policy cannot be read, and the rule fails closed. Ingress peers come as
// egress peers with only namespaces and pods set.
func (c *compiler) tierTemplate(v *validator, p *cnp.ClusterNetworkPolicy, broken bool, field, base, name string, action cnp.ClusterNetworkPolicyRuleAction,
	peers []cnp.ClusterNetworkPolicyEgressPeer, protos []cnp.ClusterNetworkPolicyProtocol, egress bool) tierRuleTemplate {
	if name == "" {
		name = field[len("spec."):]
	}
	t := tierRuleTemplate{rule: TierRule{Policy: p.Name, Priority: p.Spec.Priority, Rule: name}, matches: true}
	errs := len(v.errs)
	switch action {
	case cnp.ClusterNetworkPolicyRuleActionAccept:
		t.rule.Action = Accept
	case cnp.ClusterNetworkPolicyRuleActionDeny:
		t.rule.Action = Deny
	case cnp.ClusterNetworkPolicyRuleActionPass:
		t.rule.Action = Pass
	default:
		v.add(field+".action", fmt.Errorf("unknown action %q (want Accept, Deny or Pass)", action))
		t.rule.Action = Deny
	}
	peerField := field + ".from"
	if egress {
		peerField = field + ".to"
	}
	if len(peers) == 0 {
		v.add(peerField, fmt.Errorf("a rule needs at least one peer"))
	}
	var addrs []netip.Addr
	var peerPods []*pod // for egress named ports
	hasAddrs := false   // a peer of pods or nodes
	for j, peer := range peers {
		f := fmt.Sprintf("%s[%d]", peerField, j)
		pods, ok := c.peerPods(v, f, peer)
		if !ok {
			continue
		}
		if len(peer.DomainNames) > 0 && t.rule.Action != Accept {
			v.add(f+".domainNames", fmt.Errorf("domain name peers are for Accept rules only"))
		}
		if pods != nil {
			hasAddrs = true
			peerPods = append(peerPods, pods...)
			for _, q := range pods {
				addrs = append(addrs, q.ips...)
			}
			continue
		}
		if peer.Nodes != nil {
			hasAddrs = true
			addrs = append(addrs, c.nodeAddrs(peer.Nodes)...)
			continue
		}
		if len(peer.Networks) > 0 {
			nets := AddrSet{Kind: SetNets}
			for k, n := range peer.Networks {
				pfx, err := netip.ParsePrefix(string(n))
				if err != nil {
					v.add(fmt.Sprintf("%s.networks[%d]", f, k), fmt.Errorf("invalid CIDR %q", n))
					continue
				}
				nets.Nets = append(nets.Nets, pfx.Masked())
			}
			id := fmt.Sprintf("%s/networks/%d", base, j)
			c.sets[id] = nets
			t.rule.Peers = append(t.rule.Peers, id)
			for _, q := range c.pods {
				if anyIn(nets, q.ips) {
					peerPods = append(peerPods, q)
				}
			}
		}
		// domainNames: not supported, matches nothing (reported).
	}
	if hasAddrs {
		id := base + "/peers"
		c.sets[id] = addrSet(addrs)
		t.rule.Peers = append([]string{id}, t.rule.Peers...)
	}

	var numeric []PortRange
	named := map[string]bool{}
	for k, pr := range protos {
		f := fmt.Sprintf("%s.protocols[%d]", field, k)
		set := 0
		for _, on := range []bool{pr.TCP != nil, pr.UDP != nil, pr.SCTP != nil, pr.DestinationNamedPort != ""} {
			if on {
				set++
			}
		}
		if set != 1 {
			v.add(f, fmt.Errorf("exactly one of tcp, udp, sctp and destinationNamedPort must be set"))
			continue
		}
		switch {
		case pr.TCP != nil:
			numeric = appendRange(v, f+".tcp", numeric, TCP, pr.TCP.DestinationPort)
		case pr.UDP != nil:
			numeric = appendRange(v, f+".udp", numeric, UDP, pr.UDP.DestinationPort)
		case pr.SCTP != nil:
			numeric = appendRange(v, f+".sctp", numeric, SCTP, pr.SCTP.DestinationPort)
		default:
			if !named[pr.DestinationNamedPort] {
				named[pr.DestinationNamedPort] = true
				t.named = append(t.named, pr.DestinationNamedPort)
			}
		}
	}
	if broken || len(v.errs) > errs {
		// Fail closed: an Accept matches nothing, a Deny or Pass denies
		// everything.
		if t.rule.Action == Accept {
			t.matches = false
			return t
		}
		t.rule = TierRule{Policy: t.rule.Policy, Priority: t.rule.Priority, Rule: t.rule.Rule, Action: Deny, AllPeers: true}
		t.named = nil
		t.egress = []TierRule{t.rule}
		return t
	}
	t.rule.Ports = numeric
	if egress {
		t.egress = c.tierEgressRules(t, base, peerPods)
	}
	return t
}

// appendRange adds a protocol's destination port (nil: every port) to
// ranges, checking it.
func appendRange(v *validator, f string, ranges []PortRange, proto Protocol, p *cnp.Port) []PortRange {
	switch {
	case p == nil:
		return append(ranges, PortRange{Protocol: proto})
	case p.Range == nil && p.Number >= 1 && p.Number <= 65535:
		return append(ranges, PortRange{proto, uint16(p.Number), uint16(p.Number)})
	case p.Range == nil:
		v.add(f+".destinationPort.number", fmt.Errorf("%d is not a port number", p.Number))
	case p.Number != 0:
		v.add(f+".destinationPort", fmt.Errorf("number and range cannot both be set"))
	case p.Range.Start < 1 || p.Range.End > 65535 || p.Range.Start > p.Range.End:
		v.add(f+".destinationPort.range", fmt.Errorf("%d-%d is not a port range", p.Range.Start, p.Range.End))
	default:
		return append(ranges, PortRange{proto, uint16(p.Range.Start), uint16(p.Range.End)})
	}
	return ranges
}

// peerPods returns the pods a namespaces or pods peer selects (nil for
// another kind of peer); false when the peer cannot be read (reported).
func (c *compiler) peerPods(v *validator, f string, peer cnp.ClusterNetworkPolicyEgressPeer) ([]*pod, bool) {
	kinds := 0
	for _, on := range []bool{peer.Namespaces != nil, peer.Pods != nil, peer.Nodes != nil, len(peer.Networks) > 0, len(peer.DomainNames) > 0} {
		if on {
			kinds++
		}
	}
	if kinds != 1 {
		v.add(f, fmt.Errorf("exactly one kind of peer must be set (namespaces, pods, nodes, networks or domainNames)"))
		return nil, false
	}
	var nsSel, podSel labels.Selector = nil, labels.Everything()
	var err error
	switch {
	case peer.Namespaces != nil:
		if nsSel, err = metav1.LabelSelectorAsSelector(peer.Namespaces); err != nil {
			v.add(f+".namespaces", err)
			return nil, false
		}
	case peer.Pods != nil:
		if nsSel, err = metav1.LabelSelectorAsSelector(&peer.Pods.NamespaceSelector); err != nil {
			v.add(f+".pods.namespaceSelector", err)
			return nil, false
		}
		if podSel, err = metav1.LabelSelectorAsSelector(&peer.Pods.PodSelector); err != nil {
			v.add(f+".pods.podSelector", err)
			return nil, false
		}
	case peer.Nodes != nil:
		if _, err := metav1.LabelSelectorAsSelector(peer.Nodes); err != nil {
			v.add(f+".nodes", err)
			return nil, false
		}
		return nil, true
	case len(peer.DomainNames) > 0:
		c.errs = append(c.errs, &FieldError{Kind: ClusterKind, Policy: v.key, Field: f + ".domainNames", Err: fmt.Errorf("domain name peers are not supported: the peer matches nothing")})
		return nil, true
	default:
		return nil, true
	}
	out := []*pod{}
	for _, q := range c.pods {
		if nsSel.Matches(c.nsLabels[q.ns]) && podSel.Matches(q.labels) {
			out = append(out, q)
		}
	}
	return out, true
}

// nodeAddrs are the addresses of the nodes sel selects (validated).
func (c *compiler) nodeAddrs(sel *metav1.LabelSelector) []netip.Addr {
	s, _ := metav1.LabelSelectorAsSelector(sel)
	var out []netip.Addr
	for _, n := range c.nodes {
		if !s.Matches(labels.Set(n.Labels)) {
			continue
		}
		out = append(out, NodeAddrs(n)...)
	}
	return out
}

// NodeAddrs are the IP addresses in a node's status.
func NodeAddrs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// forSubject resolves an ingress rule's named ports against the subject
// pod; false when the rule matches nothing for it.
func (t tierRuleTemplate) forSubject(q *pod) (TierRule, bool) {
	if !t.matches {
		return TierRule{}, false
	}
	r := t.rule
	if len(t.named) == 0 {
		return r, true
	}
	r.Ports = slices.Clone(r.Ports)
	for _, name := range t.named {
		r.Ports = append(r.Ports, namedPorts(q, name)...)
	}
	return r, len(r.Ports) > 0
}

// tierEgressRules: numeric ports keep the rule's peers; each named port
// becomes one rule per port number and protocol, over the peer pods that
// name that port so.
func (c *compiler) tierEgressRules(t tierRuleTemplate, base string, peerPods []*pod) []TierRule {
	if len(t.named) == 0 {
		return []TierRule{t.rule}
	}
	var out []TierRule
	if len(t.rule.Ports) > 0 {
		out = append(out, t.rule)
	}
	for _, name := range t.named {
		byPort := map[PortRange][]netip.Addr{}
		for _, q := range peerPods {
			for _, pr := range namedPorts(q, name) {
				byPort[pr] = append(byPort[pr], q.ips...)
			}
		}
		ports := make([]PortRange, 0, len(byPort))
		for pr := range byPort {
			ports = append(ports, pr)
		}
		slices.SortFunc(ports, func(a, b PortRange) int {
			return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.From, b.From))
		})
		for _, pr := range ports {
			id := fmt.Sprintf("%s/port/%s/%s/%d", base, name, pr.Protocol, pr.From)
			c.sets[id] = addrSet(byPort[pr])
			r := t.rule
			r.AllPeers, r.Peers, r.Ports = false, []string{id}, []PortRange{pr}
			out = append(out, r)
		}
	}
	return out
}

// namedPorts are the container ports of q called name, of any protocol.
func namedPorts(q *pod, name string) []PortRange {
	var out []PortRange
	for _, proto := range []Protocol{TCP, UDP, SCTP} {
		if n, ok := namedPort(q, name, proto); ok {
			out = append(out, PortRange{proto, n, n})
		}
	}
	return out
}
