package tracer

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// This file parses the options of the supported match modules (-m NAME);
// match.go evaluates the matchers they produce.

func newModule(name string) (module, error) {
	switch name {
	case "tcp", "udp", "sctp":
		return &portModule{proto: name}, nil
	case "multiport":
		return &multiportModule{}, nil
	case "comment":
		return &commentModule{}, nil
	case "addrtype":
		return &addrtypeModule{}, nil
	case "mark":
		return &markModule{}, nil
	case "conntrack":
		return &ctModule{opt: "--ctstate"}, nil
	case "state":
		return &ctModule{opt: "--state"}, nil
	case "statistic":
		return &statModule{}, nil
	case "recent":
		return &recentModule{}, nil
	case "set":
		return &setModule{}, nil
	}
	return nil, fmt.Errorf("unknown match module %q", name)
}

// list reads a comma-separated option value.
func list(p *ruleParser, opt string) ([]string, error) {
	v, err := p.value(opt)
	if err != nil {
		return nil, err
	}
	return strings.Split(v, ","), nil
}

type portModule struct{ proto string }

func (m *portModule) option(p *ruleParser, opt string, neg bool) (bool, error) {
	switch opt {
	case "--dport", "--destination-port", "--sport", "--source-port":
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		r, err := parsePortRange(v)
		if err != nil {
			return true, fmt.Errorf("%s: %v", opt, err)
		}
		p.add(portMatch{proto: m.proto, dst: opt == "--dport" || opt == "--destination-port", r: r, neg: neg})
	case "--syn": // the first packet of a TCP flow is a SYN
		if m.proto != "tcp" {
			return false, nil
		}
		p.add(constMatch(boolRes(!neg)))
	default:
		return false, nil
	}
	return true, nil
}

func (m *portModule) end(p *ruleParser) error {
	if p.proto != m.proto {
		return fmt.Errorf("-m %s needs -p %s", m.proto, m.proto)
	}
	return nil
}

type multiportModule struct{ n int }

func (m *multiportModule) option(p *ruleParser, opt string, neg bool) (bool, error) {
	var which byte
	switch opt {
	case "--dports", "--destination-ports":
		which = 'd'
	case "--sports", "--source-ports":
		which = 's'
	case "--ports":
		which = 'b'
	default:
		return false, nil
	}
	items, err := list(p, opt)
	if err != nil {
		return true, err
	}
	mm := multiportMatch{which: which, neg: neg}
	count := 0
	for _, it := range items {
		r, err := parsePortRange(it)
		if err != nil {
			return true, fmt.Errorf("%s: %v", opt, err)
		}
		mm.ranges = append(mm.ranges, r)
		if count++; r.lo != r.hi {
			count++
		}
	}
	if count > 15 {
		return true, fmt.Errorf("%s: more than 15 ports", opt)
	}
	m.n++
	p.add(mm)
	return true, nil
}

func (m *multiportModule) end(p *ruleParser) error {
	if !isPortProto(p.proto) {
		return fmt.Errorf("-m multiport needs -p tcp, udp or sctp")
	}
	if m.n == 0 {
		return fmt.Errorf("-m multiport needs --dports, --sports or --ports")
	}
	return nil
}

type commentModule struct{ set bool }

