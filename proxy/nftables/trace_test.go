package nftables_test

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/proxy/nftables"
	"github.com/weftnet/weft/proxy/proxytest"
)

// The tracer is a test oracle: it walks the first packet of a flow through
// the rendered table (the knftables fake's chains, sets and maps) the way
// the kernel evaluates it, exploring every numgen slot, and returns each
// possible outcome. It understands the rule forms the renderer writes and
// fails on any other, so a new form cannot slip past it.

type packet struct {
	src, dst netip.Addr
	proto    string // tcp, udp, sctp
	port     int
	local    bool // sent by the node itself (nat output, fib saddr type local)
}

type outcome struct {
	target  string // the DNAT destination ip:port, "" for none
	masq    bool
	verdict string // accept, drop, reject
}

func (o outcome) String() string {
	return fmt.Sprintf("%s masq=%v %s", o.target, o.masq, o.verdict)
}

type tracer struct {
	t     *testing.T
	table *knftables.FakeTable
	local []netip.Addr // the node's addresses
}

// state is one branch of the walk.
type state struct {
	pkt     packet
	mark    uint32
	dnat    string
	verdict string // "" while undecided; accept, drop, reject, or dnat (ends nat)
}

var (
	reL4      = regexp.MustCompile(`^meta l4proto \{ tcp, udp, sctp \} `)
	reL4One   = regexp.MustCompile(`^meta l4proto (tcp|udp|sctp) `)
	reNfproto = regexp.MustCompile(`^meta nfproto (ipv4|ipv6) `)
	reInSet   = regexp.MustCompile(`^ip daddr \. meta l4proto \. th dport @(\S+) `)
	reNotFw   = regexp.MustCompile(`^ip daddr \. meta l4proto \. th dport \. ip saddr != @(\S+) `)
	reSrcNot  = regexp.MustCompile(`^ip saddr != (\S+) `)
	reSrcIn   = regexp.MustCompile(`^ip saddr \{ ([^}]*) \} `)
	reFibLoc  = regexp.MustCompile(`^fib saddr type local `)
	reMarkOr  = regexp.MustCompile(`^meta mark set meta mark \| (0x[0-9a-f]+)$`)
	reMarkXor = regexp.MustCompile(`^meta mark set meta mark \^ (0x[0-9a-f]+)$`)
	reMarkOff = regexp.MustCompile(`^meta mark & (0x[0-9a-f]+) == 0 return$`)
	reJump    = regexp.MustCompile(`^(jump|goto) (\S+)$`)
	reLB      = regexp.MustCompile(`^dnat ip to ip daddr \. meta l4proto \. th dport \. numgen random mod (\d+) map @(\S+)$`)
	reClients = regexp.MustCompile(`^dnat ip to ip saddr \. ip daddr \. meta l4proto \. th dport map @(\S+)$`)
	reCtDnat  = regexp.MustCompile(`^ct status dnat `)
	reHairpin = regexp.MustCompile(`^ip saddr \. ip daddr @(\S+) `)
	reRecord  = regexp.MustCompile(`^ct original ip daddr \S+ meta l4proto \. ct original proto-dst @\S+ update @\S+ \{.*\}$`)
)

// run walks st through chain; it returns the states after it (a chain
// may fork on numgen).
func (tr *tracer) run(chain string, st state) []state {
	c := tr.table.Chains[chain]
	if c == nil {
		tr.t.Fatalf("no chain %s", chain)
	}
	states := []state{st}
	var done []state
	for _, r := range c.Rules {
		var next []state
		for _, s := range states {
			for _, o := range tr.rule(r.Rule, s) {
				if o.verdict != "" {
					done = append(done, o)
				} else {
					next = append(next, o)
				}
			}
		}
		states = next
	}
	return append(done, states...)
}

