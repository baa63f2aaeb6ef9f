package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/policy"
	"github.com/weftnet/weft/policy/readyset"
	"github.com/weftnet/weft/policy/tierbox"
)

// TableName is the name of both of weft's policy tables: inet weft-policy
// (the policy rules) and bridge weft-policy (the source check). The
// service proxy's table is inet weft; neither applier touches the other's.
const TableName = readyset.NFTTable

// Chain and set names of the inet table.
const (
	ChainForward = "forward"
	ChainInput   = "input"
	ChainIngress = "ingress"
	ChainEgress  = "egress"
	ChainPending = "pending"
	ChainDropIn  = "drop-in"
	ChainDropOut = "drop-out"
	// The dispatch maps: pod address -> goto the pod's rule chain.
	mapIngress4, mapIngress6 = "ingress-pods4", "ingress-pods6"
	mapEgress4, mapEgress6   = "egress-pods4", "egress-pods6"
	// ChainSource is the bridge table's source check, with its sets of
	// (bridge port, address) pairs.
	ChainSource                 = "source"
	setSource4                  = "sources4"
	setSource6                  = "sources6"
	rulePrefixIn, rulePrefixOut = "in-", "out-"
)

// Config is what Render needs besides the compiled rules.
type Config struct {
	NodeName string
	// LogDrops adds a rate-limited log rule before each drop.
	LogDrops bool
	// LogRate is the log limit (nft limit rate syntax), default 10/second.
	LogRate string
	// LogGroup, when not 0, sends the logged packets to this nflog group
	// instead of the kernel log: the agent's deny log reads them.
	LogGroup uint16
	// PodPorts, when set, is the nft interface wildcard of the pods'
	// bridge ports ("weft*"): traffic entering from one must carry an
	// address of the pod on that port, as Sources say (the bridge table).
	PodPorts string
	Sources  []Source
	// PodBridges, when set, are the bridges the node's pods hang off: new
	// pods are default-deny until the agent marks their addresses ready
	// (the pending chain and the ready sets).
	PodBridges []string
}

// Source is one pod attachment: its bridge port and its addresses.
type Source struct {
	Port  string
	Addrs []netip.Addr
}

// Ruleset is one node's policy state: the inet table, and the bridge
// table of the source check (nil without Config.PodPorts: then the bridge
// table must not exist).
type Ruleset struct {
	Inet   Table
	Bridge *Table
}

// Table is the content of one table.
type Table struct {
	Sets   []Set   // sorted by name
	Chains []Chain // base chains first, then by name
}

// Set is a set, or a verdict map when Verdict.
type Set struct {
	Name     string
	Type     string // key type, e.g. "ipv4_addr . inet_proto . inet_service"
	Verdict  bool
	Interval bool
	// External sets are created when missing and never written: another
	// writer keeps their elements (the ready sets).
	External bool
	Elements []Element
}

// Element is one element: its key fields, and for a map its value.
type Element struct{ Key, Value []string }

// Chain is a chain; a base chain has a hook.
type Chain struct {
	Name     string
	Hook     knftables.BaseChainHook
	Priority knftables.BaseChainPriority
	Rules    []string
}

// group is the rules of a direction shared by every pod with the same
// rules: a chain and its sets, and the chains it goes to (tiers.go).
type group struct {
	chain string
	rules []string
	sets  []Set
	extra []Chain
}

