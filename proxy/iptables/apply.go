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

// Runner executes the iptables and ipset tools; tests substitute a recorder.
type Runner interface {
	Restore(family int, payload []byte) error
	Save(family int, table string) ([]byte, error)
	// IPSet runs an "ipset restore" payload, tolerating existing sets and
	// entries.
	IPSet(payload []byte) error
}

// Exec runs iptables-restore/iptables-save (ip6tables-* for IPv6), waiting
// for the xtables lock instead of failing, and ipset.
type Exec struct {
	// Variant selects the tools: "" for the system default, "legacy" or "nft".
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
	return run(payload, e.tool(family, "restore"), "--noflush", "-w", "5")
}

// IPSet runs "ipset restore -exist" on payload.
func (e Exec) IPSet(payload []byte) error { return run(payload, "ipset", "restore", "-exist") }

func run(stdin []byte, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(out))
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

// defaultChunkRules bounds the rules of one iptables-restore. iptables-nft's
// cost per restore grows faster than linearly with the payload (measured
// here: 155k rules take 40 s in one --noflush restore, under 5 s in chunks
// of 1,000), while every commit also pays the kernel's validation of the
// whole table it hooks.
const defaultChunkRules = 2000

// Applier keeps one family's kernel state in line with rendered rulesets.
//
// Design note. Chains are content-addressed (see Chain): a changed service
// gets new chains under new names, and the few fixed-name chains above them
// (services, node ports, filter) are rewritten to point at them. So an apply
// writes only the chains the kernel lacks, repoints the fixed chains, and
// deletes the chains no longer wanted. Small applies are one
// iptables-restore transaction. A large one (first sync, a restart with a
// changed cluster) is split into chunks, leaves first: every chain exists
// before a chain that jumps to it is written, new content-addressed chains
// stay invisible to traffic until a fixed chain points at them, and the
// deletions come in the last chunk. On a restart the chains already in the
// kernel are recognised by name and kept: traffic is not disturbed and
// nothing is rewritten.
type Applier struct {
	Family int
	Runner Runner
	// ChunkRules bounds one restore (default defaultChunkRules).
	ChunkRules int
	applied    map[string]*Chain // "table/name" -> chain as last applied
}

// Stats describe one apply.
type Stats struct {
	Chains, Rules, Deleted, Restores int
	Full                             bool
}

func chainKey(table, name string) string { return table + "/" + name }

// Apply programs rs. A full apply compares with what the kernel has
// (chains by name and rule count, the jumps from built-in chains), repairs
// any drift and refills the hairpin set; a partial apply trusts the last
// apply and sends only the differences.
func (a *Applier) Apply(rs *Ruleset, full bool) (Stats, error) {
	st := Stats{Full: full || a.applied == nil}
	want := make(map[string]*Chain, len(rs.Chains))
	for _, c := range rs.Chains {
		want[chainKey(c.Table, c.Name)] = c
	}
	kv := &kernelView{}
	if st.Full {
		var err error
		if kv, err = a.kernelState(); err != nil {
			return st, err
		}
	}
	kernel := kv.chains
	var send []*Chain
	for _, c := range rs.Chains {
		k := chainKey(c.Table, c.Name)
		prev, known := a.applied[k]
		same := known && (prev == c || slices.Equal(prev.Rules, c.Rules))
		if st.Full {
			n, inKernel := kernel[k]
			same = inKernel && n == len(c.Rules) && (same || !c.Fixed)
		}
		if !same {
			send = append(send, c)
			st.Chains++
			st.Rules += len(c.Rules)
		}
	}
	gone := map[string]bool{}
	for k := range a.applied {
		if want[k] == nil {
			gone[k] = true
		}
	}
	for k := range kernel {
		if want[k] == nil {
			gone[k] = true
		}
	}
	st.Deleted = len(gone)
	var jumps []insert
	for _, j := range rs.Jumps {
		if st.Full && !kv.jumps[chainKey(j.Table, j.Chain)+" "+j.Rule] {
			jumps = append(jumps, insert{j, kv.policyLead[chainKey(j.Table, j.Chain)] + 1})
		}
	}
	if err := a.apply(rs, st.Full, send, sortedKeysFunc(gone, strings.Compare), jumps, &st); err != nil {
		a.applied = nil // unknown kernel state: the next apply is full
		return st, err
	}
	a.applied = want
	return st, nil
}

