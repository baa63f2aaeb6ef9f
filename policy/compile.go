package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// pod is a pod the policies can see: it has addresses and its own network.
type pod struct {
	key, ns, node string
	labels        labels.Set
	ips           []netip.Addr
	ports         []corev1.ContainerPort
}

// Compile computes every pod's rules. Rejected policies are reported in
// Desired.Errors and isolate without allowing anything.
func Compile(in Input) Desired {
	c := newCompiler(in)
	for _, p := range c.policies {
		c.policy(p)
	}
	c.clusterPolicies(in.ClusterPolicies)
	d := Desired{Sets: c.sets}
	for _, p := range c.pods {
		if r, ok := c.rules[p.key]; ok {
			d.Pods = append(d.Pods, *r)
		}
	}
	d.Errors = c.errs
	return d
}

type compiler struct {
	pods     []*pod
	byNS     map[string][]*pod
	nsLabels map[string]labels.Set
	policies []*networkingv1.NetworkPolicy
	nodes    []*corev1.Node
	sets     map[string]AddrSet
	rules    map[string]*PodRules
	errs     []*FieldError
}

func newCompiler(in Input) *compiler {
	c := &compiler{byNS: map[string][]*pod{}, nsLabels: map[string]labels.Set{}, sets: map[string]AddrSet{}, rules: map[string]*PodRules{}, nodes: in.Nodes}
	for _, n := range in.Namespaces {
		c.nsLabels[n.Name] = n.Labels
	}
	for _, p := range in.Pods {
		ips := PodIPs(p)
		if len(ips) == 0 {
			continue
		}
		var ports []corev1.ContainerPort
		for _, ct := range p.Spec.Containers {
			ports = append(ports, ct.Ports...)
		}
		c.pods = append(c.pods, &pod{key: Key(p), ns: p.Namespace, node: p.Spec.NodeName, labels: p.Labels, ips: ips, ports: ports})
	}
	sort.Slice(c.pods, func(i, j int) bool { return c.pods[i].key < c.pods[j].key })
	for _, p := range c.pods {
		c.byNS[p.ns] = append(c.byNS[p.ns], p)
	}
	c.policies = slices.Clone(in.Policies)
	sort.Slice(c.policies, func(i, j int) bool { return Key(c.policies[i]) < Key(c.policies[j]) })
	return c
}

// PodIPs are the addresses of a pod policies apply to: none for host-network
// pods, pods without an address yet, and finished pods.
func PodIPs(p *corev1.Pod) []netip.Addr {
	if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil
	}
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil && !seen[a] {
			seen[a] = true
			out = append(out, a.Unmap())
		}
	}
	for _, ip := range p.Status.PodIPs {
		add(ip.IP)
	}
	add(p.Status.PodIP)
	return out
}

// policy adds one policy's isolation and rules to the pods it selects.
func (c *compiler) policy(p *networkingv1.NetworkPolicy) {
	key := Key(p)
	errs := Validate(p)
	c.errs = append(c.errs, errs...)
	ingress, egress := Isolates(p)
	var selected []*pod
	if sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector); err != nil {
		selected = c.byNS[p.Namespace] // cannot tell which: fail closed for all
	} else {
		for _, q := range c.byNS[p.Namespace] {
			if sel.Matches(q.labels) {
				selected = append(selected, q)
			}
		}
	}
	var inRules, egRules []ruleTemplate
	if len(errs) == 0 {
		if ingress {
			for i, r := range p.Spec.Ingress {
				inRules = append(inRules, c.template(p, "ingress", i, r.From, r.Ports))
			}
		}
		if egress {
			for i, r := range p.Spec.Egress {
				egRules = append(egRules, c.template(p, "egress", i, r.To, r.Ports))
			}
		}
	}
	for _, q := range selected {
		pr := c.podRules(q)
		pr.Policies = append(pr.Policies, key)
		if ingress {
			pr.Ingress.Isolated = true
			for _, t := range inRules {
				if r, ok := t.forTarget(q); ok {
					pr.Ingress.Rules = append(pr.Ingress.Rules, r)
				}
			}
		}
		if egress {
			pr.Egress.Isolated = true
			for _, t := range egRules {
				pr.Egress.Rules = append(pr.Egress.Rules, t.egress...)
			}
		}
	}
}

