package tracer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Flow describes the first packet of a connection and the node it meets.
type Flow struct {
	Src, Dst     netip.Addr
	Proto        string // "tcp", "udp", "sctp" (also "icmp", "icmpv6")
	DPort, SPort uint16
	NodeIPs      []netip.Addr // addresses local to the node (loopback always is)
	InIface      string
	OutIface     string
	Local        bool   // sent by the node itself: OUTPUT path instead of PREROUTING
	Mark         uint32 // initial packet mark
	Sets         map[string][]netip.Prefix
}

// Outcome is one place the first packet of a flow can end up.
type Outcome struct {
	Verdict    string         // "ACCEPT", "DROP" or "REJECT"
	DNAT       netip.AddrPort // zero if not DNATed
	Masquerade bool           // SNAT or MASQUERADE applied
	Mark       uint32         // packet mark at the end
	Path       []string       // hooks, chains and decisive rules, for messages
}

func (o Outcome) String() string {
	d := "none"
	if o.DNAT.IsValid() {
		d = o.DNAT.String()
	}
	return fmt.Sprintf("%s dnat=%s masq=%t mark=%#x", o.Verdict, d, o.Masquerade, o.Mark)
}

// Trail renders Path on one line.
func (o Outcome) Trail() string { return strings.Join(o.Path, " > ") }

// Targets summarizes outcomes as sorted distinct strings: "ip:port" (or
// "[ip6]:port") for accepted DNATed packets, "ACCEPT-no-DNAT" for other
// accepted ones, and the verdict ("DROP", "REJECT") for the rest, even if
// they had been DNATed first.
func Targets(outs []Outcome) []string {
	var ts []string
	for _, o := range outs {
		switch {
		case o.Verdict != "ACCEPT":
			ts = append(ts, o.Verdict)
		case o.DNAT.IsValid():
			ts = append(ts, o.DNAT.String())
		default:
			ts = append(ts, "ACCEPT-no-DNAT")
		}
	}
	slices.Sort(ts)
	return slices.Compact(ts)
}

// Limits of one Trace.
const (
	MaxOutcomes = 4096    // distinct outcomes
	maxSteps    = 1 << 20 // rules evaluated over all branches
	maxDepth    = 128     // nested jumps
)

type frame struct {
	chain *Chain
	next  int      // index of the next rule
	via   []string // chains this frame ran before a -g replaced them
}

type state struct {
	pkt    packet
	hook   int    // index in the flow's hook sequence
	table  string // table of the current hook
	hchain string // built-in chain of the current hook
	policy string
	stack  []frame // empty between hooks
	out    Outcome
}

func (s *state) clone() *state {
	c := *s
	c.stack = slices.Clone(s.stack)
	for i := range c.stack {
		c.stack[i].via = slices.Clip(c.stack[i].via)
	}
	c.out.Path = slices.Clone(s.out.Path)
	return &c
}

func (s *state) log(format string, a ...any) {
	s.out.Path = append(s.out.Path, fmt.Sprintf(format, a...))
}

// branch is a state still to run; apply is a rule it must act on first.
type branch struct {
	st    *state
	apply *Rule
}

type tracer struct {
	rs    *Ruleset
	flow  *Flow
	steps int
	outs  []Outcome
	seen  map[string]bool
}

// Trace follows the first packet of f through the ruleset (see the package
// documentation for the path model), exploring both branches of every
// statistic match, and returns the distinct outcomes sorted by String.
func (r *Ruleset) Trace(f Flow) ([]Outcome, error) {
	f.Src, f.Dst, f.Proto = f.Src.Unmap(), f.Dst.Unmap(), strings.ToLower(f.Proto)
	switch {
	case !f.Src.IsValid() || !f.Dst.IsValid():
		return nil, fmt.Errorf("flow needs valid Src and Dst")
	case f.Src.Is4() != f.Dst.Is4():
		return nil, fmt.Errorf("flow mixes address families: %v -> %v", f.Src, f.Dst)
	case !slices.Contains([]string{"tcp", "udp", "sctp", "icmp", "icmpv6"}, f.Proto):
		return nil, fmt.Errorf("flow protocol %q is not tcp, udp, sctp, icmp or icmpv6", f.Proto)
	}
	t := &tracer{rs: r, flow: &f, seen: map[string]bool{}}
	st := &state{pkt: packet{src: f.Src, dst: f.Dst, proto: f.Proto, sport: f.SPort, dport: f.DPort,
		in: f.InIface, out: f.OutIface, mark: f.Mark}}
	work := []branch{{st: st}}
	for len(work) > 0 {
		b := work[len(work)-1]
		work = work[:len(work)-1]
		if err := t.run(b, &work); err != nil {
			return nil, err
		}
		if len(t.outs) > MaxOutcomes {
			return nil, fmt.Errorf("more than %d distinct outcomes", MaxOutcomes)
		}
	}
	slices.SortFunc(t.outs, func(a, b Outcome) int { return strings.Compare(a.String(), b.String()) })
	return t.outs, nil
}

// hookAt names the built-in chain of the i-th hook of the flow's path.
func (t *tracer) hookAt(i int, dst netip.Addr) (table, chain string, ok bool) {
	seq := []string{"nat/PREROUTING", "filter/FORWARD", "nat/POSTROUTING"}
	if t.flow.Local {
		seq = []string{"nat/OUTPUT", "filter/OUTPUT", "nat/POSTROUTING"}
	} else if (&evalCtx{flow: t.flow}).isLocal(dst) {
		seq = []string{"nat/PREROUTING", "filter/INPUT"}
	}
	if i >= len(seq) {
		return "", "", false
	}
	table, chain, _ = strings.Cut(seq[i], "/")
	return table, chain, true
}