// rule evaluates one rule; each returned state either continues (verdict
// "") or ended the chain (a verdict, "return", or "goto:" handled inside).
func (tr *tracer) rule(text string, s state) []state {
	rest := text
	p := s.pkt
	if strings.Contains(text, "ip6 ") {
		return []state{s} // an IPv6 match: never an IPv4 packet (the flows are IPv4)
	}
	for {
		switch {
		case reL4.MatchString(rest):
			rest = rest[len(reL4.FindString(rest)):]
		case reL4One.MatchString(rest):
			m := reL4One.FindStringSubmatch(rest)
			if p.proto != m[1] {
				return []state{s}
			}
			rest = rest[len(m[0]):]
		case reNfproto.MatchString(rest):
			m := reNfproto.FindStringSubmatch(rest)
			if (m[1] == "ipv4") != p.dst.Is4() {
				return []state{s}
			}
			rest = rest[len(m[0]):]
		case reInSet.MatchString(rest):
			m := reInSet.FindStringSubmatch(rest)
			if !tr.inSet(m[1], p.dst.String(), p.proto, strconv.Itoa(p.port)) {
				return []state{s}
			}
			rest = rest[len(m[0]):]
		case reNotFw.MatchString(rest):
			m := reNotFw.FindStringSubmatch(rest)
			if tr.allowed(m[1], p) {
				return []state{s}
			}
			rest = rest[len(m[0]):]
		case reSrcNot.MatchString(rest):
			m := reSrcNot.FindStringSubmatch(rest)
			if netip.MustParsePrefix(m[1]).Contains(p.src) {
				return []state{s}
			}
			rest = rest[len(m[0]):]
		case reSrcIn.MatchString(rest):
			m := reSrcIn.FindStringSubmatch(rest)
			in := false
			for _, c := range strings.Split(m[1], ", ") {
				in = in || netip.MustParsePrefix(c).Contains(p.src)
			}
			if !in {
				return []state{s}
			}
			rest = rest[len(m[0]):]
		case reFibLoc.MatchString(rest):
			if !slices.Contains(tr.local, p.src) {
				return []state{s}
			}
			rest = rest[len(reFibLoc.FindString(rest)):]
		case reCtDnat.MatchString(rest):
			if s.dnat == "" {
				return []state{s}
			}
			rest = rest[len(reCtDnat.FindString(rest)):]
		case reRecord.MatchString(rest):
			return []state{s} // records affinity: no effect on this packet
		case reHairpin.MatchString(rest):
			m := reHairpin.FindStringSubmatch(rest)
			addr, _, _ := strings.Cut(s.dnat, ":")
			if !tr.inSet(m[1], p.src.String(), addr) {
				return []state{s}
			}
			rest = rest[len(m[0]):]
		default:
			return tr.statement(text, rest, s)
		}
	}
}

func (tr *tracer) statement(text, rest string, s state) []state {
	mask := func(h string) uint32 { v, _ := strconv.ParseUint(h, 0, 32); return uint32(v) }
	switch {
	case rest == "drop" || rest == "reject":
		s.verdict = rest
		return []state{s}
	case rest == "return":
		s.verdict = "return"
		return []state{s}
	case rest == "masquerade fully-random":
		s.verdict = "masquerade"
		return []state{s}
	case reMarkOr.MatchString(rest):
		s.mark |= mask(reMarkOr.FindStringSubmatch(rest)[1])
		return []state{s}
	case reMarkXor.MatchString(rest):
		s.mark ^= mask(reMarkXor.FindStringSubmatch(rest)[1])
		return []state{s}
	case reMarkOff.MatchString(rest):
		if s.mark&mask(reMarkOff.FindStringSubmatch(rest)[1]) == 0 {
			s.verdict = "return"
		}
		return []state{s}
	case reJump.MatchString(rest):
		m := reJump.FindStringSubmatch(rest)
		var out []state
		for _, o := range tr.run(m[2], s) {
			if o.verdict == "return" || o.verdict == "" {
				o.verdict = ""
				if m[1] == "goto" {
					o.verdict = "return" // the end of a goto's chain ends this one too
				}
			}
			out = append(out, o)
		}
		return out
	case reClients.MatchString(rest):
		m := reClients.FindStringSubmatch(rest)
		if len(tr.table.Maps[m[1]].Elements) != 0 {
			tr.t.Fatalf("the tracer starts with no affinity entries, %s has some", m[1])
		}
		return []state{s}
	case reLB.MatchString(rest):
		m := reLB.FindStringSubmatch(rest)
		n, _ := strconv.Atoi(m[1])
		var out []state
		for slot := range n {
			e := tr.table.Maps[m[2]].FindElement(s.pkt.dst.String(), s.pkt.proto, strconv.Itoa(s.pkt.port), strconv.Itoa(slot))
			if e == nil {
				if slot > 0 {
					tr.t.Fatalf("%s: slot %d of %d missing for %v", m[2], slot, n, s.pkt)
				}
				return []state{s}
			}
			o := s
			o.dnat, o.verdict = e.Value[0]+":"+e.Value[1], "dnat"
			out = append(out, o)
		}
		return out
	}
	tr.t.Fatalf("the tracer does not understand %q (in %q)", rest, text)
	return nil
}

func (tr *tracer) inSet(set string, key ...string) bool {
	if s := tr.table.Sets[set]; s != nil {
		return s.FindElement(key...) != nil
	}
	tr.t.Fatalf("no set %s", set)
	return false
}

