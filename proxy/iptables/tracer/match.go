package tracer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// result is the outcome of one match against the first packet of a flow.
type result uint8

const (
	no    result = iota
	yes          // the match holds
	maybe        // statistic: the packet may or may not match
)

func boolRes(b bool) result {
	if b {
		return yes
	}
	return no
}

// not applies "!" when neg is set.
func (r result) not(neg bool) result {
	if !neg || r == maybe {
		return r
	}
	return boolRes(r == no)
}

// packet is the state of the first packet of a flow as the tables see it.
type packet struct {
	src, dst     netip.Addr
	proto        string
	sport, dport uint16
	in, out      string
	mark         uint32
}

// evalCtx is what matchers see: the packet and the flow's node context.
type evalCtx struct {
	pkt  *packet
	flow *Flow
	sets map[string]*Set // defined in the parsed text
	dnat bool            // the flow has been DNATed (conntrack state DNAT)
}

// isLocal tells whether a is an address of the node (addrtype LOCAL).
func (c *evalCtx) isLocal(a netip.Addr) bool {
	return a.IsLoopback() || slices.ContainsFunc(c.flow.NodeIPs, func(n netip.Addr) bool { return n.Unmap() == a })
}

type matcher interface {
	eval(c *evalCtx) (result, error)
}

// evalRule ANDs the matchers of r, stopping at the first that fails.
func evalRule(r *Rule, c *evalCtx) (result, error) {
	res := yes
	for _, m := range r.matches {
		mr, err := m.eval(c)
		if err != nil {
			return no, fmt.Errorf("line %d: %v (in %q)", r.Line, err, r.Text)
		}
		if mr == no {
			return no, nil
		}
		if mr == maybe {
			res = maybe
		}
	}
	return res, nil
}

type constMatch result

func (m constMatch) eval(*evalCtx) (result, error) { return result(m), nil }

// addrMatch is -s / -d. A prefix of the other address family never
// matches, negated or not: such a rule belongs to the other family's table.
type addrMatch struct {
	dst bool
	pfx netip.Prefix
	neg bool
}

func (m addrMatch) eval(c *evalCtx) (result, error) {
	a := c.pkt.src
	if m.dst {
		a = c.pkt.dst
	}
	if a.Is4() != m.pfx.Addr().Is4() {
		return no, nil
	}
	return boolRes(m.pfx.Contains(a)).not(m.neg), nil
}

type protoMatch struct {
	proto string
	neg   bool
}

func (m protoMatch) eval(c *evalCtx) (result, error) {
	return boolRes(m.proto == "all" || m.proto == c.pkt.proto).not(m.neg), nil
}

// ifaceMatch is -i / -o; a trailing "+" matches any name with that prefix.
type ifaceMatch struct {
	out  bool
	name string
	neg  bool
}

func (m ifaceMatch) eval(c *evalCtx) (result, error) {
	n := c.pkt.in
	if m.out {
		n = c.pkt.out
	}
	ok := n == m.name
	if p, wild := strings.CutSuffix(m.name, "+"); wild {
		ok = strings.HasPrefix(n, p) && (n != "" || p == "")
	}
	return boolRes(ok).not(m.neg), nil
}

type portRange struct{ lo, hi uint16 }

func (r portRange) has(p uint16) bool { return r.lo <= p && p <= r.hi }

// portMatch is --dport / --sport of -m tcp|udp|sctp.
type portMatch struct {
	proto string
	dst   bool
	r     portRange
	neg   bool
}

func (m portMatch) eval(c *evalCtx) (result, error) {
	if c.pkt.proto != m.proto {
		return no, nil
	}
	p := c.pkt.sport
	if m.dst {
		p = c.pkt.dport
	}
	return boolRes(m.r.has(p)).not(m.neg), nil
}

// multiportMatch is -m multiport; which is 'd', 's' or 'b' (--ports: either).
type multiportMatch struct {
	which  byte
	ranges []portRange
	neg    bool
}