// apply sends the set changes and the chains, in order.
func (a *Applier) apply(rs *Ruleset, full bool, send []*Chain, gone []string, jumps []insert, st *Stats) error {
	set := HairpinSet(a.Family)
	if full {
		if err := a.Runner.IPSet(setPayload(set, a.Family, rs.Hairpin())); err != nil {
			return err
		}
	} else if len(rs.HairpinAdded) > 0 {
		if err := a.Runner.IPSet(entries("add", set, rs.HairpinAdded)); err != nil {
			return err
		}
	}
	limit := a.ChunkRules
	if limit <= 0 {
		limit = defaultChunkRules
	}
	byTable := map[string][]*Chain{}
	for _, c := range leavesFirst(send) {
		byTable[c.Table] = append(byTable[c.Table], c)
	}
	// Chunks go leaves first; the deletions and jumps come with the last.
	var last bytes.Buffer
	for _, table := range []string{TableNAT, TableFilter} {
		chunks := chunk(byTable[table], limit)
		for _, c := range chunks[:len(chunks)-1] {
			if err := a.restore(st, tablePayload(table, c, nil, nil)); err != nil {
				return err
			}
		}
		var del []string
		for _, k := range gone {
			if t, name, _ := strings.Cut(k, "/"); t == table {
				del = append(del, name)
			}
		}
		var js []insert
		for _, j := range jumps {
			if j.Table == table {
				js = append(js, j)
			}
		}
		last.Write(tablePayload(table, chunks[len(chunks)-1], del, js))
	}
	if err := a.restore(st, last.Bytes()); err != nil {
		return err
	}
	if !full && len(rs.HairpinRemoved) > 0 {
		return a.Runner.IPSet(entries("del", set, rs.HairpinRemoved))
	}
	return nil
}

func (a *Applier) restore(st *Stats, payload []byte) error {
	if len(payload) == 0 {
		return nil
	}
	st.Restores++
	return a.Runner.Restore(a.Family, payload)
}

