package tracer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// trace parses text and traces f, failing the test on any error.
func trace(t *testing.T, text string, f Flow) []Outcome {
	t.Helper()
	outs, err := mustParse(t, text).Trace(f)
	if err != nil {
		t.Fatalf("Trace: %v", err)
	}
	return outs
}

func TestGoto(t *testing.T) {
	const rules = `*filter
:INPUT DROP [0:0]
:FORWARD DROP [0:0]
:A - [0:0]
:B - [0:0]
:C - [0:0]
-A FORWARD -j A
-A FORWARD -p udp -j ACCEPT
-A FORWARD -j REJECT
-A A -g B
-A A -m comment --comment "skipped: B returns to FORWARD, not to A" -j DROP
-A B -p udp -j RETURN
-A INPUT -g C
-A INPUT -m comment --comment "skipped: C returns to the policy" -j ACCEPT
-A C -p tcp -j RETURN
-A C -j ACCEPT
COMMIT
`
	for _, tc := range []struct {
		dst, proto, want string
	}{
		{"10.0.0.2", "udp", "ACCEPT-no-DNAT"}, // B RETURNs to FORWARD
		{"10.0.0.2", "tcp", "REJECT"},         // B falls off its end: back to FORWARD
		{"192.168.0.10", "tcp", "DROP"},       // C RETURNs from a goto in INPUT: policy
		{"192.168.0.10", "udp", "ACCEPT-no-DNAT"},
	} {
		got := Targets(trace(t, rules, fl("10.0.0.1", tc.dst, 80, tc.proto)))
		if !slices.Equal(got, []string{tc.want}) {
			t.Errorf("%s %s: got %q, want %s", tc.dst, tc.proto, got, tc.want)
		}
	}
}

func TestNegation(t *testing.T) {
	const rules = `*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING ! -s 10.0.0.0/8 -j MARK --or-mark 0x1
-A PREROUTING -p tcp ! --dport 80 -j MARK --or-mark 0x2
-A PREROUTING -m addrtype ! --dst-type LOCAL -j MARK --or-mark 0x4
-A PREROUTING ! -i eth+ -j MARK --or-mark 0x8
-A PREROUTING -m mark ! --mark 0x100/0x100 -j MARK --or-mark 0x10
-A PREROUTING -m conntrack ! --ctstate ESTABLISHED,RELATED -j MARK --or-mark 0x20
-A PREROUTING ! -p udp -j MARK --or-mark 0x40
-A PREROUTING -p tcp -m multiport ! --dports 80,443:445 -j MARK --or-mark 0x80
-A PREROUTING -m recent ! --rcheck --name X -j MARK --or-mark 0x200
-A PREROUTING -m set ! --match-set S dst -j MARK --or-mark 0x400
COMMIT
`
	sets := map[string][]netip.Prefix{"S": {netip.MustParsePrefix("8.8.8.0/24")}}
	a := fl("10.1.1.1", "192.168.0.10", 80, "tcp")
	a.Sets = sets
	b := fl("172.16.0.1", "8.8.8.8", 444, "tcp")
	b.InIface, b.Mark, b.Sets = "wlan0", 0x100, sets
	for _, tc := range []struct {
		f    Flow
		want uint32
	}{
		{a, 0x10 | 0x20 | 0x40 | 0x200 | 0x400},
		{b, 0x100 | 0x1 | 0x2 | 0x4 | 0x8 | 0x20 | 0x40 | 0x200},
	} {
		outs := trace(t, rules, tc.f)
		if len(outs) != 1 || outs[0].Mark != tc.want {
			t.Errorf("%v -> %v: got %v, want mark %#x", tc.f.Src, tc.f.Dst, outs, tc.want)
		}
	}
}

