package nftables

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/model"
)

// Backend is the nftables service proxy backend: it renders the model
// incrementally and applies each sync in one nft transaction.
type Backend struct {
	cfg      Config
	renderer *Renderer
	applier  *Applier
	// LastStats are the stats of the last sync.
	LastStats Stats
}

// New returns a backend on the system's nft, after checking that nft and
// the kernel can load weft's ruleset; the error names what is missing.
func New(cfg Config) (*Backend, error) {
	nft, err := knftables.New(knftables.InetFamily, TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables mode needs the nft tool, version 1.0.1 or later: %w", err)
	}
	if err := Check(context.Background(), nft, cfg); err != nil {
		return nil, err
	}
	b := NewWith(cfg, nft)
	b.applier.elements = netlinkElements{table: TableName}
	// The maps of a table left by an earlier run keep their size classes
	// where they still fit. Without a table there is nothing to adopt; any
	// other listing error the first (full) sync meets again and reports.
	if maps, err := nft.List(context.Background(), "map"); err == nil {
		b.renderer.Adopt(maps)
	}
	return b, nil
}

// NewWith returns a backend on nft (a knftables.Fake in tests).
func NewWith(cfg Config, nft knftables.Interface) *Backend {
	return &Backend{cfg: cfg, renderer: NewRenderer(cfg), applier: &Applier{NFT: nft}}
}

// Dump returns the table a first sync of st would load, as nft commands
// (for --dry-run). It touches nothing.
func (b *Backend) Dump(st model.State) (string, error) {
	fake := knftables.NewFake(knftables.InetFamily, TableName)
	if err := NewWith(b.cfg, fake).Sync(st, true); err != nil {
		return "", err
	}
	return fake.Dump(), nil
}

// Check asks the kernel, without changing anything, whether it accepts
// weft's table.
func Check(ctx context.Context, nft knftables.Interface, cfg Config) error {
	p := &plan{}
	fresh(p, Render(cfg, model.State{}), &Stats{}, &applied{chains: map[string][]string{}})
	tx := nft.NewTransaction()
	p.transaction(tx)
	if err := nft.Check(ctx, tx); err != nil {
		return fmt.Errorf("nftables mode: the kernel refused table inet %s (it needs nf_tables with inet nat, fib, numgen, "+
			"concatenated and dynamic sets; Linux 5.13 or later): %w", TableName, err)
	}
	return nil
}

// Sync renders and applies st.
func (b *Backend) Sync(st model.State, full bool) error {
	s, err := b.applier.Apply(context.Background(), b.renderer.Update(st), full)
	b.LastStats = s
	if err != nil {
		return fmt.Errorf("syncing nftables: %w", err)
	}
	return nil
}

// Cleanup deletes the table, and with it everything the backend installed;
// no other table is touched.
func (b *Backend) Cleanup() error {
	tx := b.applier.NFT.NewTransaction()
	tx.Add(&knftables.Table{}) // so that deleting a missing table succeeds
	tx.Delete(&knftables.Table{})
	b.applier.applied = nil
	if err := b.applier.NFT.Run(context.Background(), tx); err != nil {
		return fmt.Errorf("deleting table inet %s: %w", TableName, err)
	}
	return nil
}
