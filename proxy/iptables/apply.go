package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// ownedPrefixes are the chain name prefixes of the service proxy. weft-agent's
// own chains (WEFT-POSTROUTING, WEFT-FORWARD) deliberately match none.
var ownedPrefixes = []string{
	chainServices, chainNodePorts, chainPostrouting, "WEFT-MARK-", "WEFT-PROXY-",
	"WEFT-EXT-", "WEFT-FW-", "WEFT-LB-", "WEFT-SEP-", "WEFT-VIPS-", "WEFT-NP-",
}

func owned(chain string) bool {
	for _, p := range ownedPrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// Runner executes the iptables tools; tests substitute a recorder.
type Runner interface {
	Restore(family int, payload []byte) error
	Save(family int, table string) ([]byte, error)
}

// Exec runs iptables-restore/iptables-save (ip6tables-* for IPv6), waiting
// for the xtables lock instead of failing.
type Exec struct {
	// Prefix selects the tools: "" for the system default, "legacy" or "nft".
	Variant string
}

func (e Exec) tool(family int, what string) string {
	t := "iptables"
	if family == 6 {
		t = "ip6tables"
	}
	if e.Variant != "" {
		t += "-" + e.Variant
	}
	return t + "-" + what
}

// Restore applies payload without flushing anything it does not name.
func (e Exec) Restore(family int, payload []byte) error {
	cmd := exec.Command(e.tool(family, "restore"), "--noflush", "-w", "5")
	cmd.Stdin = bytes.NewReader(payload)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", e.tool(family, "restore"), err, bytes.TrimSpace(out))
	}
	return nil
}

// Save dumps one table.
func (e Exec) Save(family int, table string) ([]byte, error) {
	out, err := exec.Command(e.tool(family, "save"), "-t", table).Output()
	if err != nil {
		return nil, fmt.Errorf("%s -t %s: %w", e.tool(family, "save"), table, err)
	}
	return out, nil
}

// Applier keeps one family's kernel state in line with rendered rulesets,
// sending only the chains that changed since the last apply.
type Applier struct {
	Family  int
	Runner  Runner
	applied map[string][]string // "table/chain" -> rules
}

// Stats describe one apply.
type Stats struct {
	Chains, Rules, Deleted int
	Full                   bool
}

// Apply programs rs. A full apply rewrites every weft chain, deletes weft
// chains the kernel has but rs lacks, and re-checks the jumps; a partial
// apply sends only the chains whose rules changed and deletes the chains
// that disappeared. Either way it is one iptables-restore transaction.
func (a *Applier) Apply(rs *Ruleset, full bool) (Stats, error) {
	st := Stats{Full: full || a.applied == nil}
	want := make(map[string][]string, len(rs.Chains))
	for _, c := range rs.Chains {
		want[c.Table+"/"+c.Name] = c.Rules
	}
	var existing map[string]bool
	var haveJumps map[string]bool
	if st.Full {
		var err error
		if existing, haveJumps, err = a.kernelState(); err != nil {
			return st, err
		}
	}
	var b bytes.Buffer
	for _, table := range []string{TableNAT, TableFilter} {
		var declare, rules, deletes []string
		for _, c := range rs.Chains {
			if c.Table != table {
				continue
			}
			key := table + "/" + c.Name
			if !st.Full && slices.Equal(a.applied[key], c.Rules) {
				if _, ok := a.applied[key]; ok {
					continue
				}
			}
			declare = append(declare, ":"+c.Name+" - [0:0]")
			for _, r := range c.Rules {
				rules = append(rules, "-A "+c.Name+" "+r)
			}
			st.Chains++
			st.Rules += len(c.Rules)
		}
		gone := map[string]bool{}
		for _, m := range []map[string]bool{keysOf(a.applied), existing} {
			for key := range m {
				if t, name, _ := strings.Cut(key, "/"); t == table {
					if _, wanted := want[key]; !wanted {
						gone[name] = true
					}
				}
			}
		}
		for _, name := range sortedKeys(gone) {
			declare = append(declare, ":"+name+" - [0:0]")
			deletes = append(deletes, "-X "+name)
			st.Deleted++
		}
		var jumps []string
		if st.Full {
			for _, j := range rs.Jumps {
				if j.Table == table && !haveJumps[j.Table+"/"+j.Chain+" "+j.Rule] {
					jumps = append(jumps, "-I "+j.Chain+" 1 "+j.Rule)
				}
			}
		}
		if len(declare)+len(jumps) == 0 {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", table)
		for _, l := range [][]string{declare, rules, deletes, jumps} {
			for _, line := range l {
				b.WriteString(line)
				b.WriteByte('\n')
			}
		}
		b.WriteString("COMMIT\n")
	}
	if b.Len() > 0 {
		if err := a.Runner.Restore(a.Family, b.Bytes()); err != nil {
			a.applied = nil // unknown kernel state: the next apply is full
			return st, err
		}
	}
	a.applied = want
	return st, nil
}

// kernelState lists the weft chains the kernel has and the jumps present.
func (a *Applier) kernelState() (chains, jumps map[string]bool, err error) {
	chains, jumps = map[string]bool{}, map[string]bool{}
	for _, table := range []string{TableNAT, TableFilter} {
		out, err := a.Runner.Save(a.Family, table)
		if err != nil {
			return nil, nil, err
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, ":") {
				name, _, _ := strings.Cut(line[1:], " ")
				if owned(name) {
					chains[table+"/"+name] = true
				}
				continue
			}
			if rest, ok := strings.CutPrefix(line, "-A "); ok {
				chain, rule, _ := strings.Cut(rest, " ")
				if !owned(chain) {
					jumps[table+"/"+chain+" "+rule] = true
				}
			}
		}
	}
	return chains, jumps, nil
}

// Cleanup removes the jumps and every chain weft's proxy owns in this family.
func (a *Applier) Cleanup() error {
	chains, jumps, err := a.kernelState()
	if err != nil {
		return err
	}
	var b bytes.Buffer
	for _, table := range []string{TableNAT, TableFilter} {
		var names []string
		for key := range chains {
			if t, name, _ := strings.Cut(key, "/"); t == table {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		var lines []string
		for _, j := range BaseJumps() {
			if j.Table == table && jumps[j.Table+"/"+j.Chain+" "+j.Rule] {
				lines = append(lines, "-D "+j.Chain+" "+j.Rule)
			}
		}
		if len(names)+len(lines) == 0 {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", table)
		for _, l := range lines {
			b.WriteString(l + "\n")
		}
		for _, n := range names {
			fmt.Fprintf(&b, ":%s - [0:0]\n", n)
		}
		for _, n := range names {
			fmt.Fprintf(&b, "-X %s\n", n)
		}
		b.WriteString("COMMIT\n")
	}
	a.applied = nil
	if b.Len() == 0 {
		return nil
	}
	return a.Runner.Restore(a.Family, b.Bytes())
}

func keysOf(m map[string][]string) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