// allowed: (frontend . saddr) is in the interval set.
func (tr *tracer) allowed(set string, p packet) bool {
	for _, e := range tr.table.Sets[set].Elements {
		if e.Key[0] == p.dst.String() && e.Key[1] == p.proto && e.Key[2] == strconv.Itoa(p.port) &&
			netip.MustParsePrefix(e.Key[3]).Contains(p.src) {
			return true
		}
	}
	return false
}

// trace returns every outcome of p's first packet: nat (prerouting or
// output), then the filter chains' reject, then postrouting.
func (tr *tracer) trace(p packet) []outcome {
	base := "nat-prerouting"
	if p.local {
		base = "nat-output"
	}
	var out []outcome
	for _, s := range tr.run(base, state{pkt: p}) {
		if s.verdict == "drop" || s.verdict == "reject" {
			out = append(out, outcome{verdict: s.verdict})
			continue
		}
		s.verdict = ""
		if s.dnat == "" { // filter input/forward/output: new connections to a frontend
			f := tr.run("reject-services", s)
			if v := f[0].verdict; v == "drop" || v == "reject" {
				out = append(out, outcome{verdict: v})
				continue
			}
		}
		post := tr.run("nat-postrouting", s)
		masq := false
		for _, q := range post {
			masq = masq || q.verdict == "masquerade"
		}
		out = append(out, outcome{target: s.dnat, masq: masq, verdict: "accept"})
	}
	slices.SortFunc(out, func(a, b outcome) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out)
}