// Render computes the node's ruleset for both families.
func Render(d policy.Desired, cfg Config) *Ruleset {
	groups := map[string]*group{}
	dispatch := map[string][]Element{}
	for _, p := range d.Pods {
		if p.Node != cfg.NodeName || len(p.IPs) == 0 {
			continue
		}
		for _, dir := range []struct {
			d              policy.Direction
			prefix, peer   string
			map4, map6, to string
		}{
			{p.Ingress, rulePrefixIn, "saddr", mapIngress4, mapIngress6, ChainDropIn},
			{p.Egress, rulePrefixOut, "daddr", mapEgress4, mapEgress6, ChainDropOut},
		} {
			if dir.d.Empty() {
				continue
			}
			name := dir.prefix + hashName(policy.DirectionSignature(dir.d))
			if groups[name] == nil {
				groups[name] = renderDirection(name, dir.peer, dir.to, dir.d, d.Sets)
			}
			for _, ip := range p.IPs {
				m := dir.map4
				if ip.Is6() {
					m = dir.map6
				}
				dispatch[m] = append(dispatch[m], Element{Key: []string{ip.String()}, Value: []string{"goto " + name}})
			}
		}
	}
	rs := &Ruleset{}
	t := &rs.Inet
	for _, m := range []string{mapEgress4, mapEgress6, mapIngress4, mapIngress6} {
		typ := "ipv4_addr"
		if strings.HasSuffix(m, "6") {
			typ = "ipv6_addr"
		}
		els := dispatch[m]
		slices.SortFunc(els, func(a, b Element) int { return strings.Compare(a.Key[0], b.Key[0]) })
		t.Sets = append(t.Sets, Set{Name: m, Type: typ, Verdict: true, Elements: els})
	}
	var groupChains []Chain
	written := map[string]bool{} // tier sets are shared by groups
	for _, name := range sortedKeys(groups) {
		g := groups[name]
		for _, s := range g.sets {
			if !written[s.Name] {
				written[s.Name] = true
				t.Sets = append(t.Sets, s)
			}
		}
		groupChains = append(append(groupChains, Chain{Name: name, Rules: g.rules}), g.extra...)
	}
	t.Chains = append(t.Chains, baseChains(cfg)...)
	if len(cfg.PodBridges) > 0 {
		t.Chains = append(t.Chains, pendingChain(cfg))
		t.Sets = append(t.Sets,
			Set{Name: readyset.NFTSet4, Type: "ipv4_addr", External: true},
			Set{Name: readyset.NFTSet6, Type: "ipv6_addr", External: true})
	}
	t.Chains = append(t.Chains,
		Chain{Name: ChainDropIn, Rules: dropRules(cfg, "ingress")},
		Chain{Name: ChainDropOut, Rules: dropRules(cfg, "egress")},
		Chain{Name: ChainEgress, Rules: []string{"ip saddr vmap @" + mapEgress4, "ip6 saddr vmap @" + mapEgress6}},
		Chain{Name: ChainIngress, Rules: []string{"ip daddr vmap @" + mapIngress4, "ip6 daddr vmap @" + mapIngress6}},
	)
	t.Chains = append(t.Chains, groupChains...)
	sort.Slice(t.Sets, func(i, j int) bool { return t.Sets[i].Name < t.Sets[j].Name })
	if cfg.PodPorts != "" {
		rs.Bridge = sourceTable(cfg)
	}
	return rs
}

// ndRule lets IPv6 neighbour discovery through: it is how pods find each
// other on the bridge (IPv4's ARP never meets these hooks), and policies do
// not cover it.
const ndRule = "icmpv6 type { nd-router-solicit, nd-router-advert, nd-neighbor-solicit, nd-neighbor-advert, nd-redirect } accept"

// baseChains are the hooks. An accept ends the packet's walk of this
// table only (a later hook or another table still judges it), so accept
// here is what RETURN is to the iptables backend's chains.
func baseChains(cfg Config) []Chain {
	established := "ct state established,related accept"
	var fwdPending, inPending []string
	if len(cfg.PodBridges) > 0 {
		// In forward before the shortcut for established flows (a reused
		// address could still have conntrack entries of its previous pod),
		// in input after it, so that a pending pod answers the node.
		fwdPending = []string{"jump " + ChainPending}
		inPending = fwdPending
	}
	return []Chain{
		{Name: ChainForward, Hook: knftables.ForwardHook, Priority: knftables.FilterPriority,
			Rules: slices.Concat([]string{ndRule}, fwdPending, []string{established, "jump " + ChainEgress, "jump " + ChainIngress})},
		{Name: ChainInput, Hook: knftables.InputHook, Priority: knftables.FilterPriority,
			Rules: slices.Concat([]string{ndRule, established}, inPending, []string{"jump " + ChainEgress})},
	}
}

