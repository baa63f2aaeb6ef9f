package tracer

import (
	"fmt"
	"slices"
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
