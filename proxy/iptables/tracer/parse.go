package tracer

import (
	"fmt"
	"slices"
	"strings"
)

// Ruleset is a parsed iptables-save / iptables-restore text.
type Ruleset struct {
	// Tables holds the interpreted tables, "nat" and "filter", by name.
	Tables map[string]*Table
	// Ignored counts the rules of tables whose content is not interpreted
	// (mangle, raw, security, ...), by table name.
	Ignored map[string]int
	// Sets are the ipsets defined in the text by ipset save lines
	// ("create NAME TYPE ...", "add NAME MEMBER"), outside the tables.
	Sets map[string]*Set
	// dups records repeated chain declarations, reported by Check.
	dups []error
}

// Table is one interpreted table.
type Table struct {
	Name   string
	Chains map[string]*Chain
	Order  []string // chain names in order of first appearance
}

// Chain is one chain of a table. Chains that rules append to or jump to
// without declaring them exist with Declared false (see Check).
type Chain struct {
	Name     string
	Builtin  bool
	Policy   string // "ACCEPT" or "DROP" for built-in chains, "" otherwise
	Declared bool   // by ":NAME POLICY [x:y]" or "-N NAME"
	Line     int    // line of the declaration, or of the first mention
	Rules    []*Rule
}

// Rule is one "-A CHAIN ..." line.
type Rule struct {
	Line    int
	Text    string // the line as written
	Chain   string
	Comment string // from -m comment --comment
	matches []matcher
	target  target
}

// ParseError is returned by Parse for a line it cannot interpret.
type ParseError struct {
	Line int
	Text string
	Msg  string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("line %d: %s (in %q)", e.Line, e.Msg, e.Text)
}

var builtins = map[string][]string{
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
}

func isBuiltin(table, chain string) bool { return slices.Contains(builtins[table], chain) }

// chain returns the named chain of t, creating an undeclared one (at line)
// when it does not exist yet. Built-in chains get policy ACCEPT.
func (t *Table) chain(name string, line int) *Chain {
	if c, ok := t.Chains[name]; ok {
		return c
	}
	c := &Chain{Name: name, Builtin: isBuiltin(t.Name, name), Line: line}
	if c.Builtin {
		c.Policy = "ACCEPT"
	}
	t.Chains[name] = c
	t.Order = append(t.Order, name)
	return c
}

// Parse reads an iptables-save format text. Every line it cannot interpret
// exactly (unknown command, match module, option, target option, malformed
// address, unterminated quote, ...) is an error naming the line, so that
// Trace never silently mis-evaluates. The content of tables other than nat
// and filter is only tokenized and counted.
func Parse(text string) (*Ruleset, error) {
	rs := &Ruleset{Tables: map[string]*Table{}, Ignored: map[string]int{}, Sets: map[string]*Set{}}
	var cur *Table // the open interpreted table
	open := ""     // the open table's name, "" between tables
	seen := map[string]bool{}
	last := 0
	for i, raw := range strings.Split(text, "\n") {
		ln, line := i+1, strings.TrimSpace(raw)
		if line == "" || line[0] == '#' {
			continue
		}
		last = ln
		fail := func(format string, a ...any) error {
			return &ParseError{Line: ln, Text: line, Msg: fmt.Sprintf(format, a...)}
		}
		switch {
		case line[0] == '*':
			if open != "" {
				return nil, fail("table %q opened before COMMIT of table %q", line[1:], open)
			}
			open = line[1:]
			if open == "" || strings.ContainsAny(open, " \t") {
				return nil, fail("bad table name")
			}
			if seen[open] {
				return nil, fail("table %q appears twice", open)
			}
			seen[open] = true
			cur = nil
			if _, ok := builtins[open]; ok {
				cur = &Table{Name: open, Chains: map[string]*Chain{}}
				rs.Tables[open] = cur
			} else {
				rs.Ignored[open] = 0
			}
		case line == "COMMIT":
			if open == "" {
				return nil, fail("COMMIT outside a table")
			}
			open, cur = "", nil
		case open == "" && (strings.HasPrefix(line, "create ") || strings.HasPrefix(line, "add ")):
			if err := rs.setLine(line); err != nil {
				return nil, fail("%v", err)
			}
		case open == "":
			return nil, fail("line outside a table (missing *table line)")
		case line[0] == ':':
			f := strings.Fields(line[1:])
			if len(f) < 2 || len(f) > 3 || (len(f) == 3 && !isCounters(f[2])) {
				return nil, fail("bad chain declaration, want \":NAME POLICY [packets:bytes]\"")
			}
			if cur == nil {
				continue
			}
			if err := rs.declare(cur, f[0], f[1], ln); err != nil {
				return nil, fail("%v", err)
			}
		default:
			toks, err := tokenize(line)
			if err != nil {
				return nil, fail("%v", err)
			}
			if len(toks) > 0 && isCounters(toks[0]) { // iptables-save -c
				toks = toks[1:]
			}
			if len(toks) < 2 {
				return nil, fail("want a command and a chain name")
			}
			if cur == nil {
				if toks[0] == "-A" || toks[0] == "--append" {
					rs.Ignored[open]++
				}
				continue
			}
			if err := rs.command(cur, toks, ln, line); err != nil {
				return nil, fail("%v", err)
			}
		}
	}
	if open != "" {
		return nil, &ParseError{Line: last + 1, Text: "", Msg: fmt.Sprintf("table %q lacks COMMIT", open)}
	}
	return rs, nil
}

