package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/model"
)

// TableName is the table weft's proxy owns, in the inet family.
const TableName = "weft"

// presetCounts: the load-balancing maps and rules for 1 to presetCounts
// endpoints always exist, so that endpoints coming and going in Services of
// that size never add or delete a rule.
const presetCounts = 16

// DefaultAffinitySeconds' set and rules always exist; other affinity
// timeouts get theirs while a Service uses them.
const defaultAffinitySeconds = model.DefaultAffinitySeconds

// affinityEntries bounds a client map of ClientIP affinity (clients times
// frontends remembered at once).
const affinityEntries = 1 << 20

// Config is what the renderer needs besides the model.
type Config struct {
	NodeName, Zone string
	// NodePortIPs are the node addresses NodePorts answer on.
	NodePortIPs []netip.Addr
	// ClusterCIDRs: traffic to a ClusterIP from outside them is masqueraded.
	ClusterCIDRs  []netip.Prefix
	MasqueradeAll bool
	MasqueradeBit int // mark bit for masquerade (default 14: 0x4000)
	// Families are the IP families programmed (4 and/or 6; default 4).
	Families []int
}

func (c Config) families() []int {
	if len(c.Families) == 0 {
		return []int{4}
	}
	return c.Families
}

func (c Config) masqMark() uint32 {
	bit := c.MasqueradeBit
	if bit == 0 {
		bit = 14
	}
	return 1 << bit
}

func (c Config) cidrs(fam int) []string {
	var out []string
	for _, p := range c.ClusterCIDRs {
		if familyOf(p.Addr()) == fam {
			out = append(out, p.String())
		}
	}
	return out
}

func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

func proto(p model.Protocol) string { return strings.ToLower(string(p)) }

// name is the name of a per-family set, map or chain.
func name(base string, fam int) string { return base + strconv.Itoa(fam) }

