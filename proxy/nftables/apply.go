package nftables

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// Applier keeps the table in line with rendered rulesets, one transaction
// per Apply.
//
// nft 1.0.6 cannot add a rule that looks up a map already in the kernel
// whose value concatenates "th dport" (it reads the map's typeof back and
// fails with "conflicting protocols specified"), which every load-balancing
// and client map has. So rules referencing such maps are written only with
// their maps, in the transaction that creates them: a rule carries its own
// id as comment; a full apply leaves every chain whose rules the kernel
// already has alone, and a partial one appends a new endpoint count's or
// timeout's rules (to chains where order does not matter) and deletes
// rules by handle. When the table cannot be rewritten in place, the full
// apply recreates it, still in one transaction.
type Applier struct {
	NFT knftables.Interface
	// applied is what the last successful Apply left (nil: unknown, the
	// next Apply is full).
	applied *applied
}

type applied struct {
	chains map[string][]string // name -> rules, in the kernel's order
	sets   map[string]Set
}

// Stats describe one Apply.
type Stats struct {
	Full bool
	// Rules written or deleted, element adds and deletes, chains and sets
	// created or deleted, and the stale affinity entries deleted.
	Rules, ElementAdds, ElementDeletes, Objects, AffinityPurged int
	// Recreated is set when a full apply had to recreate the table.
	Recreated bool
}

// orderFree are the chains whose rules match disjoint packets, so that a
// rule may be appended to them.
func orderFree(chain string) bool {
	return strings.HasPrefix(chain, "lb") || strings.HasPrefix(chain, "affinity-")
}

func ruleID(rule string) string {
	h := sha256.Sum256([]byte(rule))
	return hex.EncodeToString(h[:8])
}

