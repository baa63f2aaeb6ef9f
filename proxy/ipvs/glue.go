package ipvs

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// TableName is the nftables table (family inet) of the glue rules around
// IPVS: masquerade, hairpin, drops and LoadBalancer sourceRanges. Its rules
// are constant for a configuration; services change only its sets.
const TableName = "weft-ipvs"

// The glue sets of one family (suffix 4 or 6): entries are
// address . protocol . port, except allow (entry . source range) and
// hairpin (real server . real server).
const (
	setClusterIPs = "cluster-ips"
	setMasqExt    = "masq-external"
	setDrop       = "drop"
	setFirewall   = "firewall"
	setAllow      = "allow"
	setHairpin    = "hairpin"
	// vips are the addresses on Device; entries are the virtual servers:
	// a new connection to any other port of such an address is rejected,
	// not left to whatever listens on the node (as kube-proxy's IPVS mode
	// does). Only new ones: the node's own connections to a ClusterIP
	// leave from that address, and their replies come back to it.
	setVIPs    = "vips"
	setEntries = "entries"
)

func family(is6 bool) string {
	if is6 {
		return "6"
	}
	return "4"
}

// glueSets are the set elements of d, by set name, as nft writes them.
func glueSets(d *Desired) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for _, f := range []string{"4", "6"} {
		for _, s := range []string{setClusterIPs, setMasqExt, setDrop, setFirewall, setAllow, setHairpin, setVIPs, setEntries} {
			out[s+f] = map[string][]string{}
		}
	}
	put := func(set string, is6 bool, key ...string) {
		out[set+family(is6)][strings.Join(key, " . ")] = key
	}
	entry := func(k Entry) []string {
		return []string{k.Addr.String(), strings.ToLower(string(k.Proto)), strconv.Itoa(int(k.Port))}
	}
	for set, entries := range map[string][]Entry{setClusterIPs: d.ClusterIPs, setMasqExt: d.MasqExternal, setDrop: d.Drop, setFirewall: d.Firewall} {
		for _, k := range entries {
			put(set, k.Addr.Is6(), entry(k)...)
		}
	}
	for _, a := range d.Allow {
		put(setAllow, a.Addr.Is6(), append(entry(a.Entry), a.Source.String())...)
	}
	for _, ip := range d.Hairpin {
		put(setHairpin, ip.Is6(), ip.String(), ip.String())
	}
	for _, ip := range d.Addrs {
		put(setVIPs, ip.Is6(), ip.String())
	}
	for k := range d.Servers {
		put(setEntries, k.Addr.Is6(), entry(k)...)
	}
	return out
}

// glueTable adds the table, its sets and its constant chains to tx,
// flushing the chains first (a full sync rewrites them).
func glueTable(tx *knftables.Transaction, cfg Config) {
	tx.Add(&knftables.Table{})
	for _, f := range []struct {
		suffix, addr, ip string
	}{{"4", "ipv4_addr", "ip"}, {"6", "ipv6_addr", "ip6"}} {
		entry := f.addr + " . inet_proto . inet_service"
		for _, s := range []string{setClusterIPs, setMasqExt, setDrop, setFirewall, setEntries} {
			tx.Add(&knftables.Set{Name: s + f.suffix, Type: entry})
		}
		tx.Add(&knftables.Set{Name: setVIPs + f.suffix, Type: f.addr})
		tx.Add(&knftables.Set{Name: setAllow + f.suffix, Type: entry + " . " + f.addr, Flags: []knftables.SetFlag{knftables.IntervalFlag}})
		tx.Add(&knftables.Set{Name: setHairpin + f.suffix, Type: f.addr + " . " + f.addr})
	}
	prio, hook, typ := knftables.PtrTo[knftables.BaseChainPriority], knftables.PtrTo[knftables.BaseChainHook], knftables.PtrTo[knftables.BaseChainType]
	chains := []*knftables.Chain{
		// Before IPVS, which takes packets on the input and output hooks.
		{Name: "prerouting", Type: typ(knftables.FilterType), Hook: hook(knftables.PreroutingHook), Priority: prio(knftables.DNATPriority + "-10")},
		{Name: "output", Type: typ(knftables.FilterType), Hook: hook(knftables.OutputHook), Priority: prio(knftables.DNATPriority + "-10")},
		{Name: "services"},
		// Before IPVS on the input hook (it takes packets at priority 98):
		// reject can run there, not in prerouting.
		{Name: "input", Type: typ(knftables.FilterType), Hook: hook(knftables.InputHook), Priority: prio(knftables.FilterPriority)},
		{Name: "ports"},
		{Name: "postrouting", Type: typ(knftables.NATType), Hook: hook(knftables.PostroutingHook), Priority: prio(knftables.SNATPriority)},
	}
	for _, c := range chains {
		tx.Add(c)
		tx.Flush(c)
	}
	rule := func(chain string, parts ...string) {
		tx.Add(&knftables.Rule{Chain: chain, Rule: knftables.Concat(parts)})
	}
	rule("prerouting", "jump services")
	rule("output", "jump services")
	rule("input", "jump ports")
	rule("output", "jump ports")
	mark := fmt.Sprintf("%#x", uint32(1)<<cfg.MasqueradeBit)
	setMark := "meta mark set meta mark or " + mark
	for _, f := range []struct{ suffix, ip string }{{"4", "ip"}, {"6", "ip6"}} {
		dst := f.ip + " daddr . meta l4proto . th dport"
		rule("services", dst, "@"+setFirewall+f.suffix, dst, ". "+f.ip+" saddr", "!=", "@"+setAllow+f.suffix, "drop")
		rule("services", dst, "@"+setDrop+f.suffix, "drop")
		rule("services", dst, "@"+setMasqExt+f.suffix, setMark)
		var pods []string
		for _, p := range cfg.ClusterCIDRs {
			if p.Addr().Is6() == (f.suffix == "6") {
				pods = append(pods, p.Masked().String())
			}
		}
		if cfg.MasqueradeAll || len(pods) == 0 {
			rule("services", dst, "@"+setClusterIPs+f.suffix, setMark)
		} else {
			rule("services", f.ip, "saddr != {", strings.Join(pods, ", "), "}", dst, "@"+setClusterIPs+f.suffix, setMark)
		}
		rule("postrouting", f.ip, "saddr .", f.ip, "daddr", "@"+setHairpin+f.suffix, "masquerade")
		rule("ports", "ct state new meta l4proto { tcp, udp, sctp }", f.ip, "daddr", "@"+setVIPs+f.suffix, dst, "!=", "@"+setEntries+f.suffix, "reject")
	}
	rule("postrouting", "meta mark &", mark, "==", mark, "meta mark set meta mark xor", mark, "masquerade")
}

// glueElements adds the difference between the applied and the wanted
// elements to tx; applied nil means the sets were flushed.
func glueElements(tx *knftables.Transaction, applied, want map[string]map[string][]string) int {
	n := 0
	for set, elems := range want {
		for k, key := range elems {
			if _, ok := applied[set][k]; !ok {
				tx.Add(&knftables.Element{Set: set, Key: key})
				n++
			}
		}
		for k, key := range applied[set] {
			if _, ok := elems[k]; !ok {
				tx.Delete(&knftables.Element{Set: set, Key: key})
				n++
			}
		}
	}
	return n
}

// prefixOf is ip as a host prefix (the dummy device's addresses).
func prefixOf(ip netip.Addr) netip.Prefix { return netip.PrefixFrom(ip, ip.BitLen()) }