func (m *commentModule) option(p *ruleParser, opt string, neg bool) (bool, error) {
	if opt != "--comment" {
		return false, nil
	}
	if err := noNeg(opt, neg); err != nil {
		return true, err
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	if p.r.Comment != "" {
		v = p.r.Comment + "; " + v
	}
	p.r.Comment, m.set = v, true
	return true, nil
}

func (m *commentModule) end(*ruleParser) error {
	if !m.set {
		return fmt.Errorf("-m comment needs --comment")
	}
	return nil
}

var addrTypes = []string{"UNSPEC", "UNICAST", "LOCAL", "BROADCAST", "ANYCAST", "MULTICAST",
	"BLACKHOLE", "UNREACHABLE", "PROHIBIT", "THROW", "NAT", "XRESOLVE"}

type addrtypeModule struct{ n int }

func (m *addrtypeModule) option(p *ruleParser, opt string, neg bool) (bool, error) {
	switch opt {
	case "--src-type", "--dst-type":
	case "--limit-iface-in", "--limit-iface-out":
		return true, fmt.Errorf("addrtype %s is not supported by the tracer", opt)
	default:
		return false, nil
	}
	types, err := list(p, opt)
	if err != nil {
		return true, err
	}
	for _, t := range types {
		if !slices.Contains(addrTypes, t) {
			return true, fmt.Errorf("%s: unknown address type %q", opt, t)
		}
	}
	m.n++
	p.add(addrTypeMatch{dst: opt == "--dst-type", types: types, neg: neg})
	return true, nil
}

func (m *addrtypeModule) end(*ruleParser) error {
	if m.n == 0 {
		return fmt.Errorf("-m addrtype needs --src-type or --dst-type")
	}
	return nil
}

type markModule struct{ n int }

func (m *markModule) option(p *ruleParser, opt string, neg bool) (bool, error) {
	if opt != "--mark" {
		return false, nil
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	val, mask, err := parseValMask(v)
	if err != nil {
		return true, fmt.Errorf("--mark: %v", err)
	}
	m.n++
	p.add(markMatch{val: val, mask: mask, neg: neg})
	return true, nil
}

func (m *markModule) end(*ruleParser) error {
	if m.n == 0 {
		return fmt.Errorf("-m mark needs --mark")
	}
	return nil
}

// ctModule is -m conntrack --ctstate or the legacy -m state --state.
type ctModule struct {
	opt string
	n   int
}

func (m *ctModule) option(p *ruleParser, opt string, neg bool) (bool, error) {
	if opt != m.opt {
		return false, nil
	}
	states, err := list(p, opt)
	if err != nil {
		return true, err
	}
	for _, s := range states {
		if !slices.Contains([]string{"NEW", "ESTABLISHED", "RELATED", "INVALID", "UNTRACKED"}, s) {
			return true, fmt.Errorf("%s: unsupported state %q", opt, s)
		}
	}
	m.n++
	p.add(ctMatch{states: states, neg: neg})
	return true, nil
}

func (m *ctModule) end(*ruleParser) error {
	if m.n == 0 {
		return fmt.Errorf("conntrack/state match needs %s", m.opt)
	}
	return nil
}

type statModule struct {
	mode      string
	prob      float64
	every     bool
	neg, seen bool
}

func (m *statModule) option(p *ruleParser, opt string, neg bool) (bool, error) {
	switch opt {
	case "--mode", "--probability", "--every", "--packet":
	default:
		return false, nil
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	switch opt {
	case "--mode":
		if v != "random" && v != "nth" {
			return true, fmt.Errorf("--mode: unknown mode %q", v)
		}
		m.mode, err = v, noNeg(opt, neg)
	case "--probability":
		m.prob, err = strconv.ParseFloat(v, 64)
		if err != nil || m.prob < 0 || m.prob > 1 {
			return true, fmt.Errorf("--probability: bad value %q", v)
		}
		m.seen, m.neg = true, neg
	case "--every":
		_, err = strconv.ParseUint(v, 10, 32)
		m.every, m.neg = true, neg
	case "--packet":
		_, err = strconv.ParseUint(v, 10, 32)
		err = errors.Join(err, noNeg(opt, neg))
	}
	return true, err
}

func (m *statModule) end(p *ruleParser) error {
	switch {
	case m.mode == "random" && m.seen && !m.every:
		p.add(statMatch{prob: m.prob, neg: m.neg})
	case m.mode == "nth" && m.every && !m.seen:
		p.add(statMatch{prob: 0.5, neg: m.neg}) // depends on a counter: either way
	default:
		return fmt.Errorf("-m statistic needs --mode random --probability P or --mode nth --every N")
	}
	return nil
}

type recentModule struct {
	mode               string
	neg, seconds, reap bool
}

func (m *recentModule) option(p *ruleParser, opt string, neg bool) (bool, error) {
	switch opt {
	case "--set", "--rcheck", "--update", "--remove":
		if m.mode != "" {
			return true, fmt.Errorf("-m recent: %s and --%s both given", opt, m.mode)
		}
		m.mode, m.neg = opt[2:], neg
		return true, nil
	case "--rsource", "--rdest", "--reap", "--rttl":
		m.reap = m.reap || opt == "--reap"
		return true, noNeg(opt, neg)
	case "--name", "--seconds", "--hitcount", "--mask":
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		switch opt {
		case "--seconds", "--hitcount":
			m.seconds = m.seconds || opt == "--seconds"
			_, err = strconv.ParseUint(v, 10, 32)
		case "--mask":
			_, err = parsePrefix(v)
		}
		if err != nil {
			return true, fmt.Errorf("%s: bad value %q", opt, v)
		}
		return true, noNeg(opt, neg)
	}
	return false, nil
}

func (m *recentModule) end(p *ruleParser) error {
	if m.mode == "" {
		return fmt.Errorf("-m recent needs one of --set, --rcheck, --update, --remove")
	}
	if m.reap && !m.seconds {
		return fmt.Errorf("-m recent: --reap needs --seconds")
	}
	p.add(recentMatch{mode: m.mode, neg: m.neg})
	return nil
}

type setModule struct{ n int }

func (m *setModule) option(p *ruleParser, opt string, neg bool) (bool, error) {
	if opt != "--match-set" {
		return false, nil
	}
	name, err := p.value(opt)
	if err != nil {
		return true, err
	}
	dir, err := p.value(opt)
	if err != nil {
		return true, err
	}
	if dir != "src" && dir != "dst" {
		return true, fmt.Errorf("--match-set %s: only src or dst is supported, not %q", name, dir)
	}
	m.n++
	p.add(setMatch{name: name, dst: dir == "dst", neg: neg})
	return true, nil
}

func (m *setModule) end(*ruleParser) error {
	if m.n == 0 {
		return fmt.Errorf("-m set needs --match-set")
	}
	return nil
}
