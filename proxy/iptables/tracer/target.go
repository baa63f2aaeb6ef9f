package tracer

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// target is what a rule does when it matches. kind is "jump" or "goto"
// (to chain), a built-in target name, or "" for a rule without target.
type target struct {
	kind, chain string
	markOp      string // MARK: "set-xmark", "set-mark", "or-mark", "and-mark", "xor-mark"
	val, mask   uint32
	to          netip.Addr // DNAT, SNAT
	toPort      uint16     // 0: port unchanged
}

var knownTargets = []string{"ACCEPT", "DROP", "REJECT", "RETURN", "MARK", "DNAT", "SNAT",
	"MASQUERADE", "LOG", "NOTRACK", "CT"}

// unsupportedTargets are extensions that would otherwise be taken for chains.
var unsupportedTargets = []string{"REDIRECT", "NETMAP", "CONNMARK", "TPROXY", "NFLOG", "NFQUEUE",
	"TCPMSS", "CHECKSUM", "SET", "TRACE", "AUDIT", "CLASSIFY", "DSCP", "TOS", "TTL", "HL",
	"HMARK", "SECMARK", "CONNSECMARK", "IDLETIMER", "LED", "TEE", "SYNPROXY", "ULOG",
	"CLUSTERIP", "ECN", "RATEEST", "TCPOPTSTRIP", "MIRROR", "QUEUE"}

func newTarget(table, name string, isGoto bool) (*target, error) {
	builtin := slices.Contains(knownTargets, name)
	switch {
	case slices.Contains(unsupportedTargets, name):
		return nil, fmt.Errorf("target %s is not supported by the tracer", name)
	case isGoto && builtin:
		return nil, fmt.Errorf("-g needs a user chain, not %s", name)
	case isGoto:
		return &target{kind: "goto", chain: name}, nil
	case !builtin:
		return &target{kind: "jump", chain: name}, nil
	case (name == "DNAT" || name == "SNAT" || name == "MASQUERADE") && table != "nat":
		return nil, fmt.Errorf("target %s is only valid in the nat table", name)
	}
	return &target{kind: name}, nil
}

func (t *target) name() string {
	switch t.kind {
	case "jump":
		return t.chain
	case "goto":
		return "goto " + t.chain
	}
	return t.kind
}

// targetOpts lists, per target, its options that take a value and (after
// the "|") its flags.
var targetOpts = map[string]string{
	"REJECT":     "--reject-with|",
	"MARK":       "--set-xmark --set-mark --or-mark --and-mark --xor-mark|",
	"DNAT":       "--to-destination|--random --persistent",
	"SNAT":       "--to-source|--random --random-fully --persistent",
	"MASQUERADE": "--to-ports|--random --random-fully",
	"LOG":        "--log-prefix --log-level|--log-tcp-sequence --log-tcp-options --log-ip-options --log-uid --log-macdecode",
	"CT":         "--zone --helper --ctevents --expevents --timeout|--notrack",
}

func (t *target) option(p *ruleParser, opt string, neg bool) (bool, error) {
	vals, flags, _ := strings.Cut(targetOpts[t.kind], "|")
	if slices.Contains(strings.Fields(flags), opt) {
		return true, noNeg(opt, neg)
	}
	if !slices.Contains(strings.Fields(vals), opt) {
		return false, nil
	}
	if err := noNeg(opt, neg); err != nil {
		return true, err
	}
	v, err := p.value(opt)
	if err != nil {
		return true, err
	}
	switch opt {
	case "--set-xmark", "--set-mark", "--or-mark", "--and-mark", "--xor-mark":
		if t.markOp != "" {
			return true, fmt.Errorf("MARK: --%s and %s both given", t.markOp, opt)
		}
		t.markOp, t.mask = opt[2:], 0xffffffff
		if opt == "--set-xmark" || opt == "--set-mark" {
			t.val, t.mask, err = parseValMask(v)
		} else {
			t.val, err = parseU32(v)
		}
	case "--to-destination", "--to-source":
		if t.to.IsValid() {
			return true, fmt.Errorf("%s given twice (several ranges are not supported)", opt)
		}
		t.to, t.toPort, err = parseNATAddr(v)
	case "--to-ports":
		_, err = parsePortRange(strings.Replace(v, "-", ":", 1))
	}
	if err != nil {
		return true, fmt.Errorf("%s: %v", opt, err)
	}
	return true, nil
}

func (t *target) end(*ruleParser) error {
	switch {
	case t.kind == "MARK" && t.markOp == "":
		return fmt.Errorf("MARK needs --set-xmark, --set-mark, --or-mark, --and-mark or --xor-mark")
	case t.kind == "DNAT" && !t.to.IsValid():
		return fmt.Errorf("DNAT needs --to-destination")
	case t.kind == "SNAT" && !t.to.IsValid():
		return fmt.Errorf("SNAT needs --to-source")
	}
	return nil
}

// parseNATAddr reads IP, IP:PORT, [IPv6] or [IPv6]:PORT.
func parseNATAddr(s string) (netip.Addr, uint16, error) {
	if strings.Contains(s, "-") {
		return netip.Addr{}, 0, fmt.Errorf("address or port ranges are not supported: %q", s)
	}
	host, port := s, ""
	if strings.HasPrefix(s, "[") {
		h, rest, ok := strings.Cut(s[1:], "]")
		if !ok || (rest != "" && !strings.HasPrefix(rest, ":")) {
			return netip.Addr{}, 0, fmt.Errorf("bad address %q", s)
		}
		host, port = h, strings.TrimPrefix(rest, ":")
		if rest == ":" {
			port = "!" // force an error below
		}
	} else if strings.Count(s, ":") == 1 {
		host, port, _ = strings.Cut(s, ":")
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, 0, fmt.Errorf("bad address %q", s)
	}
	var p uint64
	if port != "" {
		if p, err = strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return netip.Addr{}, 0, fmt.Errorf("bad port in %q", s)
		}
	}
	return a.Unmap(), uint16(p), nil
}

// applyMark computes the packet mark after a MARK target.
func (t *target) applyMark(m uint32) uint32 {
	switch t.markOp {
	case "set-xmark":
		return m&^t.mask ^ t.val
	case "set-mark":
		return m&^t.mask | t.val
	case "or-mark":
		return m | t.val
	case "and-mark":
		return m & t.val
	}
	return m ^ t.val // xor-mark
}