// Apply programs rs in one transaction: a full apply rewrites the elements
// of every set (the client maps of affinity excepted) and any chain that
// differs, and deletes what the table has that rs does not; a partial one
// sends rs.Changes and the rules that changed. On failure the table is as
// it was and the next Apply is full.
func (a *Applier) Apply(ctx context.Context, rs *Ruleset, full bool) (Stats, error) {
	full = full || a.applied == nil
	tx := a.NFT.NewTransaction()
	st := Stats{Full: full}
	next := &applied{chains: map[string][]string{}, sets: map[string]Set{}}
	var err error
	if full {
		err = a.full(ctx, tx, rs, &st, next)
	} else {
		err = a.partial(ctx, tx, rs, &st, next)
	}
	if err == nil && (full || rs.AffinityStale) {
		err = a.purgeAffinity(ctx, tx, rs, &st)
	}
	if err == nil && tx.NumOperations() > 0 {
		err = a.NFT.Run(ctx, tx)
	}
	if err != nil && full {
		// Recreate the table, in one transaction still: only the affinity
		// entries are lost.
		tx, st = a.NFT.NewTransaction(), Stats{Full: true, Recreated: true}
		next = &applied{chains: map[string][]string{}, sets: map[string]Set{}}
		fresh(tx, rs, &st, next)
		if rerr := a.NFT.Run(ctx, tx); rerr != nil {
			err = fmt.Errorf("%w; recreating table %s: %w", err, TableName, rerr)
		} else {
			err = nil
		}
	}
	if err != nil {
		a.applied = nil
		return st, err
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

func addRule(tx *knftables.Transaction, chain, rule string, st *Stats) {
	tx.Add(&knftables.Rule{Chain: chain, Rule: rule, Comment: knftables.PtrTo(ruleID(rule))})
	st.Rules++
}

func writeRules(tx *knftables.Transaction, c *Chain, st *Stats, next *applied) {
	tx.Flush(&knftables.Chain{Name: c.Name})
	for _, r := range c.Rules {
		addRule(tx, c.Name, r, st)
	}
	next.chains[c.Name] = c.Rules
}

func element(set string, key, value []string, isMap bool) *knftables.Element {
	if isMap {
		return &knftables.Element{Map: set, Key: key, Value: value}
	}
	return &knftables.Element{Set: set, Key: key}
}

// declare adds the table, the chains and the sets to tx.
func declare(tx *knftables.Transaction, rs *Ruleset) {
	tx.Add(&knftables.Table{})
	for _, c := range rs.Chains {
		tx.Add(chainObject(c))
	}
	for _, s := range rs.Sets {
		tx.Add(s.object())
	}
}

// fillSets replaces the elements of every set but the client maps.
func fillSets(tx *knftables.Transaction, rs *Ruleset, st *Stats) {
	for _, s := range rs.Sets {
		if s.Timeout > 0 {
			continue
		}
		tx.Flush(s.object())
		for _, e := range sortedElements(rs.Elements[s.Name]) {
			tx.Add(element(s.Name, e.Key, e.Value, s.Value != ""))
			st.ElementAdds++
		}
	}
}

// fresh recreates the table in tx.
func fresh(tx *knftables.Transaction, rs *Ruleset, st *Stats, next *applied) {
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	declare(tx, rs)
	for _, c := range rs.Chains {
		writeRules(tx, c, st, next)
	}
	fillSets(tx, rs, st)
}

// full rewrites in tx what differs from rs: chains whose rules differ,
// every set's elements; and deletes what rs does not have.
func (a *Applier) full(ctx context.Context, tx *knftables.Transaction, rs *Ruleset, st *Stats, next *applied) error {
	existing := map[string]map[string]bool{}
	for _, kind := range []string{"chain", "set", "map"} {
		names, err := a.NFT.List(ctx, kind)
		if err != nil && !knftables.IsNotFound(err) {
			return fmt.Errorf("listing the %ss of table %s: %w", kind, TableName, err)
		}
		existing[kind] = map[string]bool{}
		for _, n := range names {
			existing[kind][n] = true
		}
	}
	declare(tx, rs)
	wantChain := map[string]bool{}
	for _, c := range rs.Chains {
		wantChain[c.Name] = true
		if existing["chain"][c.Name] {
			kept, err := a.kernelRules(ctx, c)
			if err != nil {
				return err
			}
			if kept != nil {
				next.chains[c.Name] = kept
				continue
			}
		}
		writeRules(tx, c, st, next)
	}
	for _, n := range sortedKeys(existing["chain"]) {
		if !wantChain[n] {
			tx.Flush(&knftables.Chain{Name: n})
		}
	}
	fillSets(tx, rs, st)
	wantSet := map[string]bool{}
	for _, s := range rs.Sets {
		wantSet[s.Name] = true
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

// kernelRules returns c's rules in the kernel's order when the kernel has
// exactly c's rules (by their ids), else nil.
func (a *Applier) kernelRules(ctx context.Context, c *Chain) ([]string, error) {
	rules, err := a.NFT.ListRules(ctx, c.Name)
	if err != nil {
		return nil, fmt.Errorf("listing chain %s: %w", c.Name, err)
	}
	byID := map[string]string{}
	for _, r := range c.Rules {
		byID[ruleID(r)] = r
	}
	if len(rules) != len(byID) || len(byID) != len(c.Rules) {
		return nil, nil
	}
	var out []string
	for _, r := range rules {
		text, ok := "", r.Comment != nil
		if ok {
			text, ok = byID[*r.Comment]
		}
		if !ok {
			return nil, nil
		}
		out = append(out, text)
	}
	if !orderFree(c.Name) && !slices.Equal(out, c.Rules) {
		return nil, nil
	}
	return out, nil
}

// partial sends in tx what changed since the last apply.
func (a *Applier) partial(ctx context.Context, tx *knftables.Transaction, rs *Ruleset, st *Stats, next *applied) error {
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
		prev, ok := a.applied.chains[c.Name]
		switch {
		case !ok:
			tx.Add(chainObject(c))
			st.Objects++
			writeRules(tx, c, st, next)
		case slices.Equal(prev, c.Rules):
			next.chains[c.Name] = prev
		case orderFree(c.Name):
			if err := a.patchRules(ctx, tx, c, prev, st, next); err != nil {
				return err
			}
		default:
			writeRules(tx, c, st, next)
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
	return nil
}

// patchRules deletes (by handle) the rules of an order-free chain that c no
// longer has and appends the new ones.
func (a *Applier) patchRules(ctx context.Context, tx *knftables.Transaction, c *Chain, prev []string, st *Stats, next *applied) error {
	want := map[string]bool{}
	for _, r := range c.Rules {
		want[r] = true
	}
	had := map[string]bool{}
	var kept []string
	var handles map[string]int
	for _, r := range prev {
		had[r] = true
		if want[r] {
			kept = append(kept, r)
			continue
		}
		if handles == nil {
			rules, err := a.NFT.ListRules(ctx, c.Name)
			if err != nil {
				return fmt.Errorf("listing chain %s: %w", c.Name, err)
			}
			handles = map[string]int{}
			for _, k := range rules {
				if k.Comment != nil && k.Handle != nil {
					handles[*k.Comment] = *k.Handle
				}
			}
		}
		h, ok := handles[ruleID(r)]
		if !ok {
			return fmt.Errorf("chain %s: rule %q is not in the kernel", c.Name, r)
		}
		tx.Delete(&knftables.Rule{Chain: c.Name, Handle: &h})
		st.Rules++
	}
	for _, r := range c.Rules {
		if !had[r] {
			addRule(tx, c.Name, r, st)
			kept = append(kept, r)
		}
	}
	next.chains[c.Name] = kept
	return nil
}

// purgeAffinity deletes, in tx, the affinity entries pointing to a backend
// their frontend no longer has. An entry may expire between the listing and
// the commit, and deleting a missing element fails the transaction: each
// is re-added (a no-op while it exists) just before its deletion.
func (a *Applier) purgeAffinity(ctx context.Context, tx *knftables.Transaction, rs *Ruleset, st *Stats) error {
	for _, s := range rs.Sets {
		if s.Timeout == 0 {
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
			if rs.AffinityValid(s.Timeout, e.Key, e.Value) {
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