// TestTraceFlows walks the golden scenario's table for the first packet of
// each flow and compares every possible outcome with kube-proxy semantics.
func TestTraceFlows(t *testing.T) {
	svcs, sl := goldenScenario()
	fake := knftables.NewFake(knftables.InetFamily, nftables.TableName)
	if err := nftables.NewWith(nodeConfig(), fake).Sync(build(t, svcs, sl), true); err != nil {
		t.Fatal(err)
	}
	node := netip.MustParseAddr(proxytest.NodeIP)
	tr := &tracer{t: t, table: fake.Table, local: []netip.Addr{node}}
	ep := func(ip string, port int, masq bool) outcome {
		return outcome{target: fmt.Sprintf("%s:%d", ip, port), masq: masq, verdict: "accept"}
	}
	const podA, podB, podC, remote = proxytest.PodA, proxytest.PodB, proxytest.PodC, proxytest.RemoteEP
	const ext, ext2, lbIP, extIP = proxytest.ExtIP, proxytest.ExtIP2, proxytest.LBIP, proxytest.ExtIPv4
	var big []outcome
	for i := range 17 {
		big = append(big, ep(fmt.Sprintf("10.244.2.%d", 10+i), 80, false))
	}
	none := []outcome{{verdict: "accept"}}
	drop, reject := []outcome{{verdict: "drop"}}, []outcome{{verdict: "reject"}}
	cases := []struct {
		name     string
		src, dst string
		proto    string
		port     int
		local    bool
		want     []outcome
	}{
		{"ClusterIP from a pod", podA, "10.96.0.10", "tcp", 80, false, []outcome{ep(podA, 80, true), ep(podB, 80, false), ep(podC, 80, false)}},
		{"ClusterIP second port", podB, "10.96.0.10", "tcp", 81, false, []outcome{ep(podA, 81, false), ep(podB, 81, true), ep(podC, 81, false)}},
		{"ClusterIP from outside the cluster CIDR is masqueraded", ext, "10.96.0.10", "tcp", 80, false, []outcome{ep(podA, 80, true), ep(podB, 80, true), ep(podC, 80, true)}},
		{"ClusterIP from the node is masqueraded", proxytest.NodeIP, "10.96.0.10", "tcp", 80, true, []outcome{ep(podA, 80, true), ep(podB, 80, true), ep(podC, 80, true)}},
		{"ClusterIP, wrong port", podA, "10.96.0.10", "tcp", 82, false, none},
		{"ClusterIP, wrong protocol", podA, "10.96.0.10", "udp", 80, false, none},
		{"unknown address", podA, "10.96.9.9", "tcp", 80, false, none},
		{"NodePort np ClusterIP", podA, "10.96.0.11", "tcp", 80, false, []outcome{ep(podB, 80, false), ep(podC, 80, false)}},
		{"NodePort from outside", ext, node.String(), "tcp", 30080, false, []outcome{ep(podB, 80, true), ep(podC, 80, true)}},
		{"NodePort from a pod", podA, node.String(), "tcp", 30080, false, []outcome{ep(podB, 80, true), ep(podC, 80, true)}},
		{"NodePort from the node", proxytest.NodeIP, node.String(), "tcp", 30080, true, []outcome{ep(podB, 80, true), ep(podC, 80, true)}},
		{"NodePort on a port not used", ext, node.String(), "tcp", 30099, false, none},
		{"NodePort is TCP only", ext, node.String(), "udp", 30080, false, none},
		{"eTP Local from outside: local endpoint, source kept", ext, node.String(), "tcp", 30081, false, []outcome{ep(podC, 80, false)}},
		{"eTP Local from a pod: any endpoint", podA, node.String(), "tcp", 30081, false, []outcome{ep(podC, 80, false), ep(remote, 80, false)}},
		{"eTP Local from the node: any endpoint, masqueraded", proxytest.NodeIP, node.String(), "tcp", 30081, true, []outcome{ep(podC, 80, true), ep(remote, 80, true)}},
		{"eTP Local ClusterIP: cluster-wide", podA, "10.96.0.12", "tcp", 80, false, []outcome{ep(podC, 80, false), ep(remote, 80, false)}},
		{"eTP Local without a local endpoint from outside drops", ext, node.String(), "tcp", 30082, false, drop},
		{"eTP Local without a local endpoint from a pod", podA, node.String(), "tcp", 30082, false, []outcome{ep(remote, 80, false)}},
		{"eTP Local without a local endpoint from the node", proxytest.NodeIP, node.String(), "tcp", 30082, true, []outcome{ep(remote, 80, true)}},
		{"remote-only ClusterIP", podA, "10.96.0.13", "tcp", 80, false, []outcome{ep(remote, 80, false)}},
		{"LB IP from an allowed source", ext, lbIP, "tcp", 80, false, []outcome{ep(podB, 80, true)}},
		{"LB IP from a source outside the ranges", ext2, lbIP, "tcp", 80, false, drop},
		{"LB IP from a pod (ranges apply)", podA, lbIP, "tcp", 80, false, drop},
		{"LB IP second port from an allowed source", ext, lbIP, "tcp", 81, false, []outcome{ep(podB, 81, true)}},
		{"LB NodePort is not restricted", ext2, node.String(), "tcp", 30083, false, []outcome{ep(podB, 80, true)}},
		{"LB ClusterIP is not restricted", podA, "10.96.0.14", "tcp", 80, false, []outcome{ep(podB, 80, false)}},
		{"sticky without affinity entries spreads", podB, "10.96.0.15", "tcp", 80, false, []outcome{ep(podA, 80, false), ep(podB, 80, true), ep(podC, 80, false)}},
		{"no endpoints rejects", podC, "10.96.0.16", "tcp", 80, false, reject},
		{"no endpoints rejects from the node", proxytest.NodeIP, "10.96.0.16", "tcp", 81, true, reject},
		{"iTP Local uses only the local endpoint", podB, "10.96.0.17", "tcp", 80, false, []outcome{ep(podA, 80, false)}},
		{"iTP Local without a local endpoint drops", podC, "10.96.0.18", "tcp", 80, false, drop},
		{"externalIP from a pod", podA, extIP, "tcp", 80, false, []outcome{ep(podB, 80, true)}},
		{"externalIP from outside", ext, extIP, "tcp", 80, false, []outcome{ep(podB, 80, true)}},
		{"externalIP ClusterIP", podA, "10.96.0.19", "tcp", 81, false, []outcome{ep(podB, 81, false)}},
		{"hairpin through a Service", podA, "10.96.0.21", "tcp", 80, false, []outcome{ep(podA, 80, true)}},
		{"another pod through the same Service", podB, "10.96.0.21", "tcp", 80, false, []outcome{ep(podA, 80, false)}},
		{"UDP ClusterIP", podB, "10.96.0.53", "udp", 81, false, []outcome{ep(podA, 81, false)}},
		{"UDP ClusterIP is not TCP", podB, "10.96.0.53", "tcp", 81, false, none},
		{"dual-stack Service, IPv4 side", podA, "10.96.0.20", "tcp", 80, false, []outcome{ep(podB, 80, false)}},
		{"another affinity timeout", podA, "10.96.0.22", "tcp", 80, false, []outcome{ep(podC, 80, false)}},
		{"seventeen endpoints", podA, "10.96.0.23", "tcp", 80, false, big},
	}
	for _, c := range cases {
		p := packet{src: netip.MustParseAddr(c.src), dst: netip.MustParseAddr(c.dst), proto: c.proto, port: c.port, local: c.local}
		got := tr.trace(p)
		want := slices.Clone(c.want)
		slices.SortFunc(want, func(a, b outcome) int { return strings.Compare(a.String(), b.String()) })
		if !slices.Equal(got, want) {
			t.Errorf("%s (%s -> %s:%d/%s): got %v, want %v", c.name, c.src, c.dst, c.port, c.proto, got, want)
		}
	}
	if len(cases) < 40 {
		t.Fatalf("%d flows, want at least 40", len(cases))
	}
}
