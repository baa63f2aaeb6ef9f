package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/weftnet/weft/proxy/model"
)

// Tables and the chains weft hooks into them.
const (
	TableNAT    = "nat"
	TableFilter = "filter"

	chainServices    = "WEFT-SERVICES"        // nat: PREROUTING, OUTPUT
	chainNodePorts   = "WEFT-NODEPORTS"       // nat: from WEFT-SERVICES for node addresses
	chainPostrouting = "WEFT-SVC-POSTROUTING" // nat: POSTROUTING
	chainMarkMasq    = "WEFT-MARK-MASQ"       // nat
	chainMarkDrop    = "WEFT-MARK-DROP"       // nat
	chainFilterSvc   = "WEFT-PROXY-SERVICES"  // filter: INPUT, FORWARD, OUTPUT (new connections)
	chainFilterFwd   = "WEFT-PROXY-FORWARD"   // filter: FORWARD
	chainPrefix      = "WEFT-"
)

// Config is what the renderer needs besides the model.
type Config struct {
	NodeName string
	Zone     string
	// NodePortIPs are the node addresses NodePorts answer on (one family is
	// used per render).
	NodePortIPs []netip.Addr
	// ClusterCIDRs: traffic to a ClusterIP from outside them is masqueraded.
	ClusterCIDRs  []netip.Prefix
	MasqueradeAll bool
	MasqueradeBit int // mark bit for masquerade (default 14: 0x4000); drop uses the next bit
}

func (c Config) masqMark() uint32 {
	bit := c.MasqueradeBit
	if bit == 0 {
		bit = 14
	}
	return 1 << bit
}

func (c Config) dropMark() uint32 { return c.masqMark() << 1 }

// Chain is one chain weft owns and its rules, each without "-A CHAIN".
type Chain struct {
	Table, Name string
	Rules       []string
}

// Ruleset is the rendered desired state of one IP family.
type Ruleset struct {
	Family int
	Chains []*Chain // in a stable order
	// Jumps are the rules weft adds to built-in chains: table -> chain -> rule.
	Jumps []Jump
}

// Jump is a rule in a built-in chain that enters weft's chains.
type Jump struct{ Table, Chain, Rule string }

// BaseJumps are the jumps from the built-in chains (the same for every family).
func BaseJumps() []Jump {
	return []Jump{
		{TableNAT, "PREROUTING", `-m comment --comment "weft service portals" -j ` + chainServices},
		{TableNAT, "OUTPUT", `-m comment --comment "weft service portals" -j ` + chainServices},
		{TableNAT, "POSTROUTING", `-m comment --comment "weft service masquerade" -j ` + chainPostrouting},
		{TableFilter, "INPUT", `-m conntrack --ctstate NEW -m comment --comment "weft services without endpoints" -j ` + chainFilterSvc},
		{TableFilter, "FORWARD", `-m conntrack --ctstate NEW -m comment --comment "weft services without endpoints" -j ` + chainFilterSvc},
		{TableFilter, "OUTPUT", `-m conntrack --ctstate NEW -m comment --comment "weft services without endpoints" -j ` + chainFilterSvc},
		{TableFilter, "FORWARD", `-m comment --comment "weft forwarding of service traffic" -j ` + chainFilterFwd},
	}
}

// hashName builds a chain name from a prefix and the identity it serves.
func hashName(prefix string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:16]
}

func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

func hostLen(a netip.Addr) string {
	if a.Is4() {
		return a.String() + "/32"
	}
	return a.String() + "/128"
}

func proto(p model.Protocol) string { return strings.ToLower(string(p)) }

// renderer accumulates one family's chains.
type renderer struct {
	cfg     Config
	family  int
	chains  map[string]*Chain
	order   []string
	vips    map[netip.Prefix][]string // bucket -> dispatch rules
	nports  map[uint16][]string       // nodeport bucket start -> dispatch rules
	rejects []string                  // filter rules for ports without usable endpoints
}

func (r *renderer) chain(table, name string) *Chain {
	key := table + "/" + name
	if c, ok := r.chains[key]; ok {
		return c
	}
	c := &Chain{Table: table, Name: name}
	r.chains[key] = c
	r.order = append(r.order, key)
	return c
}

func (r *renderer) add(table, name string, format string, args ...any) {
	c := r.chain(table, name)
	c.Rules = append(c.Rules, fmt.Sprintf(format, args...))
}

// Render turns the model into the desired ruleset of one family. It is pure.
func Render(cfg Config, st model.State, family int) *Ruleset {
	r := &renderer{cfg: cfg, family: family, chains: map[string]*Chain{}, vips: map[netip.Prefix][]string{}, nports: map[uint16][]string{}}
	r.base()
	names := make([]model.ServicePortName, 0, len(st.Ports))
	for n := range st.Ports {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b model.ServicePortName) int { return strings.Compare(a.String(), b.String()) })
	for _, n := range names {
		r.servicePort(st.Ports[n], st.Endpoints[n])
	}
	r.dispatch()
	rs := &Ruleset{Family: family, Jumps: BaseJumps()}
	for _, k := range r.order {
		rs.Chains = append(rs.Chains, r.chains[k])
	}
	return rs
}

// base renders the chains every node has.
func (r *renderer) base() {
	masq, drop := r.cfg.masqMark(), r.cfg.dropMark()
	r.chain(TableNAT, chainServices)
	r.chain(TableNAT, chainNodePorts)
	r.add(TableNAT, chainMarkMasq, "-j MARK --or-mark %#x", masq)
	r.add(TableNAT, chainMarkDrop, "-j MARK --or-mark %#x", drop)
	r.add(TableNAT, chainPostrouting, "-m mark ! --mark %#x/%#x -j RETURN", masq, masq)
	r.add(TableNAT, chainPostrouting, "-j MARK --xor-mark %#x", masq)
	r.add(TableNAT, chainPostrouting, `-m comment --comment "weft service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	r.chain(TableFilter, chainFilterSvc)
	r.add(TableFilter, chainFilterFwd, "-m conntrack --ctstate INVALID -j DROP")
	r.add(TableFilter, chainFilterFwd, `-m mark --mark %#x/%#x -m comment --comment "weft service traffic" -j ACCEPT`, masq, masq)
	r.add(TableFilter, chainFilterFwd, "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
}
