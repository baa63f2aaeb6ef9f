package nftables

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	polipt "github.com/weftnet/weft/policy/iptables"
)

// Applier keeps weft's two policy tables in line with rendered rulesets,
// one transaction per table and Apply: the inet table's transaction holds
// every change of the policy rules, so a packet is judged by the old or by
// the new state, never by a mix.
type Applier struct {
	Inet, Bridge knftables.Interface
	// BridgeNetfilter makes bridged (same-node) traffic visible to the
	// inet table (default: both bridge-nf-call sysctls set to 1).
	BridgeNetfilter func() error
	inet, bridge    tableApplier
}

// New returns an applier on the system's nft, after checking that nft and
// the kernel accept weft's tables; the error names what is missing.
func New(ctx context.Context) (*Applier, error) {
	inet, err := knftables.New(knftables.InetFamily, TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables policy needs the nft tool, version 1.0.1 or later: %w", err)
	}
	bridge, err := knftables.New(knftables.BridgeFamily, TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables policy needs the nft tool, version 1.0.1 or later: %w", err)
	}
	a := &Applier{Inet: inet, Bridge: bridge}
	if err := a.Check(ctx); err != nil {
		return nil, err
	}
	return a, nil
}

// Check asks the kernel, without changing anything, whether it accepts
// both tables with every feature the rules use.
func (a *Applier) Check(ctx context.Context) error {
	rs := Render(checkState(), Config{NodeName: "check", LogDrops: true, LogGroup: 1, PodPorts: "weft*", PodBridges: []string{"weft0"},
		Sources: []Source{{Port: "weft0", Addrs: checkState().Pods[0].IPs}}})
	for _, c := range []struct {
		nft    knftables.Interface
		t      *Table
		family string
	}{{a.Inet, &rs.Inet, "inet"}, {a.Bridge, rs.Bridge, "bridge"}} {
		tx := c.nft.NewTransaction()
		(&tableApplier{nft: c.nft}).fresh(tx, c.t, &Stats{})
		if err := c.nft.Check(ctx, tx); err != nil {
			return fmt.Errorf("nftables policy: the kernel refused table %s %s (it needs nf_tables with the %s family, "+
				"concatenated interval sets, verdict maps, fib, ct, limit, log and nflog): %w", c.family, TableName, c.family, err)
		}
	}
	return nil
}

// Stats describe one Apply.
type Stats struct {
	Full bool
	// Rules written, element adds and deletes, chains and sets created
	// or deleted.
	Rules, ElementAdds, ElementDeletes, Objects int
}

// Apply programs rs: a full apply (the first, after ForceFull, after a
// failure) rewrites the elements of every set but the ready sets, every
// chain whose rules the kernel does not hold as wanted, and deletes what
// the tables have that rs does not; a later one sends only what changed
// since the last apply. A failed transaction leaves that table as it was.
func (a *Applier) Apply(ctx context.Context, rs *Ruleset) (Stats, error) {
	ensure := a.BridgeNetfilter
	if ensure == nil {
		ensure = ensureBridgeNetfilter
	}
	if err := ensure(); err != nil {
		return Stats{}, err
	}
	a.inet.nft, a.bridge.nft = a.Inet, a.Bridge
	st, err := a.inet.apply(ctx, &rs.Inet)
	if err != nil {
		return st, fmt.Errorf("table inet %s: %w", TableName, err)
	}
	var bst Stats
	if rs.Bridge != nil {
		bst, err = a.bridge.apply(ctx, rs.Bridge)
	} else if a.bridge.applied != nil || st.Full {
		err = deleteTable(ctx, a.Bridge)
		a.bridge.applied = nil
	}
	if err != nil {
		return st, fmt.Errorf("table bridge %s: %w", TableName, err)
	}
	st.Rules += bst.Rules
	st.ElementAdds += bst.ElementAdds
	st.ElementDeletes += bst.ElementDeletes
	st.Objects += bst.Objects
	return st, nil
}

// ForceFull makes the next Apply full (the agent's periodic resync
// repairs drift this way).
func (a *Applier) ForceFull() { a.inet.applied, a.bridge.applied = nil, nil }

// Cleanup deletes both tables, and with them everything the backend and
// the ready sets installed; no other table is touched.
func (a *Applier) Cleanup(ctx context.Context) error {
	a.ForceFull()
	return errors.Join(deleteTable(ctx, a.Inet), deleteTable(ctx, a.Bridge))
}

