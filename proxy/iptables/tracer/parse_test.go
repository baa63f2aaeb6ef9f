package tracer

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseErrors(t *testing.T) {
	// Each body line is line 3 of the text (after "*filter" and a declaration).
	for _, tc := range []struct {
		line, want string
	}{
		{`-A X -m foo --bar 1 -j ACCEPT`, `unknown match module "foo"`},
		{`-A X -s 10.0.0.300/32 -j ACCEPT`, `bad address`},
		{`-A X -d fd00::/129 -j ACCEPT`, `bad prefix length`},
		{`-A X -m comment --comment "no end -j ACCEPT`, `unterminated " quote`},
		{`-A X -p tcp --frobnicate 1 -j ACCEPT`, `unknown option --frobnicate`},
		{`-A X -m conntrack --ctstate NEW --ctorigdst 1.2.3.4 -j ACCEPT`, `unknown option --ctorigdst`},
		{`-A X -p tcp -m tcp --dport 80:70 -j ACCEPT`, `bad port`},
		{`-A X -m tcp --dport 80 -j ACCEPT`, `-m tcp needs -p tcp`},
		{`-A X -p udp -m multiport --dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -j ACCEPT`, `more than 15`},
		{`-A X -p gre -j ACCEPT`, `unsupported protocol`},
		{`-A X -m addrtype --dst-type LOCAL --limit-iface-in -j ACCEPT`, `not supported`},
		{`-A X -m addrtype --dst-type LOKAL -j ACCEPT`, `unknown address type`},
		{`-A X -m statistic --mode random -j ACCEPT`, `needs --mode random --probability`},
		{`-A X -m statistic --mode random --probability 1.5 -j ACCEPT`, `bad value`},
		{`-A X -m recent --name a --seconds 5 --reap -j ACCEPT`, `needs one of --set`},
		{`-A X -m set --match-set S src,via -j ACCEPT`, `neither src nor dst`},
		{`-A X -m mark --mark 0xZZ -j ACCEPT`, `bad number`},
		{`-A X -m comment ! --comment x -j ACCEPT`, `cannot be negated`},
		{`-A X -s 10.0.0.1 ! -j ACCEPT`, `cannot be negated`},
		{`-A X -j ACCEPT !`, `"!" at end`},
		{`-A X -j ACCEPT -j DROP`, `more than one -j/-g`},
		{`-A X -j REDIRECT --to-ports 80`, `not supported`},
		{`-A X -j DNAT --to-destination 1.2.3.4`, `only valid in the nat table`},
		{`-A X -j REJECT --reject-with tcp-reset --log-prefix x`, `unknown option --log-prefix for target REJECT`},
		{`-A X -j MARK`, `MARK needs`},
		{`-A X -g ACCEPT`, `-g needs a user chain`},
		{`-A X -s`, `needs a value`},
		{`-A X 10.0.0.1`, `unexpected word`},
		{`-I X -j ACCEPT`, `unsupported command "-I"`},
		{`-X NOPE`, `-X of unknown chain`},
		{`:Y ACCEPT [0:0]`, `must have policy "-"`},
		{`:FORWARD - [0:0]`, `needs policy ACCEPT or DROP`},
		{`:Z`, `bad chain declaration`},
		{`*nat`, `opened before COMMIT`},
	} {
		text := "*filter\n:X - [0:0]\n" + tc.line + "\nCOMMIT\n"
		_, err := Parse(text)
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("%s: err = %v, want a *ParseError", tc.line, err)
			continue
		}
		msg := err.Error()
		if pe.Line != 3 || pe.Text != tc.line || !strings.Contains(msg, "line 3:") ||
			!strings.Contains(msg, fmt.Sprintf("%q", tc.line)) || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: err = %v, want line 3 and %q", tc.line, err, tc.want)
		}
	}
	nat := []struct{ line, want string }{
		{`-A X -j DNAT`, `DNAT needs --to-destination`},
		{`-A X -j DNAT --to-destination 1.2.3.4:80-90`, `ranges are not supported`},
		{`-A X -j DNAT --to-destination [fd00::1:80`, `bad address`},
		{`-A X -j DNAT --to-destination [fd00::1]:`, `bad port`},
		{`-A X -j DNAT --to-destination 1.2.3.4:0`, `bad port`},
		{`-A X -j SNAT --random`, `SNAT needs --to-source`},
		{`-A X -j MASQUERADE --to-ports x`, `bad port`},
	}
	for _, tc := range nat {
		_, err := Parse("*nat\n:X - [0:0]\n" + tc.line + "\nCOMMIT\n")
		if err == nil || !strings.Contains(err.Error(), "line 3:") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want line 3 and %q", tc.line, err, tc.want)
		}
	}
	for text, want := range map[string]string{
		"-A X -j ACCEPT\n":                        "line 1: line outside a table",
		"*filter\n-A INPUT -j ACCEPT\n":           "line 3: table \"filter\" lacks COMMIT",
		"*filter\nCOMMIT\n*filter\nCOMMIT\n":      "line 3: table \"filter\" appears twice",
		"# c\nCOMMIT\n":                           "line 2: COMMIT outside a table",
		"*raw\n-A PREROUTING -m x \"oops\nCOMMIT": "line 2: unterminated",
	} {
		if _, err := Parse(text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", text, err, want)
		}
	}
}

func TestParseAccepts(t *testing.T) {
	rs := mustParse(t, `# iptables-save -c style, quoting, -N/-X, other tables
*raw
:PREROUTING ACCEPT [10:600]
-A PREROUTING -m whatever --is-ignored -j CT --notrack
COMMIT
*filter
:INPUT ACCEPT [0:0]
:OLD - [0:0]
-N NEW-CHAIN
-X OLD
[5:300] -A INPUT -p tcp -m comment --comment "say \"hi\"" -m comment --comment 'two words' --dport 22 -j NEW-CHAIN
-A INPUT --protocol udp --source 10.0.0.0/255.0.0.0 --destination-port :1024 -j LOG --log-prefix "x y: " --log-level 4
-A INPUT -p udp -m multiport --sports 53,5353 -m udp --sport 1:65535 -j NOTRACK
-A INPUT -p tcp --syn -m state --state NEW -m statistic --mode nth --every 2 --packet 0 -j ACCEPT
-A NEW-CHAIN -j CT --zone 1
-A NEW-CHAIN
COMMIT
*nat
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -o eth0 -j SNAT --to-source 192.168.0.10 --random-fully
-A POSTROUTING -p tcp -j MASQUERADE --to-ports 1024-2048
COMMIT
`)
	if rs.Ignored["raw"] != 1 {
		t.Errorf("Ignored = %v", rs.Ignored)
	}
	in := rs.Tables["filter"].Chains["INPUT"]
	if got := in.Rules[0].Comment; got != `say "hi"; two words` {
		t.Errorf("comment = %q", got)
	}
	if _, ok := rs.Tables["filter"].Chains["OLD"]; ok {
		t.Errorf("-X OLD did not delete it")
	}
	if errs := rs.CheckPrefix(""); len(errs) != 0 {
		t.Errorf("CheckPrefix: %v", errs)
	}
	if got := addrOf(in.Rules[1]); got != "10.0.0.0/8" {
		t.Errorf("dotted mask parsed as %s", got)
	}
}

func addrOf(r *Rule) string {
	for _, m := range r.matches {
		if a, ok := m.(addrMatch); ok {
			return a.pfx.String()
		}
	}
	return ""
}
