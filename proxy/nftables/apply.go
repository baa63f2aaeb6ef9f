package nftables

import (
	"context"
	"fmt"
	"slices"

	"sigs.k8s.io/knftables"
)

// Applier keeps the table in line with rendered rulesets, one transaction
// per Apply.
type Applier struct {
	NFT knftables.Interface
	// applied is what the last successful Apply left (nil: unknown, the
	// next Apply is full).
	applied *applied
}

type applied struct {
	chains map[string][]string // name -> rules
	sets   map[string]Set
}

// Stats describe one Apply.
type Stats struct {
	Full bool
	// Rules written (chains flushed and rewritten count all their rules),
	// element adds and deletes, chains and sets created or deleted, and
	// the stale affinity entries deleted.
	Rules, ElementAdds, ElementDeletes, Objects, AffinityPurged int
}

// Apply programs rs in one transaction: a full apply rewrites every chain
// and the elements of every set (the affinity map excepted) and deletes
// what the table has that rs does not; a partial one sends rs.Changes and
// the chains that changed. On failure the table is as it was and the next
// Apply is full.
func (a *Applier) Apply(ctx context.Context, rs *Ruleset, full bool) (Stats, error) {
	full = full || a.applied == nil
	tx := a.NFT.NewTransaction()
	st := Stats{Full: full}
	var err error
	if full {
		err = a.full(ctx, tx, rs, &st, false)
	} else {
		a.partial(tx, rs, &st)
	}
	if err == nil && (full || rs.AffinityStale) {
		err = a.purgeAffinity(ctx, tx, rs, &st)
	}
	if err == nil && tx.NumOperations() > 0 {
		err = a.NFT.Run(ctx, tx)
	}
	if err != nil && full {
		// The table may hold what this version cannot rewrite in place (a
		// set of another type, say): recreate it, in one transaction
		// still. Only the affinity entries are lost.
		tx, st = a.NFT.NewTransaction(), Stats{Full: true}
		if ferr := a.full(ctx, tx, rs, &st, true); ferr == nil {
			if rerr := a.NFT.Run(ctx, tx); rerr == nil {
				err = nil
			} else {
				err = fmt.Errorf("%w; recreating table %s: %w", err, TableName, rerr)
			}
		}
	}
	if err != nil {
		a.applied = nil
		return st, err
	}
	next := &applied{chains: map[string][]string{}, sets: map[string]Set{}}
	for _, c := range rs.Chains {
		next.chains[c.Name] = c.Rules
	}
	for _, s := range rs.Sets {
		next.sets[s.Name] = s
	}
	a.applied = next
	return st, nil
}

func chainObject(c *Chain) *knftables.Chain {
	ch := &knftables.Chain{Name: c.Name}
	if c.Hook != "" {
		ch.Type, ch.Hook, ch.Priority = knftables.PtrTo(c.Type), knftables.PtrTo(c.Hook), knftables.PtrTo(c.Priority)
	}
	return ch
}

func writeRules(tx *knftables.Transaction, c *Chain, st *Stats) {
	tx.Flush(&knftables.Chain{Name: c.Name})
	for _, r := range c.Rules {
		tx.Add(&knftables.Rule{Chain: c.Name, Rule: r})
	}
	st.Rules += len(c.Rules)
}

func element(set string, key, value []string, isMap bool) *knftables.Element {
	if isMap {
		return &knftables.Element{Map: set, Key: key, Value: value}
	}
	return &knftables.Element{Set: set, Key: key}
}

