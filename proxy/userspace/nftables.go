package userspace

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/model"
)

// TableName is the nftables glue's table (family inet). Its rules are
// constant; the frontends live in its sets and maps.
const TableName = "weft-userspace"

// The glue's sets and maps of one family (suffix 4 or 6), keyed by
// address . protocol . port, except allow (frontend . source range).
const (
	mapRedirect     = "redirect" // frontend : listener port
	setReject       = "reject"
	setDrop         = "drop"
	setDropExternal = "drop-external"
	setFirewall     = "firewall"
	setAllow        = "allow"
	// setGuard (no family): protocol . port of the listeners.
	setGuard = "listeners"
)

// RenderNFT adds the whole glue table for g to tx: the table, its sets and
// chains (flushed, so that the transaction rewrites them) and the
// elements. It is pure: tx is data until it is run.
func RenderNFT(tx *knftables.Transaction, g GlueSpec, clusterCIDRs []netip.Prefix) {
	tx.Add(&knftables.Table{})
	flushed := func(o knftables.Object) {
		tx.Add(o)
		tx.Flush(o)
	}
	flushed(&knftables.Set{Name: setGuard, Type: "inet_proto . inet_service"})
	families := []struct{ suffix, addr, ip string }{{"4", "ipv4_addr", "ip"}, {"6", "ipv6_addr", "ip6"}}
	for _, f := range families {
		entry := f.addr + " . inet_proto . inet_service"
		flushed(&knftables.Map{Name: mapRedirect + f.suffix, Type: entry + " : inet_service"})
		for _, s := range []string{setReject, setDrop, setDropExternal, setFirewall} {
			flushed(&knftables.Set{Name: s + f.suffix, Type: entry})
		}
		flushed(&knftables.Set{Name: setAllow + f.suffix, Type: entry + " . " + f.addr, Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	}
	prio, hook, typ := knftables.PtrTo[knftables.BaseChainPriority], knftables.PtrTo[knftables.BaseChainHook], knftables.PtrTo[knftables.BaseChainType]
	// Drops run before the NAT (dstnat-10), on the frontend itself; rejects
	// where reject may run; the guard after the REDIRECT (input).
	chains := []*knftables.Chain{
		{Name: "filter-prerouting", Type: typ(knftables.FilterType), Hook: hook(knftables.PreroutingHook), Priority: prio(knftables.DNATPriority + "-10")},
		{Name: "filter-output", Type: typ(knftables.FilterType), Hook: hook(knftables.OutputHook), Priority: prio(knftables.DNATPriority + "-10")},
		{Name: "filter-input", Type: typ(knftables.FilterType), Hook: hook(knftables.InputHook), Priority: prio(knftables.FilterPriority)},
		{Name: "filter-forward", Type: typ(knftables.FilterType), Hook: hook(knftables.ForwardHook), Priority: prio(knftables.FilterPriority)},
		{Name: "nat-prerouting", Type: typ(knftables.NATType), Hook: hook(knftables.PreroutingHook), Priority: prio(knftables.DNATPriority)},
		{Name: "nat-output", Type: typ(knftables.NATType), Hook: hook(knftables.OutputHook), Priority: prio(knftables.DNATPriority)},
	}
	for _, c := range chains {
		flushed(c)
	}
	rule := func(chain string, parts ...string) {
		tx.Add(&knftables.Rule{Chain: chain, Rule: knftables.Concat(parts)})
	}
	rule("filter-input", "ct state new meta l4proto . th dport @"+setGuard, "ct status & dnat == 0 drop")
	for _, f := range families {
		dst := f.ip + " daddr . meta l4proto . th dport"
		firewall := []string{dst, "@" + setFirewall + f.suffix, dst, ". " + f.ip + " saddr", "!=", "@" + setAllow + f.suffix, "drop"}
		drop := []string{dst, "@" + setDrop + f.suffix, "drop"}
		reject := []string{dst, "@" + setReject + f.suffix, "reject"}
		rule("filter-prerouting", firewall...)
		rule("filter-prerouting", drop...)
		var pods []string
		for _, c := range clusterCIDRs {
			if (f.suffix == "6") == c.Addr().Is6() {
				pods = append(pods, c.Masked().String())
			}
		}
		ext := []string{"fib saddr type != local", dst, "@" + setDropExternal + f.suffix, "drop"}
		if len(pods) > 0 {
			ext = append([]string{f.ip, "saddr != {", strings.Join(pods, ", "), "}"}, ext...)
		}
		rule("filter-prerouting", ext...)
		rule("filter-output", firewall...)
		rule("filter-output", drop...)
		rule("filter-output", reject...)
		rule("filter-input", reject...)
		rule("filter-forward", reject...)
		for _, c := range []string{"nat-prerouting", "nat-output"} {
			rule(c, "meta l4proto { tcp, udp }", "redirect to :", dst, "map @"+mapRedirect+f.suffix)
		}
	}

	key := func(f Frontend) []string {
		return []string{f.Addr.String(), proto(f.Protocol), strconv.Itoa(int(f.Port))}
	}
	suffix := func(a netip.Addr) string { return strconv.Itoa(4 + 2*familyIndex(a)) }
	for _, r := range g.Redirect {
		tx.Add(&knftables.Element{Map: mapRedirect + suffix(r.Addr), Key: key(r.Frontend), Value: []string{strconv.Itoa(int(r.To))}})
	}
	for set, l := range map[string][]Frontend{setReject: g.Reject, setDrop: g.Drop, setDropExternal: g.DropExternal, setFirewall: g.Firewall} {
		for _, f := range l {
			tx.Add(&knftables.Element{Set: set + suffix(f.Addr), Key: key(f)})
		}
	}
	for _, f := range g.Firewall {
		for _, r := range f.SourceRanges {
			tx.Add(&knftables.Element{Set: setAllow + suffix(f.Addr), Key: append(key(f), r.String())})
		}
	}
	for _, gd := range g.Guard {
		tx.Add(&knftables.Element{Set: setGuard, Key: []string{proto(gd.Protocol), strconv.Itoa(int(gd.Port))}})
	}
}

func proto(p model.Protocol) string { return strings.ToLower(string(p)) }

// nftGlue applies the glue as one nft transaction per sync.
type nftGlue struct {
	nft          knftables.Interface
	clusterCIDRs []netip.Prefix
}

// newNFTGlue returns the glue on the system's nft, after a dry run of the
// table (the error names what is missing).
func newNFTGlue(clusterCIDRs []netip.Prefix) (*nftGlue, error) {
	nft, err := knftables.New(knftables.InetFamily, TableName)
	if err != nil {
		return nil, fmt.Errorf("userspace mode with the nftables glue needs the nft tool, version 1.0.1 or later: %w", err)
	}
	tx := nft.NewTransaction()
	RenderNFT(tx, GlueSpec{}, clusterCIDRs)
	if err := nft.Check(context.Background(), tx); err != nil {
		return nil, fmt.Errorf("userspace mode: the kernel refused table inet %s (it needs nf_tables with inet nat, redirect, fib, "+
			"concatenated sets): %w", TableName, err)
	}
	return &nftGlue{nft: nft, clusterCIDRs: clusterCIDRs}, nil
}

func (n *nftGlue) apply(g GlueSpec, _ bool) error {
	tx := n.nft.NewTransaction()
	RenderNFT(tx, g, n.clusterCIDRs)
	if err := n.nft.Run(context.Background(), tx); err != nil {
		return fmt.Errorf("table inet %s: %w", TableName, err)
	}
	return nil
}

// cleanup deletes the table, and nothing else.
func (n *nftGlue) cleanup() error {
	tx := n.nft.NewTransaction()
	tx.Add(&knftables.Table{}) // so that deleting a missing table succeeds
	tx.Delete(&knftables.Table{})
	if err := n.nft.Run(context.Background(), tx); err != nil {
		return fmt.Errorf("deleting table inet %s: %w", TableName, err)
	}
	return nil
}
