package tracer

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ruleParser reads the tokens of one rule after "-A CHAIN".
type ruleParser struct {
	table string
	toks  []string
	pos   int
	r     *Rule
	proto string   // from -p; "" when absent
	mods  []module // loaded match modules, in order of -m
	tgt   *target  // set by -j / -g
}

// module is one "-m NAME" instance: it claims its options and appends
// matchers to the rule.
type module interface {
	// option handles opt; ok is false when opt is not one of its options.
	option(p *ruleParser, opt string, neg bool) (ok bool, err error)
	// end validates the module once the whole rule is read.
	end(p *ruleParser) error
}

func parseRule(table string, toks []string) (*Rule, error) {
	p := &ruleParser{table: table, toks: toks, r: &Rule{}}
	neg := false
	for p.pos < len(toks) {
		opt := p.toks[p.pos]
		p.pos++
		if opt == "!" {
			if neg {
				return nil, fmt.Errorf("double \"!\"")
			}
			neg = true
			continue
		}
		if !strings.HasPrefix(opt, "-") {
			return nil, fmt.Errorf("unexpected word %q", opt)
		}
		if err := p.option(opt, neg); err != nil {
			return nil, err
		}
		neg = false
	}
	if neg {
		return nil, fmt.Errorf("\"!\" at end of rule")
	}
	for _, m := range p.mods {
		if err := m.end(p); err != nil {
			return nil, err
		}
	}
	if p.tgt != nil {
		if err := p.tgt.end(p); err != nil {
			return nil, err
		}
		p.r.target = *p.tgt
	}
	return p.r, nil
}

// value returns the argument of option opt.
func (p *ruleParser) value(opt string) (string, error) {
	if p.pos >= len(p.toks) || p.toks[p.pos] == "!" {
		return "", fmt.Errorf("option %s needs a value", opt)
	}
	p.pos++
	return p.toks[p.pos-1], nil
}

func (p *ruleParser) add(m matcher) { p.r.matches = append(p.r.matches, m) }

func noNeg(opt string, neg bool) error {
	if neg {
		return fmt.Errorf("option %s cannot be negated", opt)
	}
	return nil
}

func (p *ruleParser) option(opt string, neg bool) error {
	if p.tgt != nil {
		if ok, err := p.tgt.option(p, opt, neg); ok || err != nil {
			return err
		}
	}
	if ok, err := p.core(opt, neg); ok || err != nil {
		return err
	}
	for i := len(p.mods) - 1; i >= 0; i-- { // latest -m first
		if ok, err := p.mods[i].option(p, opt, neg); ok || err != nil {
			return err
		}
	}
	if isPortProto(p.proto) { // "-p tcp --dport 80" loads the tcp match implicitly
		m := &portModule{proto: p.proto}
		if ok, err := m.option(p, opt, neg); ok || err != nil {
			p.mods = append(p.mods, m)
			return err
		}
	}
	if p.tgt != nil {
		return fmt.Errorf("unknown option %s for target %s", opt, p.tgt.name())
	}
	return fmt.Errorf("unknown option %s", opt)
}

func isPortProto(s string) bool { return s == "tcp" || s == "udp" || s == "sctp" }

// core handles the options of iptables itself.
func (p *ruleParser) core(opt string, neg bool) (bool, error) {
	switch opt {
	case "-s", "--source", "-d", "--destination":
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		pfx, err := parsePrefix(v)
		if err != nil {
			return true, fmt.Errorf("%s: %v", opt, err)
		}
		p.add(addrMatch{dst: opt == "-d" || opt == "--destination", pfx: pfx, neg: neg})
	case "-p", "--protocol":
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		v = strings.ToLower(v)
		switch v {
		case "tcp", "udp", "sctp", "icmp", "icmpv6":
		case "ipv6-icmp":
			v = "icmpv6"
		case "all":
			if neg {
				return true, fmt.Errorf("! -p all matches nothing")
			}
		default:
			return true, fmt.Errorf("unsupported protocol %q", v)
		}
		if p.proto != "" {
			return true, fmt.Errorf("-p given twice")
		}
		if !neg {
			p.proto = v
		}
		p.add(protoMatch{proto: v, neg: neg})
	case "-i", "--in-interface", "-o", "--out-interface":
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		p.add(ifaceMatch{out: opt == "-o" || opt == "--out-interface", name: v, neg: neg})
	case "-m", "--match":
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		if err := noNeg(opt, neg); err != nil {
			return true, err
		}
		m, err := newModule(v)
		if err != nil {
			return true, err
		}
		p.mods = append(p.mods, m)
	case "-j", "--jump", "-g", "--goto":
		v, err := p.value(opt)
		if err != nil {
			return true, err
		}
		if err := noNeg(opt, neg); err != nil {
			return true, err
		}
		if p.tgt != nil {
			return true, fmt.Errorf("more than one -j/-g")
		}
		t, err := newTarget(p.table, v, opt == "-g" || opt == "--goto")
		if err != nil {
			return true, err
		}
		p.tgt = t
	default:
		return false, nil
	}
	return true, nil
}

// parsePrefix reads ADDR, ADDR/LEN or IPv4 ADDR/DOTTED-MASK.
func parsePrefix(s string) (netip.Prefix, error) {
	a, l, hasLen := strings.Cut(s, "/")
	addr, err := netip.ParseAddr(a)
	if err != nil || addr.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("bad address %q", s)
	}
	addr = addr.Unmap()
	bits := addr.BitLen()
	if hasLen {
		if n, err := strconv.Atoi(l); err == nil && n >= 0 && n <= addr.BitLen() {
			bits = n
		} else if m, err := netip.ParseAddr(l); err == nil && m.Is4() && addr.Is4() {
			if bits = maskLen(m.As4()); bits < 0 {
				return netip.Prefix{}, fmt.Errorf("non-contiguous mask in %q", s)
			}
		} else {
			return netip.Prefix{}, fmt.Errorf("bad prefix length in %q", s)
		}
	}
	return netip.PrefixFrom(addr, bits).Masked(), nil
}

func maskLen(b [4]byte) int {
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n := 0
	for v&0x80000000 != 0 {
		v <<= 1
		n++
	}
	if v != 0 {
		return -1
	}
	return n
}

// parseU32 reads a decimal or 0x-hex 32-bit number.
func parseU32(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return 0, fmt.Errorf("bad number %q", s)
	}
	return uint32(v), nil
}

// parseValMask reads VALUE[/MASK]; the mask defaults to 0xffffffff.
func parseValMask(s string) (val, mask uint32, err error) {
	v, m, hasMask := strings.Cut(s, "/")
	if val, err = parseU32(v); err != nil {
		return 0, 0, err
	}
	mask = 0xffffffff
	if hasMask {
		if mask, err = parseU32(m); err != nil {
			return 0, 0, err
		}
	}
	return val, mask, nil
}

// parsePortRange reads N or N:M.
func parsePortRange(s string) (portRange, error) {
	a, b, isRange := strings.Cut(s, ":")
	num := func(s string, dflt uint64) (uint64, error) {
		if s == "" && isRange {
			return dflt, nil // ":N" is 0:N and "N:" is N:65535
		}
		return strconv.ParseUint(s, 10, 16)
	}
	lo, err1 := num(a, 0)
	hi, err2 := lo, error(nil)
	if isRange {
		hi, err2 = num(b, 65535)
	}
	if err1 != nil || err2 != nil || hi < lo {
		return portRange{}, fmt.Errorf("bad port or port range %q", s)
	}
	return portRange{uint16(lo), uint16(hi)}, nil
}
