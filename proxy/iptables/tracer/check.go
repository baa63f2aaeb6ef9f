package tracer

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Check reports static problems of the interpreted tables (duplicate
// declarations first, then per table, filter before nat, in chain order):
//   - a chain declared twice;
//   - rules appended to a chain that is never declared;
//   - a jump or goto to a chain that is not declared in the rule's table,
//     or to a built-in chain;
//   - jump/goto cycles between chains (iptables-restore rejects them).
func (r *Ruleset) Check() []error {
	errs := slices.Clone(r.dups)
	for _, tb := range r.tables() {
		for _, name := range tb.Order {
			c := tb.Chains[name]
			if !c.Declared && !c.Builtin && len(c.Rules) > 0 {
				errs = append(errs, fmt.Errorf("table %s: line %d: rule appended to undeclared chain %s",
					tb.Name, c.Rules[0].Line, name))
			}
			for _, rl := range c.Rules {
				if rl.target.kind != "jump" && rl.target.kind != "goto" {
					continue
				}
				switch to := tb.Chains[rl.target.chain]; {
				case to == nil || !to.Declared:
					errs = append(errs, fmt.Errorf("table %s: line %d: %s to undeclared chain %s (in %q)",
						tb.Name, rl.Line, rl.target.kind, rl.target.chain, rl.Text))
				case to.Builtin:
					errs = append(errs, fmt.Errorf("table %s: line %d: %s to built-in chain %s",
						tb.Name, rl.Line, rl.target.kind, rl.target.chain))
				}
			}
		}
		errs = append(errs, cycles(tb)...)
	}
	return errs
}

// CheckPrefix is Check plus: every declared user chain whose name starts
// with prefix must be the target of some jump or goto in its table.
func (r *Ruleset) CheckPrefix(prefix string) []error {
	errs := r.Check()
	for _, tb := range r.tables() {
		used := map[string]bool{}
		for _, c := range tb.Chains {
			for _, rl := range c.Rules {
				if rl.target.kind == "jump" || rl.target.kind == "goto" {
					used[rl.target.chain] = true
				}
			}
		}
		for _, name := range tb.Order {
			c := tb.Chains[name]
			if c.Declared && !c.Builtin && strings.HasPrefix(name, prefix) && !used[name] {
				errs = append(errs, fmt.Errorf("table %s: line %d: chain %s is declared but never jumped to",
					tb.Name, c.Line, name))
			}
		}
	}
	return errs
}

func (r *Ruleset) tables() []*Table {
	names := make([]string, 0, len(r.Tables))
	for n := range r.Tables {
		names = append(names, n)
	}
	sort.Strings(names)
	tbs := make([]*Table, len(names))
	for i, n := range names {
		tbs[i] = r.Tables[n]
	}
	return tbs
}

// cycles finds jump/goto cycles by depth-first search, reporting each cycle
// once, from the first chain (in declaration order) through which it is found.
func cycles(tb *Table) []error {
	const (
		unseen = iota
		active
		finished
	)
	color := map[string]int{}
	var errs []error
	var stack []string
	var visit func(name string)
	visit = func(name string) {
		c := tb.Chains[name]
		if c == nil {
			return
		}
		color[name] = active
		stack = append(stack, name)
		for _, rl := range c.Rules {
			to := rl.target.chain
			if rl.target.kind != "jump" && rl.target.kind != "goto" {
				continue
			}
			switch color[to] {
			case active:
				i := slices.Index(stack, to)
				errs = append(errs, fmt.Errorf("table %s: line %d: jump loop %s -> %s",
					tb.Name, rl.Line, strings.Join(stack[i:], " -> "), to))
			case unseen:
				visit(to)
			}
		}
		stack = stack[:len(stack)-1]
		color[name] = finished
	}
	for _, name := range tb.Order {
		if color[name] == unseen {
			visit(name)
		}
	}
	return errs
}