// full rewrites everything in tx; fresh deletes the table first.
func (a *Applier) full(ctx context.Context, tx *knftables.Transaction, rs *Ruleset, st *Stats, fresh bool) error {
	existing := map[string]map[string]bool{}
	if fresh {
		tx.Add(&knftables.Table{})
		tx.Delete(&knftables.Table{})
	}
	for _, kind := range []string{"chain", "set", "map"} {
		if fresh {
			break
		}
		names, err := a.NFT.List(ctx, kind)
		if err != nil && !knftables.IsNotFound(err) {
			return fmt.Errorf("listing the %ss of table %s: %w", kind, TableName, err)
		}
		existing[kind] = map[string]bool{}
		for _, n := range names {
			existing[kind][n] = true
		}
	}
	tx.Add(&knftables.Table{})
	for _, c := range rs.Chains {
		tx.Add(chainObject(c))
	}
	for _, s := range rs.Sets {
		tx.Add(s.object())
	}
	wantChain := map[string]bool{}
	for _, c := range rs.Chains {
		wantChain[c.Name] = true
		writeRules(tx, c, st)
	}
	for n := range existing["chain"] {
		if !wantChain[n] {
			tx.Flush(&knftables.Chain{Name: n})
		}
	}
	wantSet := map[string]bool{}
	for _, s := range rs.Sets {
		wantSet[s.Name] = true
		if s.Dynamic {
			continue
		}
		tx.Flush(s.object())
		for _, e := range sortedElements(rs.Elements[s.Name]) {
			tx.Add(element(s.Name, e.Key, e.Value, s.Value != ""))
			st.ElementAdds++
		}
	}
	for _, kind := range []string{"set", "map"} {
		for _, n := range sortedKeys(existing[kind]) {
			if !wantSet[n] {
				st.Objects++
				if kind == "set" {
					tx.Delete(&knftables.Set{Name: n})
				} else {
					tx.Delete(&knftables.Map{Name: n})
				}
			}
		}
	}
	for _, n := range sortedKeys(existing["chain"]) {
		if !wantChain[n] {
			st.Objects++
			tx.Delete(&knftables.Chain{Name: n})
		}
	}
	return nil
}

// partial sends what changed since the last apply.
func (a *Applier) partial(tx *knftables.Transaction, rs *Ruleset, st *Stats) {
	isMap := map[string]bool{}
	wantSet := map[string]bool{}
	for _, s := range rs.Sets {
		isMap[s.Name], wantSet[s.Name] = s.Value != "", true
		if _, ok := a.applied.sets[s.Name]; !ok {
			tx.Add(s.object())
			st.Objects++
		}
	}
	wantChain := map[string]bool{}
	for _, c := range rs.Chains {
		wantChain[c.Name] = true
		if prev, ok := a.applied.chains[c.Name]; !ok || !slices.Equal(prev, c.Rules) {
			if !ok {
				tx.Add(chainObject(c))
				st.Objects++
			}
			writeRules(tx, c, st)
		}
	}
	for _, c := range rs.Changes {
		if c.Had && wantSet[c.Set] {
			tx.Delete(element(c.Set, c.Key, nil, isMap[c.Set]))
			st.ElementDeletes++
		}
	}
	for _, c := range rs.Changes {
		if c.Has {
			tx.Add(element(c.Set, c.Key, c.New, isMap[c.Set]))
			st.ElementAdds++
		}
	}
	for _, n := range sortedKeys(a.applied.chains) {
		if !wantChain[n] {
			tx.Flush(&knftables.Chain{Name: n})
		}
	}
	for _, n := range sortedKeys(a.applied.sets) {
		if !wantSet[n] {
			st.Objects++
			tx.Delete(a.applied.sets[n].object())
		}
	}
	for _, n := range sortedKeys(a.applied.chains) {
		if !wantChain[n] {
			st.Objects++
			tx.Delete(&knftables.Chain{Name: n})
		}
	}
}

// purgeAffinity deletes, in tx, the affinity entries pointing to a backend
// their frontend no longer has. An entry may expire between the listing and
// the commit, and deleting a missing element fails the transaction: each
// is re-added (a no-op while it exists) just before its deletion.
func (a *Applier) purgeAffinity(ctx context.Context, tx *knftables.Transaction, rs *Ruleset, st *Stats) error {
	for _, s := range rs.Sets {
		if !s.Dynamic {
			continue
		}
		elems, err := a.NFT.ListElements(ctx, "map", s.Name)
		if err != nil {
			if knftables.IsNotFound(err) {
				continue // created by this transaction
			}
			return fmt.Errorf("listing map %s: %w", s.Name, err)
		}
		for _, e := range elems {
			if rs.AffinityValid(s.Name, e.Key, e.Value) {
				continue
			}
			tx.Add(&knftables.Element{Map: s.Name, Key: e.Key, Value: e.Value})
			tx.Delete(&knftables.Element{Map: s.Name, Key: e.Key})
			st.AffinityPurged++
		}
	}
	return nil
}

func sortedElements(m map[string]Element) []Element {
	out := make([]Element, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