func deleteTable(ctx context.Context, nft knftables.Interface) error {
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{}) // so that deleting a missing table succeeds
	tx.Delete(&knftables.Table{})
	return nft.Run(ctx, tx)
}

var counterRE = regexp.MustCompile(`counter packets (\d+)`)

// Drops reads the packets dropped by policy so far, per direction (the
// counters of the drop chains), with the nft tool.
func (a *Applier) Drops(ctx context.Context) (ingress, egress uint64, err error) {
	read := func(chain string) (uint64, error) {
		out, err := exec.CommandContext(ctx, "nft", "list", "chain", "inet", TableName, chain).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("nft list chain inet %s %s: %w: %s", TableName, chain, err, strings.TrimSpace(string(out)))
		}
		var n uint64
		for _, m := range counterRE.FindAllStringSubmatch(string(out), -1) {
			v, _ := strconv.ParseUint(m[1], 10, 64)
			n += v
		}
		return n, nil
	}
	if ingress, err = read(ChainDropIn); err != nil {
		return 0, 0, err
	}
	egress, err = read(ChainDropOut)
	return ingress, egress, err
}

func ensureBridgeNetfilter() error {
	return errors.Join(polipt.Exec{}.EnsureBridgeNetfilter(), polipt.Exec{Family: 6}.EnsureBridgeNetfilter())
}

// tableApplier applies one table.
type tableApplier struct {
	nft knftables.Interface
	// applied is what the last successful apply left (nil: unknown, the
	// next apply is full).
	applied *Table
}

func ruleID(rule string) string {
	h := sha256.Sum256([]byte(rule))
	return hex.EncodeToString(h[:8])
}

func (t *tableApplier) apply(ctx context.Context, want *Table) (Stats, error) {
	tx := t.nft.NewTransaction()
	st := Stats{Full: t.applied == nil}
	var err error
	if st.Full {
		err = t.full(ctx, tx, want, &st)
	} else {
		t.partial(tx, want, &st)
	}
	if err == nil && tx.NumOperations() > 0 {
		err = t.nft.Run(ctx, tx)
	}
	if err != nil && st.Full {
		// The table could not be rewritten in place (a set of another
		// type, say): rewrite it from nothing, in one transaction still,
		// keeping the external sets and their elements.
		tx, st = t.nft.NewTransaction(), Stats{Full: true}
		if rerr := t.recreate(ctx, tx, want, &st); rerr != nil {
			err = fmt.Errorf("%w; recreating it: %w", err, rerr)
		} else if rerr := t.nft.Run(ctx, tx); rerr != nil {
			err = fmt.Errorf("%w; recreating it: %w", err, rerr)
		} else {
			err = nil
		}
	}
	if err != nil {
		t.applied = nil
		return st, err
	}
	t.applied = want
	return st, nil
}

func setObject(s *Set) knftables.Object {
	var flags []knftables.SetFlag
	if s.Interval {
		flags = []knftables.SetFlag{knftables.IntervalFlag}
	}
	if s.Verdict {
		return &knftables.Map{Name: s.Name, Type: s.Type + " : verdict", Flags: flags}
	}
	return &knftables.Set{Name: s.Name, Type: s.Type, Flags: flags}
}

func setOrMap(name string, isMap bool) knftables.Object {
	if isMap {
		return &knftables.Map{Name: name}
	}
	return &knftables.Set{Name: name}
}

func elementObject(s *Set, e Element) *knftables.Element {
	if s.Verdict {
		return &knftables.Element{Map: s.Name, Key: e.Key, Value: e.Value}
	}
	return &knftables.Element{Set: s.Name, Key: e.Key}
}

func chainObject(c *Chain) *knftables.Chain {
	ch := &knftables.Chain{Name: c.Name}
	if c.Hook != "" {
		ch.Type, ch.Hook, ch.Priority = knftables.PtrTo(knftables.FilterType), knftables.PtrTo(c.Hook), knftables.PtrTo(c.Priority)
	}
	return ch
}

// writeChain flushes c and writes its rules, each carrying its id as
// comment (what a full apply compares with the kernel's).
func writeChain(tx *knftables.Transaction, c *Chain, st *Stats) {
	tx.Flush(&knftables.Chain{Name: c.Name})
	for _, r := range c.Rules {
		tx.Add(&knftables.Rule{Chain: c.Name, Rule: r, Comment: knftables.PtrTo(ruleID(r))})
		st.Rules++
	}
}