// pendingChain holds new pods both ways until their addresses are in the
// ready set (see readyset): unicast traffic forwarded onto a pod bridge to
// an address not ready, and traffic from a pod bridge whose source is not
// ready, is dropped. IPv6 link-local traffic passes.
func pendingChain(cfg Config) Chain {
	rules := []string{"ip6 saddr fe80::/10 return", "ip6 daddr fe80::/10 return", "ip6 saddr :: return"}
	for _, br := range cfg.PodBridges {
		rules = append(rules,
			fmt.Sprintf(`oifname %q ip daddr != @%s fib daddr type unicast drop`, br, readyset.NFTSet4),
			fmt.Sprintf(`oifname %q ip6 daddr != @%s fib daddr type unicast drop`, br, readyset.NFTSet6),
			fmt.Sprintf(`iifname %q ip saddr != @%s drop`, br, readyset.NFTSet4),
			fmt.Sprintf(`iifname %q ip6 saddr != @%s drop`, br, readyset.NFTSet6))
	}
	return Chain{Name: ChainPending, Rules: rules}
}

func dropRules(cfg Config, dir string) []string {
	var out []string
	if cfg.LogDrops {
		rate := cfg.LogRate
		if rate == "" {
			rate = "10/second"
		}
		if cfg.LogGroup != 0 {
			out = append(out, fmt.Sprintf("limit rate %s burst 20 packets log prefix %q group %d snaplen 128", rate, policy.DropLogPrefix+dir, cfg.LogGroup))
		} else {
			out = append(out, fmt.Sprintf("limit rate %s burst 20 packets log prefix %q", rate, policy.DropLogPrefix+dir+": "))
		}
	}
	return append(out, "counter drop")
}

// renderGroup renders the chain and sets of one direction's rules. peer is
// "saddr" (ingress: the peer sends) or "daddr" (egress). Every (peer,
// protocol, port) the rules allow is in one interval set per family,
// matched with one lookup of (peer address . protocol . destination port);
// rules without ports (every protocol, every port) put their peers in a
// second set of addresses. So a new connection costs at most four lookups
// whatever the number of policies and ports, and which sets and rules
// exist depends on the rules' structure only: pods and namespaces coming,
// going or relabelled change set elements, never rules.
func renderGroup(name, peer, drop string, rules []policy.Rule, addrSets map[string]policy.AddrSet) *group {
	g := &group{chain: name}
	var hasPorts, hasAny bool
	for _, r := range rules {
		hasPorts = hasPorts || len(r.Ports) > 0
		hasAny = hasAny || len(r.Ports) == 0
	}
	for _, v6 := range []bool{false, true} {
		ip, typ, fam := "ip", "ipv4_addr", "4"
		if v6 {
			ip, typ, fam = "ip6", "ipv6_addr", "6"
		}
		peers := func(r policy.Rule) []tierbox.Block {
			if r.AllPeers {
				return []tierbox.Block{tierbox.AllOf(v6)}
			}
			var out []tierbox.Block
			for _, id := range r.Peers {
				out = append(out, tierbox.BlockOf(v6, addrSets[id]))
			}
			return out
		}
		if hasPorts {
			var spans []tierbox.PortSpan
			for _, r := range rules {
				for _, p := range r.Ports {
					from, to := int(p.From), int(p.To)
					if p.From == 0 {
						from, to = 0, 65535
					}
					spans = append(spans, tierbox.PortSpan{Proto: strings.ToLower(string(p.Protocol)), From: from, To: to, Peers: peers(r)})
				}
			}
			s := Set{Name: name + "-ports" + fam, Type: typ + " . inet_proto . inet_service", Interval: true}
			for _, b := range tierbox.Boxes(spans) {
				for _, a := range b.V {
					s.Elements = append(s.Elements, Element{Key: []string{a.String(), b.Proto, b.Ports()}})
				}
			}
			g.sets = append(g.sets, s)
			g.rules = append(g.rules, fmt.Sprintf("%s %s . meta l4proto . th dport @%s return", ip, peer, s.Name))
		}
		if hasAny {
			var blocks []tierbox.Block
			for _, r := range rules {
				if len(r.Ports) == 0 {
					blocks = append(blocks, peers(r)...)
				}
			}
			s := Set{Name: name + "-any" + fam, Type: typ, Interval: true}
			for _, a := range tierbox.Ranges(blocks) {
				s.Elements = append(s.Elements, Element{Key: []string{a.String()}})
			}
			g.sets = append(g.sets, s)
			g.rules = append(g.rules, fmt.Sprintf("%s %s @%s return", ip, peer, s.Name))
		}
	}
	g.rules = append(g.rules, "goto "+drop)
	return g
}