func (c *compiler) podRules(q *pod) *PodRules {
	if r, ok := c.rules[q.key]; ok {
		return r
	}
	r := &PodRules{Key: q.key, Node: q.node, IPs: q.ips}
	c.rules[q.key] = r
	return r
}

// ruleTemplate is one policy rule with its peers resolved. Ingress ports are
// resolved per selected pod (named ports name the pod's own ports); egress
// rules are complete (named ports resolved per destination pod).
type ruleTemplate struct {
	policy   string
	allPeers bool
	peers    []string
	ports    []networkingv1.NetworkPolicyPort
	egress   []Rule
}

func (c *compiler) template(p *networkingv1.NetworkPolicy, dir string, i int, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) ruleTemplate {
	key := Key(p)
	base := fmt.Sprintf("%s@%s/%s/%d", key, specHash(p.Spec), dir, i)
	t := ruleTemplate{policy: key, allPeers: len(peers) == 0, ports: ports}
	var peerPods []*pod // pods among the peers (for egress named ports)
	if !t.allPeers {
		var addrs []netip.Addr
		hasSelector := false
		for j, peer := range peers {
			if peer.IPBlock != nil {
				id := fmt.Sprintf("%s/block/%d", base, j)
				c.sets[id] = blockSet(peer.IPBlock)
				t.peers = append(t.peers, id)
				for _, q := range c.pods {
					if anyIn(c.sets[id], q.ips) {
						peerPods = append(peerPods, q)
					}
				}
				continue
			}
			hasSelector = true
			for _, q := range c.selectPeers(p.Namespace, peer) {
				peerPods = append(peerPods, q)
				addrs = append(addrs, q.ips...)
			}
		}
		if hasSelector {
			id := base + "/pods"
			c.sets[id] = addrSet(addrs)
			t.peers = append([]string{id}, t.peers...)
		}
	} else {
		peerPods = c.pods
	}
	if dir == "egress" {
		t.egress = c.egressRules(t, base, peerPods)
	}
	return t
}

// selectPeers returns the pods a selector peer picks.
func (c *compiler) selectPeers(ns string, peer networkingv1.NetworkPolicyPeer) []*pod {
	var podSel labels.Selector = labels.Everything()
	if peer.PodSelector != nil {
		podSel, _ = metav1.LabelSelectorAsSelector(peer.PodSelector) // validated
	}
	var out []*pod
	if peer.NamespaceSelector == nil {
		for _, q := range c.byNS[ns] {
			if podSel.Matches(q.labels) {
				out = append(out, q)
			}
		}
		return out
	}
	nsSel, _ := metav1.LabelSelectorAsSelector(peer.NamespaceSelector) // validated
	for _, q := range c.pods {
		if nsSel.Matches(c.nsLabels[q.ns]) && podSel.Matches(q.labels) {
			out = append(out, q)
		}
	}
	return out
}

// forTarget resolves an ingress rule's ports against the pod it protects;
// false when the rule names ports and none exists on the pod.
func (t ruleTemplate) forTarget(q *pod) (Rule, bool) {
	r := Rule{Policy: t.policy, AllPeers: t.allPeers, Peers: t.peers}
	for _, p := range t.ports {
		proto := protocol(p.Protocol)
		if p.Port != nil && p.Port.Type != 0 {
			if n, ok := namedPort(q, p.Port.StrVal, proto); ok {
				r.Ports = append(r.Ports, PortRange{proto, n, n})
			}
			continue
		}
		r.Ports = append(r.Ports, numericRange(p, proto))
	}
	if len(t.ports) > 0 && len(r.Ports) == 0 {
		return Rule{}, false
	}
	return r, true
}

// egressRules: numeric ports keep the rule's peers; each named port becomes
// one rule per port number, over the peer pods that name that port so.
func (c *compiler) egressRules(t ruleTemplate, base string, peerPods []*pod) []Rule {
	numeric := Rule{Policy: t.policy, AllPeers: t.allPeers, Peers: t.peers}
	var named []Rule
	for _, p := range t.ports {
		proto := protocol(p.Protocol)
		if p.Port == nil || p.Port.Type == 0 {
			numeric.Ports = append(numeric.Ports, numericRange(p, proto))
			continue
		}
		byNum := map[uint16][]netip.Addr{}
		for _, q := range peerPods {
			if n, ok := namedPort(q, p.Port.StrVal, proto); ok {
				byNum[n] = append(byNum[n], q.ips...)
			}
		}
		nums := make([]uint16, 0, len(byNum))
		for n := range byNum {
			nums = append(nums, n)
		}
		slices.Sort(nums)
		for _, n := range nums {
			id := fmt.Sprintf("%s/port/%s/%s/%d", base, proto, p.Port.StrVal, n)
			c.sets[id] = addrSet(byNum[n])
			named = append(named, Rule{Policy: t.policy, Peers: []string{id}, Ports: []PortRange{{proto, n, n}}})
		}
	}
	if len(t.ports) > 0 && len(numeric.Ports) == 0 {
		return named
	}
	return append([]Rule{numeric}, named...)
}