func TestMarkOps(t *testing.T) {
	for _, tc := range []struct {
		op   string
		want uint32
	}{
		{"--set-xmark 0x4000/0x4000", 0xf0f0}, // bit 0x4000 was already set
		{"--set-xmark 0x0/0x4000", 0xb0f0},
		{"--set-xmark 0x1/0xff", 0xf001},
		{"--set-mark 0x3", 0x3},
		{"--set-mark 0x3/0xf", 0xf0f3},
		{"--or-mark 0x0f00", 0xfff0},
		{"--and-mark 0xff", 0xf0},
		{"--xor-mark 0xffff", 0x0f0f},
	} {
		rules := "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -j MARK " + tc.op + "\nCOMMIT\n"
		f := fl("10.0.0.1", "10.0.0.2", 80, "tcp")
		f.Mark = 0xf0f0
		if outs := trace(t, rules, f); len(outs) != 1 || outs[0].Mark != tc.want {
			t.Errorf("%s: got %v, want mark %#x", tc.op, outs, tc.want)
		}
	}
}

const v6Rules = `*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:SVC - [0:0]
-A PREROUTING -d fd00:96::10/128 -p tcp -m tcp --dport 80 -j SVC
-A PREROUTING -d 10.96.0.10/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.0.1
-A PREROUTING -m addrtype --dst-type LOCAL -p tcp --dport 30080 -j SVC
-A OUTPUT -d fd00:96::10 -p tcp --dport 80 -j SVC
-A SVC ! -s fd00:244::/64 -j MARK --set-xmark 0x4000/0x4000
-A SVC -m statistic --mode random --probability 0.5 -j DNAT --to-destination [fd00:244::1]:8080
-A SVC -j DNAT --to-destination [fd00:244::2]:8080
-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
COMMIT
`