// fresh fills tx with the whole table, as on an empty kernel.
func (t *tableApplier) fresh(tx *knftables.Transaction, want *Table, st *Stats) {
	tx.Add(&knftables.Table{})
	for i := range want.Sets {
		tx.Add(setObject(&want.Sets[i]))
		st.Objects++
	}
	for i := range want.Chains {
		tx.Add(chainObject(&want.Chains[i]))
		st.Objects++
	}
	for i := range want.Sets {
		for _, e := range want.Sets[i].Elements {
			tx.Add(elementObject(&want.Sets[i], e))
			st.ElementAdds++
		}
	}
	for i := range want.Chains {
		writeChain(tx, &want.Chains[i], st)
	}
}

// kernelTable is what a full apply reads of the kernel's table.
type kernelTable struct {
	chains   []string
	sets     []string // sets and maps
	maps     map[string]bool
	comments map[string][]string
}

func (t *tableApplier) read(ctx context.Context) (kernelTable, error) {
	k := kernelTable{comments: map[string][]string{}, maps: map[string]bool{}}
	var err error
	if k.chains, err = t.nft.List(ctx, "chains"); err != nil && !knftables.IsNotFound(err) {
		return k, err
	}
	for _, typ := range []string{"sets", "maps"} {
		names, err := t.nft.List(ctx, typ)
		if err != nil && !knftables.IsNotFound(err) {
			return k, err
		}
		k.sets = append(k.sets, names...)
		for _, n := range names {
			k.maps[n] = typ == "maps"
		}
	}
	if len(k.chains) == 0 {
		return k, nil
	}
	rules, err := t.nft.ListRules(ctx, "")
	if err != nil && !knftables.IsNotFound(err) {
		return k, err
	}
	for _, r := range rules {
		c := ""
		if r.Comment != nil {
			c = *r.Comment
		}
		k.comments[r.Chain] = append(k.comments[r.Chain], c)
	}
	return k, nil
}

// full rewrites the table in place: every object added (a no-op when it
// exists), every set but the external ones flushed and refilled, every
// chain whose rules the kernel does not hold as wanted rewritten (the
// others keep their counters), and what the kernel has that want does not
// deleted.
func (t *tableApplier) full(ctx context.Context, tx *knftables.Transaction, want *Table, st *Stats) error {
	k, err := t.read(ctx)
	if err != nil {
		return err
	}
	tx.Add(&knftables.Table{})
	wantSet, wantChain := map[string]bool{}, map[string]bool{}
	for i := range want.Sets {
		s := &want.Sets[i]
		wantSet[s.Name] = true
		tx.Add(setObject(s))
		if !slices.Contains(k.sets, s.Name) {
			st.Objects++
		}
	}
	for i := range want.Chains {
		c := &want.Chains[i]
		wantChain[c.Name] = true
		tx.Add(chainObject(c))
		if !slices.Contains(k.chains, c.Name) {
			st.Objects++
		}
	}
	for i := range want.Sets {
		s := &want.Sets[i]
		if s.External {
			continue
		}
		tx.Flush(setObject(s))
		for _, e := range s.Elements {
			tx.Add(elementObject(s, e))
			st.ElementAdds++
		}
	}
	for i := range want.Chains {
		c := &want.Chains[i]
		ids := make([]string, len(c.Rules))
		for j, r := range c.Rules {
			ids[j] = ruleID(r)
		}
		if slices.Contains(k.chains, c.Name) && slices.Equal(k.comments[c.Name], ids) {
			continue
		}
		writeChain(tx, c, st)
	}
	var stale []string
	for _, name := range k.chains {
		if !wantChain[name] {
			stale = append(stale, name)
		}
	}
	deleteChains(tx, stale, st)
	for _, name := range k.sets {
		if !wantSet[name] {
			tx.Delete(setOrMap(name, k.maps[name]))
			st.Objects++
		}
	}
	return nil
}

// deleteChains flushes every chain of names, then deletes them: a chain
// still named by a rule of another (a tier chain's goto) cannot go first.
func deleteChains(tx *knftables.Transaction, names []string, st *Stats) {
	for _, name := range names {
		tx.Flush(&knftables.Chain{Name: name})
	}
	for _, name := range names {
		tx.Delete(&knftables.Chain{Name: name})
		st.Objects++
	}
}

