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

// Applier keeps the table in line with rendered rulesets.
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
// apply recreates it.
//
// Without an element writer (NewWith, knftables' fake in tests) an Apply is
// one transaction. With one (New: nfnetlink, see netlink.go) an Apply is up
// to three, each committed whole and each leaving a table that translates
// every packet as either the old or the new ruleset would: (1) through
// knftables, what the elements will need: new chains, sets and rules, and
// the sourceRanges elements added; (2) the element batch: every change of
// the plain sets and maps, the affinity entries purged, in one
// transaction; (3) through knftables, what they no longer need: rules,
// chains and sets deleted, sourceRanges elements removed. The common syncs
// (endpoints and Services changing) are (2) alone.
type Applier struct {
	NFT knftables.Interface
	// elements writes the elements of the plain sets and maps; nil: they
	// go through NFT, in the one transaction.
	elements elementWriter
	// applied is what the last successful Apply left (nil: unknown, the
	// next Apply is full).
	applied *applied
}

// elementWriter commits element operations in one transaction.
type elementWriter interface {
	write(ops []elemOp) error
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

// txVerb is what a knftables operation of a plan does.
type txVerb uint8

const (
	txAdd txVerb = iota
	txFlush
	txDelete
)

type txOp struct {
	verb txVerb
	obj  knftables.Object
}

// plan is one Apply's operations in the order they may be committed: pre
// adds what the elements need, elems are the element writes, post removes
// what the elements no longer need (see Applier).
type plan struct {
	// split: elements are written apart from pre and post, so the
	// elements of sets only nft writes (sourceRanges' interval set) are
	// added in pre and removed in post.
	split      bool
	pre, post  []txOp
	elems      []elemOp
	refillPost []elemOp // post's flush and refill of nft-only sets, after its other operations
}

func (p *plan) add(ops *[]txOp, verb txVerb, obj knftables.Object) {
	*ops = append(*ops, txOp{verb, obj})
}

// change queues one element added or deleted.
func (p *plan) change(op elemOp) {
	if !p.split || !op.set.nftOnly {
		p.elems = append(p.elems, op)
		return
	}
	if op.verb == elemAdd {
		p.add(&p.pre, txAdd, elemObject(op))
	} else {
		p.add(&p.post, txDelete, elemObject(op))
	}
}

// refill queues the replacement of every element of s by those rs wants
// (sorted for nft, whose transactions tests read; the element writer takes
// them in any order).
func (p *plan) refill(s *Set, rs *Ruleset, st *Stats) {
	if p.split && !s.nftOnly {
		p.elems = append(p.elems, elemOp{verb: elemFill, set: s, fill: rs})
		st.ElementAdds += rs.len(s)
		return
	}
	var ops []elemOp
	rs.each(s, func(k packed, v packedValue) { ops = append(ops, elemOp{verb: elemAdd, set: s, key: k, value: v}) })
	sortOps(s, ops)
	st.ElementAdds += len(ops)
	if !p.split {
		p.elems = append(p.elems, elemOp{verb: elemFlush, set: s})
		p.elems = append(p.elems, ops...)
		return
	}
	// Made before broken: the wanted elements first, the exact set after.
	p.refillPost = append(p.refillPost, elemOp{verb: elemFlush, set: s})
	for _, op := range ops {
		p.add(&p.pre, txAdd, elemObject(op))
		p.refillPost = append(p.refillPost, op)
	}
}

// elemObject is op's element for knftables, its parts as nft prints them.
func elemObject(op elemOp) knftables.Object {
	s := op.set
	switch {
	case op.verb == elemFlush:
		return s.object()
	case s.Value == "":
		return &knftables.Element{Set: s.Name, Key: s.keyParts(op.key)}
	case op.verb == elemDelete:
		return &knftables.Element{Map: s.Name, Key: s.keyParts(op.key)}
	}
	return &knftables.Element{Map: s.Name, Key: s.keyParts(op.key), Value: s.valueParts(op.value)}
}

func fill(tx *knftables.Transaction, ops []txOp) {
	for _, o := range ops {
		switch o.verb {
		case txAdd:
			tx.Add(o.obj)
		case txFlush:
			tx.Flush(o.obj)
		case txDelete:
			tx.Delete(o.obj)
		}
	}
}

func fillElements(tx *knftables.Transaction, ops []elemOp) {
	for _, op := range ops {
		switch op.verb {
		case elemAdd:
			tx.Add(elemObject(op))
		case elemFlush:
			tx.Flush(elemObject(op))
		case elemDelete:
			tx.Delete(elemObject(op))
		}
	}
}

// transaction adds every knftables operation of p to tx, in order.
func (p *plan) transaction(tx *knftables.Transaction) {
	fill(tx, p.pre)
	fillElements(tx, p.elems)
	fill(tx, p.post)
	fillElements(tx, p.refillPost)
}

// run commits p: in one transaction without an element writer, else pre,
// the element batch and post, each skipped when empty.
func (a *Applier) run(ctx context.Context, p *plan) error {
	if !p.split {
		return a.commit(ctx, p)
	}
	if err := a.commit(ctx, &plan{pre: p.pre}); err != nil {
		return fmt.Errorf("adding objects and rules: %w", err)
	}
	if err := a.elements.write(p.elems); err != nil {
		return err
	}
	if err := a.commit(ctx, &plan{post: p.post, refillPost: p.refillPost}); err != nil {
		return fmt.Errorf("deleting objects and rules: %w", err)
	}
	return nil
}

// commit runs p's knftables operations in one transaction, if it has any.
func (a *Applier) commit(ctx context.Context, p *plan) error {
	tx := a.NFT.NewTransaction()
	p.transaction(tx)
	if tx.NumOperations() == 0 {
		return nil
	}
	return a.NFT.Run(ctx, tx)
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

// Apply programs rs: a full apply rewrites the elements of every set (the
// client maps of affinity excepted) and any chain that differs, and
// deletes what the table has that rs does not; a partial one sends
// rs.Changes and the rules that changed. On failure the table is as the
// last committed transaction left it and the next Apply is full.
func (a *Applier) Apply(ctx context.Context, rs *Ruleset, full bool) (Stats, error) {
	full = full || a.applied == nil || rs.ChangesUnknown
	p := &plan{split: a.elements != nil}
	st := Stats{Full: full}
	next := &applied{chains: map[string][]string{}, sets: map[string]Set{}}
	var err error
	if full {
		err = a.full(ctx, p, rs, &st, next)
	} else {
		err = a.partial(ctx, p, rs, &st, next)
	}
	if err == nil && (full || rs.AffinityStale) {
		err = a.purgeAffinity(ctx, p, rs, &st)
	}
	if err == nil {
		err = a.run(ctx, p)
	}
	if err != nil && full {
		// Recreate the table in one transaction, its elements included
		// (through nft, slower but never a table with empty maps): only
		// the affinity entries are lost.
		p, st = &plan{}, Stats{Full: true, Recreated: true}
		next = &applied{chains: map[string][]string{}, sets: map[string]Set{}}
		fresh(p, rs, &st, next)
		if rerr := a.run(ctx, p); rerr != nil {
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

func (p *plan) addRule(chain, rule string, st *Stats) {
	p.add(&p.pre, txAdd, &knftables.Rule{Chain: chain, Rule: rule, Comment: knftables.PtrTo(ruleID(rule))})
	st.Rules++
}

func (p *plan) writeRules(c *Chain, st *Stats, next *applied) {
	p.add(&p.pre, txFlush, &knftables.Chain{Name: c.Name})
	for _, r := range c.Rules {
		p.addRule(c.Name, r, st)
	}
	next.chains[c.Name] = c.Rules
}

// declare adds the table, the chains and the sets to p.
func (p *plan) declare(rs *Ruleset) {
	p.add(&p.pre, txAdd, &knftables.Table{})
	for _, c := range rs.Chains {
		p.add(&p.pre, txAdd, chainObject(c))
	}
	for i := range rs.Sets {
		p.add(&p.pre, txAdd, rs.Sets[i].object())
	}
}

// fillSets replaces the elements of every set but the client maps.
func (p *plan) fillSets(rs *Ruleset, st *Stats) {
	if !p.split { // an operation per element (the element writer's fill their sets whole)
		n := len(rs.Sets)
		for i := range rs.Sets {
			n += rs.len(&rs.Sets[i])
		}
		p.elems = slices.Grow(p.elems, n) // 220k at 10k Services: grown by appends, copied over and over
	}
	for i := range rs.Sets {
		s := &rs.Sets[i]
		if s.Timeout > 0 {
			continue
		}
		p.refill(s, rs, st)
	}
}

// fresh recreates the table in p.
func fresh(p *plan, rs *Ruleset, st *Stats, next *applied) {
	p.add(&p.pre, txAdd, &knftables.Table{})
	p.add(&p.pre, txDelete, &knftables.Table{})
	p.declare(rs)
	for _, c := range rs.Chains {
		p.writeRules(c, st, next)
	}
	p.fillSets(rs, st)
}

// full plans what differs from rs: chains whose rules differ, every set's
// elements; and deletes what rs does not have.
func (a *Applier) full(ctx context.Context, p *plan, rs *Ruleset, st *Stats, next *applied) error {
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
	p.declare(rs)
	wantChain := map[string]bool{}
	for _, c := range rs.Chains {
		wantChain[c.Name] = true
		if existing["chain"][c.Name] {
			kept, err := a.keepRules(ctx, p, c, st, next)
			if err != nil {
				return err
			}
			if kept {
				continue
			}
		}
		p.writeRules(c, st, next)
	}
	for _, n := range sortedKeys(existing["chain"]) {
		if !wantChain[n] {
			p.add(&p.post, txFlush, &knftables.Chain{Name: n})
		}
	}
	p.fillSets(rs, st)
	wantSet := map[string]bool{}
	for _, s := range rs.Sets {
		wantSet[s.Name] = true
	}
	for _, kind := range []string{"set", "map"} {
		for _, n := range sortedKeys(existing[kind]) {
			if !wantSet[n] {
				st.Objects++
				if kind == "set" {
					p.add(&p.post, txDelete, &knftables.Set{Name: n})
				} else {
					p.add(&p.post, txDelete, &knftables.Map{Name: n})
				}
			}
		}
	}
	for _, n := range sortedKeys(existing["chain"]) {
		if !wantChain[n] {
			st.Objects++
			p.add(&p.post, txDelete, &knftables.Chain{Name: n})
		}
	}
	return nil
}

// keepRules plans c's rules from what the kernel has, and reports
// whether it could: a chain with exactly c's rules (by their ids, in c's
// order unless the chain is order-free) is left alone; an order-free one
// whose every rule carries an id gets the rules it lacks appended and
// those c no longer has deleted after the elements moved, as a partial
// apply does, so that a map given a new size class by a restarted proxy
// serves throughout. Otherwise the chain is to be rewritten.
func (a *Applier) keepRules(ctx context.Context, p *plan, c *Chain, st *Stats, next *applied) (bool, error) {
	rules, err := a.NFT.ListRules(ctx, c.Name)
	if err != nil {
		return false, fmt.Errorf("listing chain %s: %w", c.Name, err)
	}
	byID := map[string]string{}
	for _, r := range c.Rules {
		byID[ruleID(r)] = r
	}
	var kept []string
	var stale []int
	seen := map[string]bool{}
	for _, r := range rules {
		if r.Comment == nil || r.Handle == nil {
			return false, nil
		}
		if text, ok := byID[*r.Comment]; ok && !seen[*r.Comment] {
			seen[*r.Comment] = true
			kept = append(kept, text)
		} else {
			stale = append(stale, *r.Handle)
		}
	}
	exact := len(stale) == 0 && len(kept) == len(c.Rules)
	if !orderFree(c.Name) && (!exact || !slices.Equal(kept, c.Rules)) {
		return false, nil
	}
	for _, h := range stale {
		p.add(&p.post, txDelete, &knftables.Rule{Chain: c.Name, Handle: &h})
		st.Rules++
	}
	for _, r := range c.Rules {
		if !seen[ruleID(r)] {
			p.addRule(c.Name, r, st)
			kept = append(kept, r)
		}
	}
	next.chains[c.Name] = kept
	return true, nil
}

// partial plans what changed since the last apply.
func (a *Applier) partial(ctx context.Context, p *plan, rs *Ruleset, st *Stats, next *applied) error {
	// byName: the sets by kernel name; byData: by the name their elements
	// and changes have. A set new to the kernel (a new endpoint count or
	// timeout, a map given another size class) is filled whole, not from
	// the changes.
	byName, byData := map[string]*Set{}, map[string]*Set{}
	var fill []*Set
	for i := range rs.Sets {
		s := &rs.Sets[i]
		byName[s.Name] = s
		if _, ok := a.applied.sets[s.Name]; ok {
			byData[s.dataName()] = s
			continue
		}
		p.add(&p.pre, txAdd, s.object())
		st.Objects++
		if s.Timeout == 0 {
			fill = append(fill, s)
		}
	}
	wantChain := map[string]bool{}
	for _, c := range rs.Chains {
		wantChain[c.Name] = true
		prev, ok := a.applied.chains[c.Name]
		switch {
		case !ok:
			p.add(&p.pre, txAdd, chainObject(c))
			st.Objects++
			p.writeRules(c, st, next)
		case slices.Equal(prev, c.Rules):
			next.chains[c.Name] = prev
		case orderFree(c.Name):
			if err := a.patchRules(ctx, p, c, prev, st, next); err != nil {
				return err
			}
		default:
			p.writeRules(c, st, next)
		}
	}
	for _, c := range rs.changes {
		if s := byData[c.set]; c.had && s != nil {
			p.change(elemOp{verb: elemDelete, set: s, key: c.key})
			st.ElementDeletes++
		}
	}
	for _, c := range rs.changes {
		if s := byData[c.set]; c.has && s != nil {
			p.change(elemOp{verb: elemAdd, set: s, key: c.key, value: c.new})
			st.ElementAdds++
		}
	}
	for _, s := range fill {
		p.refill(s, rs, st)
	}
	for _, n := range sortedKeys(a.applied.chains) {
		if !wantChain[n] {
			p.add(&p.post, txFlush, &knftables.Chain{Name: n})
		}
	}
	for _, n := range sortedKeys(a.applied.sets) {
		if byName[n] == nil {
			st.Objects++
			p.add(&p.post, txDelete, a.applied.sets[n].object())
		}
	}
	for _, n := range sortedKeys(a.applied.chains) {
		if !wantChain[n] {
			st.Objects++
			p.add(&p.post, txDelete, &knftables.Chain{Name: n})
		}
	}
	return nil
}

// patchRules appends the rules of an order-free chain that prev lacks and
// deletes (by handle, after the elements moved) those c no longer has.
func (a *Applier) patchRules(ctx context.Context, p *plan, c *Chain, prev []string, st *Stats, next *applied) error {
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
		p.add(&p.post, txDelete, &knftables.Rule{Chain: c.Name, Handle: &h})
		st.Rules++
	}
	for _, r := range c.Rules {
		if !had[r] {
			p.addRule(c.Name, r, st)
			kept = append(kept, r)
		}
	}
	next.chains[c.Name] = kept
	return nil
}

// purgeAffinity plans the deletion of the affinity entries pointing to a
// backend their frontend no longer has, with the element changes. An entry
// may expire between the listing and the commit, and deleting a missing
// element fails the transaction: each is re-added (a no-op while it
// exists) just before its deletion.
func (a *Applier) purgeAffinity(ctx context.Context, p *plan, rs *Ruleset, st *Stats) error {
	for i := range rs.Sets {
		s := &rs.Sets[i]
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
			if rs.affinityValidParts(s, e.Key, e.Value) {
				continue
			}
			k, err := encode(nil, s.keyFields, e.Key)
			if err != nil {
				return fmt.Errorf("map %s: element %s: %w", s.Name, strings.Join(e.Key, " . "), err)
			}
			v, err := encode(nil, s.valueFields, e.Value)
			if err != nil {
				return fmt.Errorf("map %s: element %s: value %s: %w", s.Name, strings.Join(e.Key, " . "), strings.Join(e.Value, " . "), err)
			}
			p.change(elemOp{verb: elemAdd, set: s, key: toPacked(k), value: toValue(v)})
			p.change(elemOp{verb: elemDelete, set: s, key: toPacked(k)})
			st.AffinityPurged++
		}
	}
	return nil
}

// sortOps sorts element operations of s by the nft text of their keys.
func sortOps(s *Set, ops []elemOp) {
	texts := make(map[packed]string, len(ops))
	for _, op := range ops {
		texts[op.key] = s.keyString(op.key)
	}
	slices.SortFunc(ops, func(a, b elemOp) int { return strings.Compare(texts[a.key], texts[b.key]) })
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
