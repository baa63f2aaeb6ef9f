package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
	"github.com/weftnet/weft/test/bench/benchlab"
)

// proc is a process the bench started in a namespace.
type proc = benchlab.Proc

// box is a fresh network namespace attached to the lab's underlay, where one
// proxy runs alone. Its name carries the lab's prefix, so lab.Down also
// removes it (and kills what runs in it) should the benchmark crash.
type box struct {
	name, path string
	ip         netip.Addr
	pods       []string // namespaces of the box's pods (-conn)
}

// newBox creates namespace number idx with 172.18.0.(50+idx)/24 on eth0 and
// a default route via the lab's external host, as lab members have. Every
// box gets its own address, so no neighbour cache on the underlay is stale.
func newBox(idx int) (*box, error) {
	if idx < 0 || idx > 90 {
		return nil, fmt.Errorf("box %d: out of underlay addresses", idx)
	}
	b := &box{name: fmt.Sprintf("%sbench%d", lab.NSPrefix, idx), ip: netip.AddrFrom4([4]byte{172, 18, 0, byte(50 + idx)})}
	path, err := netnsutil.NewNamed(b.name)
	if err != nil {
		return nil, err
	}
	b.path = path
	if err := b.attach(fmt.Sprintf("ul-bench%d", idx)); err != nil {
		b.close()
		return nil, fmt.Errorf("attaching %s to the underlay: %w", b.name, err)
	}
	return b, nil
}

func (b *box) attach(veth string) error { return benchlab.AttachUnderlay(b.path, veth, b.ip) }

// close deletes the namespace and its pods'; their veth pairs go with them.
func (b *box) close() {
	for _, p := range b.pods {
		_ = netnsutil.Delete(p)
	}
	_ = netnsutil.Delete(b.name)
}

// output runs a command inside the box and returns its stdout.
func (b *box) output(args ...string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := netnsutil.Do(b.path, cmd.Run); err != nil {
		return "", fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

func (b *box) start(logPath string, args []string) (*proc, error) {
	return benchlab.Start(b.path, logPath, args)
}

// hasIP reports whether ip occurs in text as a whole address (10.96.0.1 does
// not match inside 10.96.0.10 or 110.96.0.1).
func hasIP(text, ip string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], ip)
		if j < 0 {
			return false
		}
		s, e := i+j, i+j+len(ip)
		before := s == 0 || !(isDigit(text[s-1]) || text[s-1] == '.')
		after := e == len(text) || !(isDigit(text[e]) || text[e] == '.' && e+1 < len(text) && isDigit(text[e+1]))
		if before && after {
			return true
		}
		i = s + 1
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// endpointRE matches a bench endpoint as a DNAT target: iptables-save's
// "--to-destination 10.244.0.1:8080", nft's "dnat to 10.244.0.1:8080" and
// the elements of nft's "dnat ip addr . port to numgen ... map { 0 :
// 10.244.0.1 . 8080, ... }".
var endpointRE = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+(?::| \. )` + strconv.Itoa(endpointPort) + `\b`)

// countEndpoints counts the endpoint DNAT targets in a ruleset dump.
func countEndpoints(dump string) int { return len(endpointRE.FindAllStringIndex(dump, -1)) }

// completeState checks a ruleset dump against the seeded state: want
// endpoint DNAT targets, and the ClusterIP of every seeded Service (vips,
// by index), the last one included. It returns "" if the dump holds them
// all, else what is missing.
func completeState(dump string, want int, vips []string) string {
	idx := make(map[string]int, len(vips))
	for i, v := range vips {
		idx[v] = i
	}
	found := make([]bool, len(vips))
	n := 0
	eachIPv4(dump, func(ip string) {
		if i, ok := idx[ip]; ok && !found[i] {
			found[i] = true
			n++
		}
	})
	eps := countEndpoints(dump)
	if eps == want && n == len(vips) {
		return ""
	}
	missing := slices.Index(found, false)
	s := fmt.Sprintf("%d of %d endpoint DNATs, %d of %d ClusterIPs", eps, want, n, len(vips))
	if missing >= 0 {
		s += fmt.Sprintf(" (the first missing: %s's %s", svcName(missing), vips[missing])
		if !found[len(found)-1] {
			s += fmt.Sprintf(", the last: %s's %s", svcName(len(vips)-1), vips[len(vips)-1])
		}
		s += ")"
	}
	return s
}

// eachIPv4 calls fn with every dotted-quad IPv4 address in text: a run of
// digits and dots of four numbers, not part of a longer run.
func eachIPv4(text string, fn func(string)) {
	for i := 0; i < len(text); {
		if !isDigit(text[i]) {
			i++
			continue
		}
		j := i
		for j < len(text) && (isDigit(text[j]) || text[j] == '.') {
			j++
		}
		if tok := strings.TrimSuffix(text[i:j], "."); strings.Count(tok, ".") == 3 {
			if _, err := netip.ParseAddr(tok); err == nil {
				fn(tok)
			}
		}
		i = j
	}
}