func (t *tracer) run(b branch, work *[]branch) error {
	st := b.st
	if b.apply != nil {
		if done, err := t.apply(st, b.apply); err != nil || done {
			return err
		}
	}
	for {
		if t.steps++; t.steps > maxSteps {
			return fmt.Errorf("more than %d rule evaluations", maxSteps)
		}
		if len(st.stack) == 0 {
			table, chain, ok := t.hookAt(st.hook, st.pkt.dst)
			if !ok {
				t.finish(st, "ACCEPT")
				return nil
			}
			c := &Chain{Name: chain, Builtin: true, Policy: "ACCEPT"} // absent: empty, ACCEPT
			if tb := t.rs.Tables[table]; tb != nil && tb.Chains[chain] != nil {
				c = tb.Chains[chain]
			}
			st.table, st.hchain, st.policy = table, chain, c.Policy
			st.stack = []frame{{chain: c}}
			st.log("%s/%s", table, chain)
			continue
		}
		fr := &st.stack[len(st.stack)-1]
		if fr.next >= len(fr.chain.Rules) {
			if t.ret(st) {
				return nil
			}
			continue
		}
		rule := fr.chain.Rules[fr.next]
		fr.next++
		res, err := evalRule(rule, &evalCtx{pkt: &st.pkt, flow: t.flow, sets: t.rs.Sets, dnat: st.out.DNAT.IsValid()})
		switch {
		case err != nil:
			return err
		case res == maybe:
			other := st.clone()
			other.log("line %d: random match taken", rule.Line)
			*work = append(*work, branch{st: other, apply: rule})
			st.log("line %d: random match not taken", rule.Line)
		case res == yes:
			if done, err := t.apply(st, rule); err != nil || done {
				return err
			}
		}
	}
}

// ret leaves the current chain (RETURN or falling off its end); leaving the
// hook's bottom frame applies the built-in chain's policy.
func (t *tracer) ret(st *state) (done bool) {
	if len(st.stack) > 1 {
		st.stack = st.stack[:len(st.stack)-1]
		return false
	}
	st.log("policy %s", st.policy)
	return t.verdict(st, st.policy)
}

// verdict ends the current hook: ACCEPT moves on to the next one.
func (t *tracer) verdict(st *state, v string) (done bool) {
	if v == "ACCEPT" {
		st.stack, st.hook = nil, st.hook+1
		return false
	}
	t.finish(st, v)
	return true
}

func (t *tracer) finish(st *state, verdict string) {
	o := st.out
	o.Verdict, o.Mark = verdict, st.pkt.mark
	if k := o.String(); !t.seen[k] {
		t.seen[k] = true
		t.outs = append(t.outs, o)
	}
}

// apply performs the target of a matching rule.
func (t *tracer) apply(st *state, r *Rule) (done bool, err error) {
	tg := &r.target
	fail := func(format string, a ...any) (bool, error) {
		return true, fmt.Errorf("line %d: %s (in %q)", r.Line, fmt.Sprintf(format, a...), r.Text)
	}
	switch tg.kind {
	case "jump", "goto":
		var c *Chain
		if tb := t.rs.Tables[st.table]; tb != nil {
			c = tb.Chains[tg.chain]
		}
		switch {
		case c == nil || !c.Declared:
			return fail("%s to undeclared chain %s in table %s", tg.kind, tg.chain, st.table)
		case c.Builtin:
			return fail("%s to built-in chain %s", tg.kind, tg.chain)
		case len(st.stack) >= maxDepth:
			return fail("more than %d nested jumps", maxDepth)
		}
		var active []string
		for _, f := range st.stack {
			active = append(append(active, f.via...), f.chain.Name)
		}
		if slices.Contains(active, tg.chain) {
			return fail("jump loop: %s -> %s", strings.Join(active, " -> "), tg.chain)
		}
		if tg.kind == "goto" {
			top := &st.stack[len(st.stack)-1]
			top.via = append(slices.Clip(top.via), top.chain.Name)
			top.chain, top.next = c, 0
		} else {
			st.stack = append(st.stack, frame{chain: c})
		}
		st.log("line %d: %s %s/%s", r.Line, tg.kind, st.table, tg.chain)
	case "RETURN":
		st.log("line %d: RETURN", r.Line)
		return t.ret(st), nil
	case "ACCEPT", "DROP", "REJECT":
		st.log("line %d: %s", r.Line, tg.kind)
		return t.verdict(st, tg.kind), nil
	case "MARK":
		st.pkt.mark = tg.applyMark(st.pkt.mark)
		st.log("line %d: mark %#x", r.Line, st.pkt.mark)
	case "DNAT":
		switch {
		case st.hchain != "PREROUTING" && st.hchain != "OUTPUT":
			return fail("DNAT reached from %s (only PREROUTING and OUTPUT)", st.hchain)
		case tg.to.Is4() != st.pkt.dst.Is4():
			return fail("DNAT to %v for a packet to %v", tg.to, st.pkt.dst)
		}
		st.pkt.dst = tg.to
		if tg.toPort != 0 {
			st.pkt.dport = tg.toPort
		}
		st.out.DNAT = netip.AddrPortFrom(st.pkt.dst, st.pkt.dport)
		st.log("line %d: DNAT %v", r.Line, st.out.DNAT)
		return t.verdict(st, "ACCEPT"), nil
	case "SNAT", "MASQUERADE":
		if st.hchain != "POSTROUTING" && st.hchain != "INPUT" {
			return fail("%s reached from %s (only POSTROUTING and INPUT)", tg.kind, st.hchain)
		}
		st.out.Masquerade = true
		st.log("line %d: %s", r.Line, tg.kind)
		return t.verdict(st, "ACCEPT"), nil
	}
	return false, nil // no target, LOG, NOTRACK, CT
}