// sourceTable is the bridge table's source check: a frame entering the
// bridge from a pod's port (cfg.PodPorts) carrying IPv4 or IPv6 goes on
// only with an address of the pod on that port, one lookup of (port .
// address) in a set; IPv6 link-local and unspecified sources pass
// (neighbour discovery), other frames (ARP) too, VLAN-tagged ones are
// dropped (no pod sends them; they would pass the address checks
// unseen). A new pod's pair is an element write.
func sourceTable(cfg Config) *Table {
	t := &Table{}
	s4 := Set{Name: setSource4, Type: "ifname . ipv4_addr"}
	s6 := Set{Name: setSource6, Type: "ifname . ipv6_addr"}
	srcs := slices.Clone(cfg.Sources)
	slices.SortFunc(srcs, func(a, b Source) int { return strings.Compare(a.Port, b.Port) })
	for _, src := range srcs {
		for _, a := range src.Addrs {
			a = a.Unmap()
			e := Element{Key: []string{src.Port, a.String()}}
			if a.Is4() {
				s4.Elements = append(s4.Elements, e)
			} else {
				s6.Elements = append(s6.Elements, e)
			}
		}
	}
	t.Sets = []Set{s4, s6}
	t.Chains = []Chain{{Name: ChainSource, Hook: knftables.PreroutingHook, Priority: knftables.FilterPriority, Rules: []string{
		fmt.Sprintf("iifname != %q accept", cfg.PodPorts),
		"iifname . ip saddr @" + setSource4 + " accept",
		"ip6 saddr fe80::/10 accept",
		"ip6 saddr :: accept",
		"iifname . ip6 saddr @" + setSource6 + " accept",
		"ether type { ip, ip6, 8021q, 8021ad } counter drop",
	}}}
	return t
}

func hashName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return strings.ToLower(base32.StdEncoding.EncodeToString(sum[:])[:16])
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// checkState is a small compiled state using every rule form Render
// writes (NetworkPolicy rules, the tiers' sets and chains), for Check.
func checkState() policy.Desired {
	v4, v6 := netip.MustParseAddr("10.244.0.2"), netip.MustParseAddr("fd00::2")
	rules := []policy.Rule{
		{Peers: []string{"s"}, Ports: []policy.PortRange{{Protocol: policy.TCP, From: 80, To: 80}, {Protocol: policy.SCTP}}},
		{AllPeers: true},
	}
	dir := policy.Direction{Isolated: true, Rules: rules}
	tiered := policy.Direction{
		Admin: []policy.TierRule{{Action: policy.Pass, Peers: []string{"s"}, Ports: []policy.PortRange{{Protocol: policy.UDP, From: 53, To: 53}}},
			{Action: policy.Deny, Peers: []string{"s"}}, {Action: policy.Accept, AllPeers: true}},
		Baseline: []policy.TierRule{{Action: policy.Deny, AllPeers: true}},
	}
	return policy.Desired{
		Pods: []policy.PodRules{{Key: "check/check", Node: "check", IPs: []netip.Addr{v4, v6}, Ingress: dir, Egress: tiered}},
		Sets: map[string]policy.AddrSet{"s": {Kind: policy.SetNets, Nets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")},
			Except: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}},
	}
}
