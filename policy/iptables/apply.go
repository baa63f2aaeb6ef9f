package iptables

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Runner executes the kernel tools; tests may record instead.
type Runner interface {
	IPSetRestore(payload []byte) error
	IPSetNames() ([]string, error)
	IPTablesRestore(payload []byte) error
	IPTablesSave() ([]byte, error) // the filter table, with counters
	EnsureBridgeNetfilter() error
	FirstRule(chain string) (string, error) // rule 1 of a filter chain, "" if none
}

// Applier keeps the node's policy state of one family in line with
// rendered rulesets of that family.
type Applier struct {
	Family  int // 4 (default) or 6
	Runner  Runner
	chains  map[string][]string // applied chains
	sets    map[string][]string // applied sets
	applied bool
}

// Stats describe one apply.
type Stats struct{ Sets, Chains, DeletedChains, DeletedSets int }

// Apply programs rs (see the package doc for the order that keeps it
// hole-free). The first apply rewrites every chain the kernel does not
// hold as wanted; later ones only what changed.
func (a *Applier) Apply(rs *Ruleset) (Stats, error) {
	var st Stats
	if a.Runner == nil {
		a.Runner = Exec{Family: a.Family}
	}
	if rs.Family != familyNumber(a.Family) {
		return st, fmt.Errorf("IPv%d ruleset given to the IPv%d applier", rs.Family, familyNumber(a.Family))
	}
	fam := familyOf(a.Family)
	if err := a.Runner.EnsureBridgeNetfilter(); err != nil {
		return st, err
	}
	if !a.applied {
		a.chains, a.sets = map[string][]string{}, map[string][]string{}
	}
	// 1. Sets: create new ones, swap changed contents in.
	var sb strings.Builder
	want := map[string]bool{}
	for _, s := range rs.Sets {
		want[s.Name] = true
		if cur, ok := a.sets[s.Name]; ok && slices.Equal(cur, s.Members) {
			continue
		}
		tmp := fam.tempPrefix() + strings.TrimPrefix(s.Name, fam.setPrefix())
		fmt.Fprintf(&sb, "create %s %s family %s maxelem 1048576 -exist\nflush %s\n", tmp, s.Type, fam.ipset(), tmp)
		for _, m := range s.Members {
			fmt.Fprintf(&sb, "add %s %s -exist\n", tmp, m)
		}
		fmt.Fprintf(&sb, "create %s %s family %s maxelem 1048576 -exist\nswap %s %s\ndestroy %s\n", s.Name, s.Type, fam.ipset(), tmp, s.Name, tmp)
		st.Sets++
	}
	for _, s := range rs.External { // created, never flushed: another writer fills them
		want[s.Name] = true
		if _, ok := a.sets[s.Name]; !ok {
			fmt.Fprintf(&sb, "create %s %s family %s maxelem 1048576 -exist\n", s.Name, s.Type, fam.ipset())
		}
	}
	if sb.Len() > 0 {
		if err := a.Runner.IPSetRestore([]byte(sb.String())); err != nil {
			a.applied = false
			return st, err
		}
		for _, s := range rs.Sets {
			a.sets[s.Name] = s.Members
		}
		for _, s := range rs.External {
			a.sets[s.Name] = nil
		}
	}
	// 2. Chains and jumps, one transaction. The kernel's filter table is
	// read on a full apply, or when a jump is no longer first; otherwise
	// the applier trusts what it applied (ForceFull repairs drift).
	kernel, err := a.kernelView()
	if err != nil {
		return st, err
	}
	var declare, rules, deletes, jumps []string
	wantChain := map[string]bool{}
	for _, c := range rs.Chains {
		wantChain[c.Name] = true
		// A chain already as wanted is left alone: by what this applier
		// applied, or on a full apply by what the kernel holds (a rewrite
		// would also reset its counters, the drop chains' being the
		// dropped packets metric).
		if cur, ok := a.chains[c.Name]; ok && kernel.chains[c.Name] && slices.Equal(cur, c.Rules) {
			continue
		}
		if kernel.read && kernel.chains[c.Name] && slices.Equal(kernel.rules[c.Name], c.Rules) {
			continue
		}
		declare = append(declare, ":"+c.Name+" - [0:0]")
		for _, r := range c.Rules {
			rules = append(rules, "-A "+c.Name+" "+r)
		}
		st.Chains++
	}
	for name := range kernel.chains {
		if strings.HasPrefix(name, Prefix) && !wantChain[name] {
			declare = append(declare, ":"+name+" - [0:0]") // flush it first
			deletes = append(deletes, "-X "+name)
			st.DeletedChains++
		}
	}
	slices.Sort(deletes)
	for _, j := range rs.Jumps {
		if first := kernel.first[j.Chain]; first == j.Rule {
			continue
		}
		if slices.Contains(kernel.rules[j.Chain], j.Rule) {
			jumps = append(jumps, "-D "+j.Chain+" "+j.Rule)
		}
		jumps = append(jumps, "-I "+j.Chain+" 1 "+j.Rule)
	}
	if len(declare)+len(jumps) > 0 {
		var b bytes.Buffer
		b.WriteString("*filter\n")
		for _, l := range [][]string{declare, rules, jumps, deletes} {
			for _, s := range l {
				b.WriteString(s + "\n")
			}
		}
		b.WriteString("COMMIT\n")
		if err := a.Runner.IPTablesRestore(b.Bytes()); err != nil {
			a.applied = false
			return st, err
		}
	}
	a.chains = map[string][]string{}
	for _, c := range rs.Chains {
		a.chains[c.Name] = c.Rules
	}
	a.applied = true
	// 3. Sets nobody references any more.
	names, err := a.Runner.IPSetNames()
	if err != nil {
		return st, err
	}
	sb.Reset()
	for _, n := range names {
		if (strings.HasPrefix(n, fam.setPrefix()) || strings.HasPrefix(n, fam.tempPrefix())) && !want[n] {
			fmt.Fprintf(&sb, "destroy %s\n", n)
			delete(a.sets, n)
			st.DeletedSets++
		}
	}
	if sb.Len() > 0 {
		if err := a.Runner.IPSetRestore([]byte(sb.String())); err != nil {
			return st, fmt.Errorf("destroying unused sets: %w", err)
		}
	}
	return st, nil
}