func (m multiportMatch) eval(c *evalCtx) (result, error) {
	if !isPortProto(c.pkt.proto) {
		return no, nil
	}
	in := func(p uint16) bool { return slices.ContainsFunc(m.ranges, func(r portRange) bool { return r.has(p) }) }
	ok := (m.which != 's' && in(c.pkt.dport)) || (m.which != 'd' && in(c.pkt.sport))
	return boolRes(ok).not(m.neg), nil
}

// addrTypeMatch is -m addrtype. Node IPs and loopback addresses are LOCAL,
// multicast addresses MULTICAST, 255.255.255.255 BROADCAST, the unspecified
// address UNSPEC and every other address UNICAST.
type addrTypeMatch struct {
	dst   bool
	types []string
	neg   bool
}

func (m addrTypeMatch) eval(c *evalCtx) (result, error) {
	a := c.pkt.src
	if m.dst {
		a = c.pkt.dst
	}
	t := "UNICAST"
	switch {
	case c.isLocal(a):
		t = "LOCAL"
	case a.IsMulticast():
		t = "MULTICAST"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		t = "BROADCAST"
	case a.IsUnspecified():
		t = "UNSPEC"
	}
	return boolRes(slices.Contains(m.types, t)).not(m.neg), nil
}

type markMatch struct {
	val, mask uint32
	neg       bool
}

func (m markMatch) eval(c *evalCtx) (result, error) {
	return boolRes(c.pkt.mark&m.mask == m.val).not(m.neg), nil
}

// ctMatch is --ctstate / --state: the first packet of a flow is NEW.
type ctMatch struct {
	states []string
	neg    bool
}

func (m ctMatch) eval(c *evalCtx) (result, error) {
	in := slices.Contains(m.states, "NEW") || (c.dnat && slices.Contains(m.states, "DNAT"))
	return boolRes(in).not(m.neg), nil
}

// statMatch is -m statistic: probabilities strictly between 0 and 1 may go
// either way, so the tracer explores both branches.
type statMatch struct {
	prob float64
	neg  bool
}

func (m statMatch) eval(*evalCtx) (result, error) {
	switch {
	case m.prob <= 0:
		return no.not(m.neg), nil
	case m.prob >= 1:
		return yes.not(m.neg), nil
	}
	return maybe, nil
}

// recentMatch is -m recent: for the first packet no address is on any
// list yet, so --rcheck, --update and --remove fail and --set succeeds.
type recentMatch struct {
	mode string
	neg  bool
}

func (m recentMatch) eval(*evalCtx) (result, error) {
	return boolRes(m.mode == "set").not(m.neg), nil
}

// setMatch is -m set --match-set NAME DIRS. A set defined in the parsed
// text (ipset save lines) is looked up with the packet fields DIRS name; a
// one-dimensional set may instead be given as prefixes in Flow.Sets.
type setMatch struct {
	name string
	dirs []string // "src" or "dst" per dimension
	neg  bool
}

func (m setMatch) eval(c *evalCtx) (result, error) {
	if set, ok := c.sets[m.name]; ok {
		in, err := set.has(c.pkt, m.dirs)
		return boolRes(in).not(m.neg), err
	}
	pfxs, ok := c.flow.Sets[m.name]
	if !ok {
		return no, fmt.Errorf("ipset %q is neither defined in the ruleset nor provided in Flow.Sets", m.name)
	}
	if len(m.dirs) != 1 {
		return no, fmt.Errorf("ipset %q from Flow.Sets has one dimension, the rule uses %d", m.name, len(m.dirs))
	}
	a := c.pkt.src
	if m.dirs[0] == "dst" {
		a = c.pkt.dst
	}
	in := slices.ContainsFunc(pfxs, func(p netip.Prefix) bool { return p.Contains(a) })
	return boolRes(in).not(m.neg), nil
}
