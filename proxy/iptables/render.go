package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
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

// HairpinSet is the ipset (hash:ip,port,ip) of one family holding, for
// every endpoint, "ip,proto:port,ip": a connection DNATed to the endpoint
// it came from matches it and is masqueraded, so that the pod's reply goes
// back through the node. One set lookup replaces a hairpin rule per
// endpoint.
func HairpinSet(family int) string { return fmt.Sprintf("WEFT-HAIRPIN-%d", family) }

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
// Chains are immutable once rendered. A service port's chains are named
// after a hash of their identity and their rules: a chain of that name in
// the kernel has exactly these rules, so an apply only writes those the
// kernel lacks. The others (base and dispatch chains) are Fixed: named
// after what they are, rewritten in place.
type Chain struct {
	Table, Name string
	Rules       []string
	Fixed       bool // the name is not content-addressed
}

// Ruleset is the rendered desired state of one IP family.
type Ruleset struct {
	Family int
	Chains []*Chain // in a stable order
	// Jumps are the rules weft adds to built-in chains: table -> chain -> rule.
	Jumps []Jump
	// HairpinAdded and HairpinRemoved are the changes of HairpinSet(Family)
	// since the previous ruleset of the same Renderer (everything, for the
	// first).
	HairpinAdded, HairpinRemoved []string
	hairpin                      map[string]int
}

// Hairpin returns every entry of HairpinSet(Family), sorted. It is computed
// on demand (full applies, dry runs) and valid until the Renderer that made
// rs renders again.
func (rs *Ruleset) Hairpin() []string { return sortedKeysFunc(rs.hairpin, strings.Compare) }

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

// hashName builds a chain name from a prefix and the identity and content
// it stands for.
func hashName(prefix string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return prefix + base32.StdEncoding.EncodeToString(h.Sum(nil))[:16]
}

// addressed returns a content-addressed chain: its name hashes the prefix,
// the identity and the rules.
func addressed(table, prefix string, rules []string, identity ...string) *Chain {
	return &Chain{Table: table, Name: hashName(prefix, append(identity, rules...)...), Rules: rules}
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

// Render turns the model into the desired ruleset of one family. It is pure.
func Render(cfg Config, st model.State, family int) *Ruleset {
	return NewRenderer(cfg, family).Update(st)
}

// baseChains are the fixed chains every node has.
func baseChains(cfg Config, family int) []*Chain {
	masq, drop := cfg.masqMark(), cfg.dropMark()
	fixed := func(table, name string, rules ...string) *Chain {
		return &Chain{Table: table, Name: name, Rules: rules, Fixed: true}
	}
	return []*Chain{
		fixed(TableNAT, chainMarkMasq, fmt.Sprintf("-j MARK --or-mark %#x", masq)),
		fixed(TableNAT, chainMarkDrop, fmt.Sprintf("-j MARK --or-mark %#x", drop)),
		fixed(TableNAT, chainPostrouting,
			fmt.Sprintf(`-m conntrack --ctstate DNAT -m set --match-set %s dst,dst,src -m comment --comment "hairpin" -j %s`,
				HairpinSet(family), chainMarkMasq),
			fmt.Sprintf("-m mark ! --mark %#x/%#x -j RETURN", masq, masq),
			fmt.Sprintf("-j MARK --xor-mark %#x", masq),
			`-m comment --comment "weft service traffic requiring SNAT" -j MASQUERADE --random-fully`),
		fixed(TableFilter, chainFilterFwd,
			"-m conntrack --ctstate INVALID -j DROP",
			fmt.Sprintf(`-m mark --mark %#x/%#x -m comment --comment "weft service traffic" -j ACCEPT`, masq, masq),
			"-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
	}
}