func isCounters(s string) bool {
	return len(s) >= 3 && s[0] == '[' && s[len(s)-1] == ']' && strings.Contains(s, ":")
}

func (rs *Ruleset) declare(t *Table, name, policy string, ln int) error {
	builtin := isBuiltin(t.Name, name)
	switch {
	case builtin && policy != "ACCEPT" && policy != "DROP":
		return fmt.Errorf("built-in chain %s needs policy ACCEPT or DROP, not %q", name, policy)
	case !builtin && policy != "-":
		return fmt.Errorf("user chain %s must have policy \"-\", not %q", name, policy)
	case strings.HasPrefix(name, "-") || name == "!":
		return fmt.Errorf("bad chain name %q", name)
	}
	c := t.chain(name, ln)
	if c.Declared {
		rs.dups = append(rs.dups, fmt.Errorf("table %s: line %d: chain %s declared again (first at line %d)",
			t.Name, ln, name, c.Line))
	} else {
		c.Declared, c.Line = true, ln
	}
	if builtin {
		c.Policy = policy
	}
	return nil
}

// command handles -A, -N and -X lines of an interpreted table.
func (rs *Ruleset) command(t *Table, toks []string, ln int, line string) error {
	name := toks[1]
	switch toks[0] {
	case "-A", "--append":
		r, err := parseRule(t.Name, toks[2:])
		if err != nil {
			return err
		}
		r.Line, r.Text, r.Chain = ln, line, name
		c := t.chain(name, ln)
		c.Rules = append(c.Rules, r)
	case "-N", "--new-chain":
		if len(toks) != 2 {
			return fmt.Errorf("-N takes one chain name")
		}
		return rs.declare(t, name, "-", ln)
	case "-X", "--delete-chain":
		c, ok := t.Chains[name]
		switch {
		case len(toks) != 2:
			return fmt.Errorf("-X takes one chain name")
		case !ok:
			return fmt.Errorf("-X of unknown chain %s", name)
		case c.Builtin:
			return fmt.Errorf("cannot delete built-in chain %s", name)
		case len(c.Rules) > 0:
			return fmt.Errorf("cannot delete non-empty chain %s", name)
		}
		delete(t.Chains, name)
		t.Order = slices.DeleteFunc(t.Order, func(s string) bool { return s == name })
	default:
		return fmt.Errorf("unsupported command %q (only -A, -N, -X)", toks[0])
	}
	return nil
}

// tokenize splits a line on blanks, honouring "double" and 'single' quotes
// and backslash escapes (inside double quotes and outside quotes).
func tokenize(line string) ([]string, error) {
	var toks []string
	var b strings.Builder
	in := false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case c == ' ' || c == '\t':
			if in {
				toks = append(toks, b.String())
				b.Reset()
				in = false
			}
		case c == '"' || c == '\'':
			in = true
			j := i + 1
			for ; j < len(line) && line[j] != c; j++ {
				if line[j] == '\\' && c == '"' && j+1 < len(line) {
					j++
				}
				b.WriteByte(line[j])
			}
			if j >= len(line) {
				return nil, fmt.Errorf("unterminated %c quote starting at column %d", c, i+1)
			}
			i = j
		case c == '\\' && i+1 < len(line):
			in = true
			i++
			b.WriteByte(line[i])
		default:
			in = true
			b.WriteByte(c)
		}
	}
	if in {
		toks = append(toks, b.String())
	}
	return toks, nil
}