// specHash fingerprints a policy's spec: set IDs carry it, so a changed
// policy gets new sets (switched to atomically with its rules) while
// membership changes of an unchanged policy update its sets in place.
func specHash(spec any) string {
	b, _ := json.Marshal(spec)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:4])
}

func protocol(p *corev1.Protocol) Protocol {
	if p == nil {
		return TCP
	}
	return Protocol(*p)
}

func numericRange(p networkingv1.NetworkPolicyPort, proto Protocol) PortRange {
	if p.Port == nil {
		return PortRange{Protocol: proto}
	}
	from := uint16(p.Port.IntVal)
	to := from
	if p.EndPort != nil {
		to = uint16(*p.EndPort)
	}
	return PortRange{proto, from, to}
}

func namedPort(q *pod, name string, proto Protocol) (uint16, bool) {
	for _, cp := range q.ports {
		cpProto := TCP
		if cp.Protocol != "" {
			cpProto = Protocol(cp.Protocol)
		}
		if cp.Name == name && cpProto == proto && cp.ContainerPort > 0 && cp.ContainerPort < 65536 {
			return uint16(cp.ContainerPort), true
		}
	}
	return 0, false
}

func addrSet(addrs []netip.Addr) AddrSet {
	s := slices.Clone(addrs)
	slices.SortFunc(s, func(a, b netip.Addr) int { return a.Compare(b) })
	return AddrSet{Kind: SetAddrs, Addrs: slices.Compact(s)}
}

func blockSet(b *networkingv1.IPBlock) AddrSet {
	s := AddrSet{Kind: SetNets}
	cidr, _ := netip.ParsePrefix(b.CIDR) // validated
	s.Nets = []netip.Prefix{cidr.Masked()}
	for _, e := range b.Except {
		p, _ := netip.ParsePrefix(e)
		s.Except = append(s.Except, p.Masked())
	}
	return s
}

func anyIn(s AddrSet, ips []netip.Addr) bool {
	for _, ip := range ips {
		if s.Contains(ip) {
			return true
		}
	}
	return false
}

// DirectionSignature identifies a direction by its structure: its
// NetworkPolicy rules' Signature, and with ClusterNetworkPolicy rules
// their tiers' (rules in order, with their actions), and the isolation.
func DirectionSignature(d Direction) string {
	sig := Signature(d.Rules)
	if len(d.Admin) == 0 && len(d.Baseline) == 0 {
		return sig
	}
	var b strings.Builder
	tier := func(name string, rules []TierRule) { b.WriteString(name + "[" + TierSignature(rules) + "] ") }
	tier("admin", d.Admin)
	b.WriteString("isolated=" + strconv.FormatBool(d.Isolated) + "[" + sig + "] ")
	tier("baseline", d.Baseline)
	return b.String()
}

// TierSignature identifies a tier's rules by their structure: in order,
// each one's action, peer set IDs (which carry the policy's fingerprint)
// and ports. Tiers with the same signature have the same boxes
// (policy/tierbox): the backends name and share their sets by it.
func TierSignature(rules []TierRule) string {
	var b strings.Builder
	for _, r := range rules {
		b.WriteString(string(r.Action) + ":")
		if r.AllPeers {
			b.WriteString("all")
		}
		for i, p := range r.Peers {
			if i > 0 {
				b.WriteByte('+')
			}
			b.WriteString(p)
		}
		for _, p := range r.Ports {
			b.WriteString(" " + string(p.Protocol) + "/" + strconv.Itoa(int(p.From)) + "-" + strconv.Itoa(int(p.To)))
		}
		b.WriteByte(';')
	}
	return b.String()
}

// Signature identifies a direction's rules by their structure: the peer
// set IDs (which carry the policy's fingerprint) and the ports. Pods whose
// rules have the same signature share the backends' chains.
func Signature(rules []Rule) string {
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
