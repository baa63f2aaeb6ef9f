package agent

import (
	"context"
	"fmt"
	"net/netip"

	"sigs.k8s.io/knftables"
)

// The data planes of the agent's own rules (masquerading): iptables (the
// default; chains in the nat and filter tables) or nftables (its own
// table, inet weft-agent). weft-agent --dataplane nftables selects
// nftables for the proxy, NetworkPolicy and these rules alike, so that a
// node needs no iptables or ipset tool.
const (
	DataplaneIPTables = "iptables"
	DataplaneNFTables = "nftables"
)

// AgentTable is the agent's nftables table (inet). The proxy's is inet
// weft, the policy backend's inet and bridge weft-policy: each applier
// owns one table and touches no other.
const AgentTable = "weft-agent"

// masqueradeNFT writes the agent's table in tx from nothing (table, set
// of cluster CIDRs, chain): pod traffic leaving the cluster CIDRs is
// masqueraded to the node's address, as MasqueradeRules does for
// iptables. Everything is flushed and rewritten, so a sync repairs drift
// in one transaction. There is no counterpart of the iptables WEFT-FORWARD
// ACCEPT rules: an accept in one nftables table does not override a drop
// in another (a firewall's forward policy), so it could not help; a
// filter chain of policy accept is what a table without one already is.
func masqueradeNFT(tx *knftables.Transaction, clusterCIDRs []netip.Prefix) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("weft-agent: masquerading of pod traffic leaving the cluster")})
	tx.Add(&knftables.Set{Name: "cluster4", Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	tx.Flush(&knftables.Set{Name: "cluster4"})
	for _, c := range clusterCIDRs {
		tx.Add(&knftables.Element{Set: "cluster4", Key: []string{c.Masked().String()}})
	}
	chain := &knftables.Chain{Name: "postrouting", Type: knftables.PtrTo(knftables.NATType),
		Hook: knftables.PtrTo(knftables.PostroutingHook), Priority: knftables.PtrTo(knftables.SNATPriority)}
	tx.Add(chain)
	tx.Flush(chain)
	for _, r := range []struct{ rule, comment string }{
		{"ip saddr @cluster4 ip daddr @cluster4 return", "pod to pod"},
		{"ip saddr @cluster4 ip daddr 224.0.0.0/4 return", "multicast"},
		{"ip saddr @cluster4 masquerade fully-random", "pod leaving the cluster"},
	} {
		tx.Add(&knftables.Rule{Chain: chain.Name, Rule: r.rule, Comment: knftables.PtrTo(r.comment)})
	}
}

// nftAgentTable is the system's nft on the agent's table.
func nftAgentTable() (knftables.Interface, error) {
	nft, err := knftables.New(knftables.InetFamily, AgentTable)
	if err != nil {
		return nil, fmt.Errorf("the nftables data plane needs the nft tool, version 1.0.1 or later: %w", err)
	}
	return nft, nil
}

// applyMasqueradeNFT programs the agent's table in one transaction.
func applyMasqueradeNFT(ctx context.Context, nft knftables.Interface, clusterCIDRs []netip.Prefix) error {
	tx := nft.NewTransaction()
	masqueradeNFT(tx, clusterCIDRs)
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("applying table inet %s: %w", AgentTable, err)
	}
	return nil
}

// cleanupNFT deletes the agent's table, and nothing else.
func cleanupNFT(ctx context.Context, nft knftables.Interface) error {
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{}) // so that deleting a missing table succeeds
	tx.Delete(&knftables.Table{})
	if err := nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("deleting table inet %s: %w", AgentTable, err)
	}
	return nil
}

// ensureMasqueradeNFT is ensureMasquerade on the nftables data plane.
func (a *Agent) ensureMasqueradeNFT(v4 []netip.Prefix) error {
	nft, err := nftAgentTable()
	if err != nil {
		return err
	}
	if err := applyMasqueradeNFT(context.Background(), nft, v4); err != nil {
		return err
	}
	if applied := fmt.Sprint(v4); applied != a.masq {
		a.opts.Log.Info("masquerade rules applied", "table", "inet "+AgentTable, "clusterCIDRs", v4)
		a.masq = applied
	}
	return nil
}

// cleanupMasqueradeNFT deletes the agent's table.
func (a *Agent) cleanupMasqueradeNFT() error {
	nft, err := nftAgentTable()
	if err != nil {
		return err
	}
	return cleanupNFT(context.Background(), nft)
}