// recreate deletes every chain and every set but the external ones, then
// writes want.
func (t *tableApplier) recreate(ctx context.Context, tx *knftables.Transaction, want *Table, st *Stats) error {
	k, err := t.read(ctx)
	if err != nil {
		return err
	}
	external := map[string]bool{}
	for _, s := range want.Sets {
		external[s.Name] = s.External
	}
	tx.Add(&knftables.Table{})
	for _, name := range k.chains {
		tx.Flush(&knftables.Chain{Name: name})
	}
	for _, name := range k.chains {
		tx.Delete(&knftables.Chain{Name: name})
	}
	for _, name := range k.sets {
		if !external[name] {
			tx.Delete(setOrMap(name, k.maps[name]))
		}
	}
	keep := *want
	keep.Sets = slices.DeleteFunc(slices.Clone(want.Sets), func(s Set) bool { return s.External && slices.Contains(k.sets, s.Name) })
	t.fresh(tx, &keep, st)
	return nil
}

// partial sends what changed since the last apply: new sets and chains,
// element deletes and adds of changed sets, rewritten chains, then the
// chains and sets no longer wanted.
func (t *tableApplier) partial(tx *knftables.Transaction, want *Table, st *Stats) {
	oldSets := map[string]*Set{}
	for i := range t.applied.Sets {
		oldSets[t.applied.Sets[i].Name] = &t.applied.Sets[i]
	}
	oldChains := map[string]*Chain{}
	for i := range t.applied.Chains {
		oldChains[t.applied.Chains[i].Name] = &t.applied.Chains[i]
	}
	wantSet, wantChain := map[string]bool{}, map[string]bool{}
	for i := range want.Sets {
		s := &want.Sets[i]
		wantSet[s.Name] = true
		if oldSets[s.Name] == nil {
			tx.Add(setObject(s))
			st.Objects++
		}
	}
	for i := range want.Chains {
		c := &want.Chains[i]
		wantChain[c.Name] = true
		if oldChains[c.Name] == nil {
			tx.Add(chainObject(c))
			st.Objects++
		}
	}
	// Data sets before the rules that use them, verdict maps after the
	// chains they name.
	diff := func(verdict bool) {
		for i := range want.Sets {
			s := &want.Sets[i]
			if s.External || s.Verdict != verdict {
				continue
			}
			var old []Element
			if o := oldSets[s.Name]; o != nil {
				old = o.Elements
			}
			t.diffElements(tx, s, old, st)
		}
	}
	diff(false)
	for i := range want.Chains {
		c := &want.Chains[i]
		if o := oldChains[c.Name]; o == nil || !slices.Equal(o.Rules, c.Rules) {
			writeChain(tx, c, st)
		}
	}
	diff(true)
	var stale []string
	for _, c := range t.applied.Chains {
		if !wantChain[c.Name] {
			stale = append(stale, c.Name)
		}
	}
	deleteChains(tx, stale, st)
	for _, s := range t.applied.Sets {
		if !wantSet[s.Name] {
			tx.Delete(setOrMap(s.Name, s.Verdict))
			st.Objects++
		}
	}
}

// diffElements deletes the elements of old that s does not have (or has
// with another value) and adds those it lacks.
func (t *tableApplier) diffElements(tx *knftables.Transaction, s *Set, old []Element, st *Stats) {
	// Most sets are unchanged, and Render writes a set's elements in a
	// stable order: compare them in place before keying every element.
	if slices.EqualFunc(old, s.Elements, func(a, b Element) bool { return slices.Equal(a.Key, b.Key) && slices.Equal(a.Value, b.Value) }) {
		return
	}
	key := func(e Element) string { return strings.Join(e.Key, " . ") }
	have := make(map[string]Element, len(old))
	for _, e := range old {
		have[key(e)] = e
	}
	wanted := make(map[string]bool, len(s.Elements))
	var adds []Element
	for _, e := range s.Elements {
		k := key(e)
		wanted[k] = true
		if o, ok := have[k]; ok && slices.Equal(o.Value, e.Value) {
			continue
		} else if ok {
			tx.Delete(elementObject(s, o))
			st.ElementDeletes++
		}
		adds = append(adds, e)
	}
	for _, e := range old {
		if !wanted[key(e)] {
			tx.Delete(elementObject(s, e))
			st.ElementDeletes++
		}
	}
	for _, e := range adds {
		tx.Add(elementObject(s, e))
		st.ElementAdds++
	}
}