// lbMap is the load-balancing map of frontends with n endpoints (cluster:
// the cluster-wide lists of externalTrafficPolicy Local frontends), as the
// renderer names its elements; in the kernel a large one carries its size
// class (lbSizes).
func lbMap(cluster bool, fam, n int) string {
	if fs := familySets[fam]; fs != nil && n < len(fs.lb[0]) {
		return fs.lb[b2i(cluster)][n]
	}
	base := "lb"
	if cluster {
		base = "lb-cluster"
	}
	return fmt.Sprintf("%s-%d", name(base, fam), n)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// elemSets are a family's names of the sets elements go to, made once: a
// large render names a set for each of millions of elements.
type elemSets struct {
	clusterip, external, externalLocal, firewall, firewallAllow, reject, drop, hairpin string
	lb                                                                                 [2][]string // [cluster][endpoint count], counts up to 256
}

var familySets = map[int]*elemSets{4: newElemSets(4), 6: newElemSets(6)}

func newElemSets(fam int) *elemSets {
	s := &elemSets{clusterip: name("clusterip", fam), external: name("external", fam), externalLocal: name("external-local", fam),
		firewall: name("firewall", fam), firewallAllow: name("firewall-allow", fam), reject: name("reject", fam), drop: name("drop", fam),
		hairpin: name("hairpin", fam)}
	for c, base := range []string{"lb", "lb-cluster"} {
		for n := range 257 {
			s.lb[c] = append(s.lb[c], fmt.Sprintf("%s-%d", name(base, fam), n))
		}
	}
	return s
}

// Size classes of the load-balancing maps.
//
// A set without a declared size is a resizable hash (rhashtable) in the
// kernel, and filling a large one is dominated by its growth: at 100k
// Services x 10 endpoints, 2M elements into one map took 8.3 s of a first
// sync's 13.8 s, mostly in rhashtable_insert_slow while the table was being
// rehashed; with a declared size the kernel picks a hash of fixed buckets
// and the same load took 3.6 s. A declared size is also a limit, and it
// cannot change. So a map of at least sizedFrom elements is declared with
// room for a quarter more than it holds, rounded up to a power of two, and
// its kernel name carries that class ("lb4-10-s22"): a sync that needs
// more room, or that leaves it an eighth full, gives the map a new class,
// which is a new map filled in the element batch while the old one keeps
// serving (the load-balancing chains are order-free: a frontend missing
// from the new map falls through to the old one's rule), deleted after it.
// Smaller maps keep a resizable hash and their plain name.
const (
	sizedFrom = 1 << 13
	minSized  = 14 // the smallest class: room for sizedFrom and its quarter
)

// lbSizes are the size classes (exponents) of the load-balancing maps, by
// the renderer's name; a map not listed has no declared size.
type lbSizes map[string]uint8

// kernelName is the name of the renderer's map m in the kernel.
func (z lbSizes) kernelName(m string) string {
	if e := z[m]; e != 0 {
		return m + "-s" + strconv.Itoa(int(e))
	}
	return m
}

// nextSize is the class of a map of class cur that is to hold n elements.
func nextSize(cur uint8, n int) uint8 {
	fit := func() uint8 {
		if n < sizedFrom {
			return 0
		}
		e := uint8(minSized)
		for 1<<e < n+n/4 {
			e++
		}
		return e
	}
	switch {
	case cur == 0 && n >= sizedFrom, cur != 0 && (n > 1<<cur || n < (1<<cur)/8):
		return fit()
	}
	return cur
}

// adoptSize reads the class of a load-balancing map from its kernel name:
// the renderer's name and class, or ok false for another name.
func adoptSize(kernel string) (m string, e uint8, ok bool) {
	i := strings.LastIndex(kernel, "-s")
	if i < 0 || !strings.HasPrefix(kernel, "lb") {
		return "", 0, false
	}
	n, ok := suffixInt(kernel[i:], "-s")
	if !ok || n < minSized || n > 31 {
		return "", 0, false
	}
	return kernel[:i], uint8(n), true
}

// affinitySet holds the IPv4 frontends with ClientIP affinity of that
// timeout, or all IPv6 frontends with affinity (see hashedAffinity). The
// clients of each are in the dynamic map clientsMap(fam, seconds).
func affinitySet(fam, seconds int) string {
	if hashedAffinity(fam) {
		return name("affinity", fam)
	}
	return fmt.Sprintf("%s-%d", name("affinity", fam), seconds)
}

// clientsMap is the dynamic map client . frontend -> endpoint of the IPv4
// frontends with affinity of that timeout.
func clientsMap(fam, seconds int) string { return fmt.Sprintf("%s-%d", name("clients", fam), seconds) }

// hashedAffinity: IPv6 ClientIP affinity picks the endpoint by a hash of
// the client address instead of from a dynamic map with a timeout. nft
// 1.0.6 (Debian 12) aborts generating a dynamic-map update whose key or
// value concatenates an IPv6 address with anything (netlink_linearize.c:
// "dreg < ctx->reg_low"), and the affinity map needs both. An IPv6 client
// keeps its endpoint while the endpoint list is unchanged; there is no
// timeout.
func hashedAffinity(fam int) bool { return fam == 6 }

// Chain is one chain of the table: a base chain when Hook is set.
type Chain struct {
	Name     string
	Type     knftables.BaseChainType
	Hook     knftables.BaseChainHook
	Priority knftables.BaseChainPriority
	Rules    []string
}

// Set is a set (Value empty) or a data map of the table.
type Set struct {
	Name  string
	Key   string // typeof of the key
	Value string // typeof of the value, maps only
	Flags []knftables.SetFlag
	Size  uint64
	// Timeout is set on the dynamic client maps of ClientIP affinity:
	// written by the packet path, their elements are not weft's to rewrite.
	Timeout int
	// data names the set's elements in the ruleset (the renderer's name;
	// empty: Name).
	data string
	// keyFields and valueFields lay the key and value out (elem.go) for
	// the family; nftOnly: nft writes the elements (the interval set), not
	// the element writer (netlink.go).
	keyFields, valueFields []field
	family                 int
	nftOnly                bool
}

// dataName is the name of s's elements in the ruleset.
func (s *Set) dataName() string {
	if s.data != "" {
		return s.data
	}
	return s.Name
}

func (s Set) object() knftables.Object {
	var size *uint64
	if s.Size != 0 {
		size = &s.Size
	}
	if s.Value == "" {
		return &knftables.Set{Name: s.Name, TypeOf: s.Key, Flags: s.Flags, Size: size}
	}
	return &knftables.Map{Name: s.Name, TypeOf: s.Key + " : " + s.Value, Flags: s.Flags, Size: size}
}

// change is one element to delete (had), add (has) or rewrite.
type change struct {
	set      string
	key      packed
	old, new packedValue
	had, has bool
}

// Ruleset is the desired content of the table.
type Ruleset struct {
	Chains []*Chain // in a stable order
	Sets   []Set    // in a stable order
	// source holds every set's desired elements (key to value), by the
	// renderer's set names; valid until it renders again.
	source *Renderer
	// changes are the element changes since the Renderer's previous
	// ruleset.
	changes []change
	// ChangesUnknown is set on a Renderer's first ruleset, which has no
	// previous one: it has no changes, and applying it is a full sync.
	ChangesUnknown bool
	// AffinityStale is set when a frontend lost a backend or its affinity
	// since the previous ruleset: affinity entries may point where they
	// must no longer go.
	AffinityStale bool
	affinityValid func(seconds int, frontend packed, backend packedValue) bool
}

// each calls f with every element of s.
func (rs *Ruleset) each(s *Set, f func(packed, packedValue)) { rs.source.each(s.dataName(), f) }

// len is the number of elements of s.
func (rs *Ruleset) len(s *Set) int { return rs.source.lens[s.dataName()] }

// affinityValidParts reports whether an entry of the client map s, with
// key (client . frontend) and value (endpoint) as nft prints them, may
// stay.
func (rs *Ruleset) affinityValidParts(s *Set, key, value []string) bool {
	k, err := encode(nil, s.keyFields, key)
	if err != nil {
		return false
	}
	v, err := encode(nil, s.valueFields, value)
	if err != nil {
		return false
	}
	return rs.affinityValid(s.Timeout, toPacked(k[len(k)-feLen(s.family):]), toValue(v))
}

// feLen is the length of a packed frontend key of family fam.
func feLen(fam int) int {
	if fam == 6 {
		return 16 + 8
	}
	return 4 + 8
}

// familyWords are a family's nft words.
type familyWords struct {
	ip, nfproto string
}

func words(fam int) familyWords {
	if fam == 6 {
		return familyWords{"ip6", "ipv6"}
	}
	return familyWords{"ip", "ipv4"}
}

const l4 = "meta l4proto { tcp, udp, sctp }"

// sets are the table's sets and maps for the given endpoint counts and
// affinity timeouts in use (beyond the preset ones).
func sets(cfg Config, counts map[int][]int, timeouts map[int][]int, sizes lbSizes) []Set {
	var out []Set
	for _, fam := range cfg.families() {
		w := words(fam)
		fe := w.ip + " daddr . meta l4proto . th dport"
		dest := w.ip + " daddr . th dport"
		feFields := []field{fieldAddr, fieldProto, fieldPort}
		destFields := []field{fieldAddr, fieldPort}
		feSet := func(name string) Set { return Set{Name: name, Key: fe, keyFields: feFields, family: fam} }
		for _, base := range []string{"clusterip", "external", "external-local", "firewall", "reject", "drop"} {
			out = append(out, feSet(name(base, fam)))
		}
		out = append(out,
			Set{Name: name("firewall-allow", fam), Key: fe + " . " + w.ip + " saddr", Flags: []knftables.SetFlag{knftables.IntervalFlag},
				keyFields: append(slices.Clone(feFields), fieldPrefix), family: fam, nftOnly: true},
			Set{Name: name("hairpin", fam), Key: w.ip + " saddr . " + w.ip + " daddr", keyFields: []field{fieldAddr, fieldAddr}, family: fam})
		if hashedAffinity(fam) {
			out = append(out, feSet(name("affinity", fam)))
		}
		for _, t := range timeouts[fam] {
			out = append(out, feSet(affinitySet(fam, t)),
				Set{Name: clientsMap(fam, t), Key: w.ip + " saddr . " + fe, Value: dest, Size: affinityEntries, Timeout: t,
					Flags:     []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
					keyFields: append([]field{fieldAddr}, feFields...), valueFields: destFields, family: fam})
		}
		for _, n := range counts[fam] {
			for _, cluster := range []bool{false, true} {
				m := lbMap(cluster, fam, n)
				s := Set{Name: sizes.kernelName(m), data: m, Key: fe + " . numgen random mod " + strconv.Itoa(n), Value: dest,
					keyFields: append(slices.Clone(feFields), fieldInt), valueFields: destFields, family: fam}
				if e := sizes[m]; e != 0 {
					s.Size = 1 << e
				}
				out = append(out, s)
			}
		}
	}
	return out
}

// chains are the table's chains for the given counts and timeouts.
func chains(cfg Config, counts map[int][]int, timeouts map[int][]int, sizes lbSizes) []*Chain {
	mark := fmt.Sprintf("meta mark set meta mark | %#x", cfg.masqMark())
	base := func(n string, t knftables.BaseChainType, h knftables.BaseChainHook, p knftables.BaseChainPriority, rules ...string) *Chain {
		return &Chain{Name: n, Type: t, Hook: h, Priority: p, Rules: rules}
	}
	out := []*Chain{
		base("nat-prerouting", knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority, "jump services"),
		base("nat-output", knftables.NATType, knftables.OutputHook, "-100", "jump services"),
		base("nat-postrouting", knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority, "jump masquerading"),
		base("filter-input", knftables.FilterType, knftables.InputHook, knftables.FilterPriority, "ct state new jump reject-services"),
		base("filter-forward", knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority,
			"ct state invalid drop", "ct state new jump reject-services"),
		base("filter-output", knftables.FilterType, knftables.OutputHook, knftables.FilterPriority, "ct state new jump reject-services"),
	}
	services := &Chain{Name: "services"}
	masq := &Chain{Name: "masquerading", Rules: []string{"jump affinity-record"}}
	// The affinity chains and the load-balancing ones hold rules whose
	// order does not matter: rules for a new timeout or endpoint count are
	// appended (see Applier).
	lookup := &Chain{Name: "affinity-lookup"}
	record := &Chain{Name: "affinity-record"}
	reject := &Chain{Name: "reject-services"}
	var lbs []*Chain
	for _, fam := range cfg.families() {
		w := words(fam)
		fe := w.ip + " daddr . meta l4proto . th dport"
		on := func(set string) string { return fmt.Sprintf("%s %s @%s", l4, fe, name(set, fam)) }
		cidrs := cfg.cidrs(fam)
		services.Rules = append(services.Rules,
			fmt.Sprintf("%s %s . %s saddr != @%s drop", on("firewall"), fe, w.ip, name("firewall-allow", fam)))
		switch {
		case cfg.MasqueradeAll:
			services.Rules = append(services.Rules, on("clusterip")+" "+mark)
		case len(cidrs) == 1:
			services.Rules = append(services.Rules, fmt.Sprintf("%s %s saddr != %s %s", on("clusterip"), w.ip, cidrs[0], mark))
		}
		services.Rules = append(services.Rules,
			on("external")+" "+mark,
			on("external-local")+" fib saddr type local "+mark)
		if !hashedAffinity(fam) {
			services.Rules = append(services.Rules, fmt.Sprintf("meta nfproto %s jump affinity-lookup", w.nfproto))
		}
		for _, t := range timeouts[fam] {
			lookup.Rules = append(lookup.Rules, fmt.Sprintf("%s dnat %s to %s saddr . %s map @%s", l4, w.ip, w.ip, fe, clientsMap(fam, t)))
		}
		if len(cidrs) > 0 {
			services.Rules = append(services.Rules,
				fmt.Sprintf("%s %s saddr { %s } goto %s", on("external-local"), w.ip, strings.Join(cidrs, ", "), name("lb-cluster", fam)))
		}
		services.Rules = append(services.Rules,
			fmt.Sprintf("%s fib saddr type local goto %s", on("external-local"), name("lb-cluster", fam)),
			fmt.Sprintf("meta nfproto %s goto %s", w.nfproto, name("lb", fam)))
		for _, cluster := range []bool{false, true} {
			c := &Chain{Name: name("lb", fam)}
			if cluster {
				c.Name = name("lb-cluster", fam)
			}
			for _, n := range counts[fam] {
				if hashedAffinity(fam) {
					c.Rules = append(c.Rules, fmt.Sprintf("%s dnat %s to %s . jhash %s saddr mod %d map @%s",
						on("affinity"), w.ip, fe, w.ip, n, sizes.kernelName(lbMap(cluster, fam, n))))
				}
				c.Rules = append(c.Rules, fmt.Sprintf("%s dnat %s to %s . numgen random mod %d map @%s", l4, w.ip, fe, n,
					sizes.kernelName(lbMap(cluster, fam, n))))
			}
			lbs = append(lbs, c)
		}
		for _, t := range timeouts[fam] {
			for _, p := range []string{"tcp", "udp", "sctp"} {
				orig := fmt.Sprintf("ct original %s daddr . meta l4proto . ct original proto-dst", w.ip)
				record.Rules = append(record.Rules, fmt.Sprintf(
					"ct status dnat meta l4proto %s %s @%s update @%s { %s saddr . %s timeout %ds : %s daddr . th dport }",
					p, orig, affinitySet(fam, t), clientsMap(fam, t), w.ip, orig, t, w.ip))
			}
		}
		masq.Rules = append(masq.Rules, fmt.Sprintf("ct status dnat %s saddr . %s daddr @%s %s", w.ip, w.ip, name("hairpin", fam), mark))
		reject.Rules = append(reject.Rules, on("reject")+" reject", on("drop")+" drop")
	}
	m := cfg.masqMark()
	masq.Rules = append(masq.Rules,
		fmt.Sprintf("meta mark & %#x == 0 return", m),
		fmt.Sprintf("meta mark set meta mark ^ %#x", m),
		"masquerade fully-random")
	out = append(out, services, masq, reject, lookup, record)
	return append(out, lbs...)
}

// sortedInts returns the keys of m, with want added, sorted.
func sortedInts(m map[int]int, want ...int) []int {
	out := slices.Clone(want)
	for k, n := range m {
		if n > 0 && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