// kernelView is the filter table as Apply needs it: read from the kernel
// on a full apply or when a policy jump is not first any more, otherwise
// the applied chains with the jumps in place.
func (a *Applier) kernelView() (saved, error) {
	if a.applied {
		firstOK := true
		for _, j := range Jumps() {
			first, err := a.Runner.FirstRule(j.Chain)
			if err != nil {
				return saved{}, err
			}
			firstOK = firstOK && first == j.Rule
		}
		if firstOK {
			v := saved{chains: map[string]bool{}, first: map[string]string{}}
			for name := range a.chains {
				v.chains[name] = true
			}
			for _, j := range Jumps() {
				v.first[j.Chain] = j.Rule
			}
			return v, nil
		}
	}
	b, err := a.Runner.IPTablesSave()
	if err != nil {
		return saved{}, err
	}
	return parseSave(b), nil
}

// ForceFull makes the next Apply read the kernel and rewrite every chain
// that differs from the wanted one (periodic resyncs repair drift this way).
func (a *Applier) ForceFull() { a.applied = false }

// Cleanup removes every policy chain, jump and set.
func (a *Applier) Cleanup() error {
	if a.Runner == nil {
		a.Runner = Exec{Family: a.Family}
	}
	a.applied = false
	var errs []error
	if saved, err := a.Runner.IPTablesSave(); err != nil {
		errs = append(errs, err)
	} else {
		k := parseSave(saved)
		var b strings.Builder
		b.WriteString("*filter\n")
		for _, j := range Jumps() {
			if slices.Contains(k.rules[j.Chain], j.Rule) {
				b.WriteString("-D " + j.Chain + " " + j.Rule + "\n")
			}
		}
		var names []string
		for n := range k.chains {
			if strings.HasPrefix(n, Prefix) {
				names = append(names, n)
				b.WriteString(":" + n + " - [0:0]\n")
			}
		}
		slices.Sort(names)
		for _, n := range names {
			b.WriteString("-X " + n + "\n")
		}
		b.WriteString("COMMIT\n")
		if err := a.Runner.IPTablesRestore([]byte(b.String())); err != nil {
			errs = append(errs, err)
		}
	}
	if names, err := a.Runner.IPSetNames(); err != nil {
		errs = append(errs, err)
	} else {
		var b strings.Builder
		for _, n := range names {
			if strings.HasPrefix(n, familyOf(a.Family).setPrefix()) || strings.HasPrefix(n, familyOf(a.Family).tempPrefix()) {
				b.WriteString("destroy " + n + "\n")
			}
		}
		if b.Len() > 0 {
			if err := a.Runner.IPSetRestore([]byte(b.String())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Drops reads the packets dropped by policy so far, per direction.
func (a *Applier) Drops() (ingress, egress uint64, err error) {
	if a.Runner == nil {
		a.Runner = Exec{Family: a.Family}
	}
	saved, err := a.Runner.IPTablesSave()
	if err != nil {
		return 0, 0, err
	}
	k := parseSave(saved)
	return k.drops[ChainDropIn], k.drops[ChainDropOut], nil
}

// saved is what Apply needs from iptables-save.
type saved struct {
	chains map[string]bool
	rules  map[string][]string // chain -> rules, in order
	read   bool                // from the kernel; else what this applier applied, without rules
	first  map[string]string
	drops  map[string]uint64 // drop chain -> packets of its DROP rule
}

func parseSave(b []byte) saved {
	s := saved{chains: map[string]bool{}, rules: map[string][]string{}, first: map[string]string{}, drops: map[string]uint64{}, read: true}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		line := sc.Text()
		var packets uint64
		if strings.HasPrefix(line, "[") { // counters: [packets:bytes]
			end := strings.IndexByte(line, ']')
			if end < 0 {
				continue
			}
			if i := strings.IndexByte(line[:end], ':'); i > 0 {
				packets, _ = strconv.ParseUint(line[1:i], 10, 64)
			}
			line = strings.TrimSpace(line[end+1:])
		}
		switch {
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			s.chains[name] = true
		case strings.HasPrefix(line, "-A "):
			chain, rule, _ := strings.Cut(line[3:], " ")
			if len(s.rules[chain]) == 0 && (chain == "FORWARD" || chain == "INPUT") {
				s.first[chain] = rule
			}
			s.rules[chain] = append(s.rules[chain], rule)
			if (chain == ChainDropIn || chain == ChainDropOut) && strings.HasSuffix(rule, "-j DROP") {
				s.drops[chain] += packets
			}
		}
	}
	return s
}

func familyNumber(n int) int {
	if n == 6 {
		return 6
	}
	return 4
}