// tablePayload renders one table's part of a restore: chains (declaring a
// chain flushes it), deleted chains and jumps inserted into built-in ones.
func tablePayload(table string, chains []*Chain, del []string, jumps []insert) []byte {
	if len(chains)+len(del)+len(jumps) == 0 {
		return nil
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%s\n", table)
	for _, c := range chains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c.Name)
	}
	for _, n := range del {
		fmt.Fprintf(&b, ":%s - [0:0]\n", n)
	}
	for _, c := range chains {
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "-A %s %s\n", c.Name, r)
		}
	}
	for _, n := range del {
		fmt.Fprintf(&b, "-X %s\n", n)
	}
	for _, j := range jumps {
		fmt.Fprintf(&b, "-I %s %d %s\n", j.Chain, j.pos, j.Rule)
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// chunk splits chains into runs of at most limit rules (a larger chain
// alone). It always returns at least one, possibly empty, chunk.
func chunk(chains []*Chain, limit int) [][]*Chain {
	out := [][]*Chain{nil}
	n := 0
	for _, c := range chains {
		if n > 0 && n+len(c.Rules) > limit {
			out = append(out, nil)
			n = 0
		}
		out[len(out)-1] = append(out[len(out)-1], c)
		n += len(c.Rules)
	}
	return out
}

// leavesFirst orders chains so that each comes after the chains (of the
// list) its rules jump to.
func leavesFirst(chains []*Chain) []*Chain {
	index := make(map[string]*Chain, len(chains))
	for _, c := range chains {
		index[chainKey(c.Table, c.Name)] = c
	}
	out := make([]*Chain, 0, len(chains))
	done := make(map[*Chain]bool, len(chains))
	var visit func(c *Chain)
	visit = func(c *Chain) {
		if done[c] {
			return
		}
		done[c] = true
		for _, r := range c.Rules {
			if t := jumpTarget(r); t != "" {
				if d := index[chainKey(c.Table, t)]; d != nil {
					visit(d)
				}
			}
		}
		out = append(out, c)
	}
	for _, c := range chains {
		visit(c)
	}
	return out
}

// jumpTarget is the chain a rule jumps to ("" for other targets).
func jumpTarget(rule string) string {
	_, after, ok := strings.Cut(rule, "-j ")
	if !ok {
		return ""
	}
	t, _, _ := strings.Cut(after, " ")
	if !strings.HasPrefix(t, chainPrefix) {
		return ""
	}
	return t
}

// setPayload replaces the whole hairpin set: filled under a temporary
// name, then swapped in, so lookups never see it half-filled.
func setPayload(set string, family int, members []string) []byte {
	fam := "inet"
	if family == 6 {
		fam = "inet6"
	}
	tmp := set + "-tmp"
	var b bytes.Buffer
	for _, n := range []string{set, tmp} {
		fmt.Fprintf(&b, "create %s hash:ip,port,ip family %s maxelem 1048576\n", n, fam)
	}
	fmt.Fprintf(&b, "flush %s\n", tmp)
	b.Write(entries("add", tmp, members))
	fmt.Fprintf(&b, "swap %s %s\ndestroy %s\n", tmp, set, tmp)
	return b.Bytes()
}

func entries(op, set string, members []string) []byte {
	var b bytes.Buffer
	for _, m := range members {
		fmt.Fprintf(&b, "%s %s %s\n", op, set, m)
	}
	return b.Bytes()
}

// insert is a missing jump and the position it goes to in its chain.
type insert struct {
	Jump
	pos int
}

// policyChainPrefix names weft-agent's NetworkPolicy chains. Their jumps
// stay first in the built-in chains: the proxy's FORWARD chain accepts
// service traffic, which must not bypass policy, so the proxy inserts its
// own jumps below them.
const policyChainPrefix = "WEFT-POL"

// kernelView is what iptables-save shows of weft in one family.
type kernelView struct {
	chains     map[string]int  // weft chain -> rule count
	jumps      map[string]bool // "table/chain rule" in built-in chains
	policyLead map[string]int  // built-in chain -> leading policy jumps
}

// kernelState reads the weft chains the kernel has, with their rule
// counts, and the rules of the built-in chains.
func (a *Applier) kernelState() (*kernelView, error) {
	kv := &kernelView{chains: map[string]int{}, jumps: map[string]bool{}, policyLead: map[string]int{}}
	for _, table := range []string{TableNAT, TableFilter} {
		out, err := a.Runner.Save(a.Family, table)
		if err != nil {
			return nil, err
		}
		leading := map[string]bool{} // chain -> still in its leading policy jumps
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, ":") {
				name, _, _ := strings.Cut(line[1:], " ")
				if owned(name) {
					kv.chains[chainKey(table, name)] += 0
				}
				leading[name] = true
				continue
			}
			rest, ok := strings.CutPrefix(line, "-A ")
			if !ok {
				continue
			}
			chain, rule, _ := strings.Cut(rest, " ")
			k := chainKey(table, chain)
			if owned(chain) {
				kv.chains[k]++
				continue
			}
			kv.jumps[k+" "+rule] = true
			if leading[chain] && strings.HasPrefix(jumpTarget(rule), policyChainPrefix) {
				kv.policyLead[k]++
			} else {
				leading[chain] = false
			}
		}
	}
	return kv, nil
}

// Cleanup removes the jumps and every chain weft's proxy owns in this family.
func (a *Applier) Cleanup() error {
	kv, err := a.kernelState()
	if err != nil {
		return err
	}
	chains, jumps := kv.chains, kv.jumps
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
	if b.Len() > 0 {
		if err := a.Runner.Restore(a.Family, b.Bytes()); err != nil {
			return err
		}
	}
	// A set is destroyed only once no rule uses it; a missing set is fine.
	err = a.Runner.IPSet([]byte("destroy " + HairpinSet(a.Family) + "\n"))
	if err != nil && !strings.Contains(err.Error(), "does not exist") {
		return err
	}
	return nil
}