func TestIPv6(t *testing.T) {
	v6 := func(src, dst string, port uint16, local bool) Flow {
		f := fl(src, dst, port, "tcp")
		f.NodeIPs, f.Local = []netip.Addr{netip.MustParseAddr("fd00::10")}, local
		return f
	}
	eps := []string{"[fd00:244::1]:8080", "[fd00:244::2]:8080"}
	for _, tc := range []struct {
		name string
		f    Flow
		want []string
	}{
		{"pod to ClusterIP", v6("fd00:244::5", "fd00:96::10", 80, false), eps},
		{"outside to NodePort", v6("2001:db8::1", "fd00::10", 30080, false),
			[]string{"[fd00:244::1]:8080 masq", "[fd00:244::2]:8080 masq"}},
		{"node to ClusterIP", v6("fd00::10", "fd00:96::10", 80, true),
			[]string{"[fd00:244::1]:8080 masq", "[fd00:244::2]:8080 masq"}},
		{"node to NodePort on ::1: no OUTPUT rule", v6("::1", "::1", 30080, true), []string{"ACCEPT-no-DNAT"}},
		{"IPv4 flow skips IPv6 rules; DNAT keeps the port", fl("10.244.0.5", "10.96.0.10", 80, "tcp"),
			[]string{"10.244.0.1:80"}},
		{"IPv4-mapped addresses are unmapped", fl("::ffff:10.244.0.5", "::ffff:10.96.0.10", 80, "tcp"),
			[]string{"10.244.0.1:80"}},
	} {
		if got := labels(trace(t, v6Rules, tc.f)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestLoops(t *testing.T) {
	for name, body := range map[string]string{
		"jump":      "-A PREROUTING -j A\n-A A -j B\n-A B -j A\n",
		"goto":      "-A PREROUTING -j A\n-A A -g B\n-A B -g A\n",
		"self":      "-A PREROUTING -j A\n-A A -j A\n",
		"goto self": "-A PREROUTING -g A\n-A A -p udp -j RETURN\n-A A -g A\n",
	} {
		rs := mustParse(t, "*nat\n:PREROUTING ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n"+body+"COMMIT\n")
		if _, err := rs.Trace(fl("10.0.0.1", "10.0.0.2", 80, "tcp")); err == nil || !strings.Contains(err.Error(), "loop") {
			t.Errorf("%s: Trace err = %v, want a loop", name, err)
		}
		if errs := fmt.Sprint(rs.Check()); !strings.Contains(errs, "jump loop") {
			t.Errorf("%s: Check = %s, want a jump loop", name, errs)
		}
	}
}

func TestBranchLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString("*filter\n:FORWARD ACCEPT [0:0]\n")
	for i := range 13 { // 2^13 distinct marks
		fmt.Fprintf(&b, "-A FORWARD -m statistic --mode random --probability 0.5 -j MARK --or-mark %#x\n", 1<<i)
	}
	b.WriteString("COMMIT\n")
	_, err := mustParse(t, b.String()).Trace(fl("10.0.0.1", "10.0.0.2", 80, "tcp"))
	if err == nil || !strings.Contains(err.Error(), "distinct outcomes") {
		t.Errorf("err = %v, want too many outcomes", err)
	}
}

func TestTraceEdges(t *testing.T) {
	f := fl("10.0.0.1", "10.0.0.2", 80, "tcp")
	// Probabilities 0 and 1 do not branch; same outcomes are merged.
	outs := trace(t, `*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING -m statistic --mode random --probability 0.0 -j DNAT --to-destination 10.9.9.9:1
-A PREROUTING -m statistic --mode random --probability 0.5 -j LOG --log-prefix "coin "
-A PREROUTING -m statistic --mode random --probability 1.0 -j DNAT --to-destination 10.1.1.1:8080
COMMIT
`, f)
	if got := Targets(outs); len(outs) != 1 || !slices.Equal(got, []string{"10.1.1.1:8080"}) {
		t.Errorf("got %v", outs)
	}
	// No tables at all: everything is accepted.
	if got := Targets(trace(t, "", f)); !slices.Equal(got, []string{"ACCEPT-no-DNAT"}) {
		t.Errorf("empty ruleset: %q", got)
	}
	for name, text := range map[string]string{
		"undeclared jump":          "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -j NOPE\nCOMMIT\n",
		"DNAT in POSTROUTING":      "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -j DNAT --to-destination 1.2.3.4\nCOMMIT\n",
		"MASQUERADE in PREROUTING": "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j MASQUERADE\nCOMMIT\n",
		"DNAT across families":     "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j DNAT --to-destination [fd00::1]:80\nCOMMIT\n",
		"jump to built-in":         "*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -j INPUT\nCOMMIT\n",
	} {
		if _, err := mustParse(t, text).Trace(f); err == nil || !strings.Contains(err.Error(), "line 3") {
			t.Errorf("%s: err = %v, want an error at line 3", name, err)
		}
	}
}

// TestHairpinSet: a set defined in the text, looked up by three packet
// fields, and the conntrack DNAT state, the way weft masquerades hairpin
// connections.
func TestHairpinSet(t *testing.T) {
	const rules = `create H hash:ip,port,ip family inet
add H 10.0.0.1,tcp:8080,10.0.0.1
*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -d 10.96.0.1/32 -p tcp -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.0.0.1:8080
-A PREROUTING -d 10.96.0.1/32 -p tcp -j DNAT --to-destination 10.0.0.2:8080
-A POSTROUTING -m conntrack --ctstate DNAT -m set --match-set H dst,dst,src -j MASQUERADE
COMMIT
`
	for _, tc := range []struct {
		src, dst string
		want     []string
	}{
		{"10.0.0.1", "10.96.0.1", []string{"10.0.0.1:8080 masq=true", "10.0.0.2:8080 masq=false"}},
		{"10.0.0.2", "10.96.0.1", []string{"10.0.0.1:8080 masq=false", "10.0.0.2:8080 masq=false"}},
		{"10.0.0.1", "10.0.0.1", []string{"none masq=false"}}, // same tuple, not DNATed
	} {
		var got []string
		for _, o := range trace(t, rules, fl(tc.src, tc.dst, 8080, "tcp")) {
			d := "none"
			if o.DNAT.IsValid() {
				d = o.DNAT.String()
			}
			got = append(got, fmt.Sprintf("%s masq=%t", d, o.Masquerade))
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s -> %s: got %q, want %q", tc.src, tc.dst, got, tc.want)
		}
	}
}
