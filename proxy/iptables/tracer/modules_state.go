package tracer

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The match modules whose meaning depends on connection or node state:
// conntrack/state, statistic, recent and set.

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
		if !slices.Contains([]string{"NEW", "ESTABLISHED", "RELATED", "INVALID", "UNTRACKED", "DNAT"}, s) {
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
	dirs := strings.Split(dir, ",")
	for _, d := range dirs {
		if d != "src" && d != "dst" {
			return true, fmt.Errorf("--match-set %s: direction %q is neither src nor dst", name, d)
		}
	}
	m.n++
	p.add(setMatch{name: name, dirs: dirs, neg: neg})
	return true, nil
}

func (m *setModule) end(*ruleParser) error {
	if m.n == 0 {
		return fmt.Errorf("-m set needs --match-set")
	}
	return nil
}
