package tracer

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

const checkRules = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:KUBE-SVC-FILTER - [0:0]
-A INPUT -j KUBE-SVC-FILTER
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SVC-USED - [0:0]
:KUBE-SVC-UNUSED - [0:0]
:OTHER-UNUSED - [0:0]
:KUBE-SVC-USED - [0:0]
:KUBE-SVC-FILTER - [0:0]
-A PREROUTING -j KUBE-SVC-USED
-A PREROUTING -j KUBE-SVC-MISSING
-A KUBE-SVC-USED -g GONE
-A NOT-DECLARED -j ACCEPT
-A KUBE-SVC-USED -j PREROUTING
COMMIT
`

func TestCheck(t *testing.T) {
	rs := mustParse(t, checkRules)
	want := []string{
		"table nat: line 12: chain KUBE-SVC-USED declared again (first at line 9)",
		`table nat: line 15: jump to undeclared chain KUBE-SVC-MISSING (in "-A PREROUTING -j KUBE-SVC-MISSING")`,
		`table nat: line 16: goto to undeclared chain GONE (in "-A KUBE-SVC-USED -g GONE")`,
		"table nat: line 18: jump to built-in chain PREROUTING",
		"table nat: line 17: rule appended to undeclared chain NOT-DECLARED",
		"table nat: line 18: jump loop PREROUTING -> KUBE-SVC-USED -> PREROUTING",
	}
	if got := strs(rs.Check()); !slices.Equal(got, want) {
		t.Errorf("Check:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Unused chains: only with the prefix, per table (KUBE-SVC-FILTER is
	// used in filter, not in nat).
	want = append(want,
		"table nat: line 10: chain KUBE-SVC-UNUSED is declared but never jumped to",
		"table nat: line 13: chain KUBE-SVC-FILTER is declared but never jumped to")
	if got := strs(rs.CheckPrefix("KUBE-SVC-")); !slices.Equal(got, want) {
		t.Errorf("CheckPrefix:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := fmt.Sprint(rs.CheckPrefix("OTHER-")); !strings.Contains(got, "OTHER-UNUSED") || strings.Contains(got, "KUBE-SVC-UNUSED") {
		t.Errorf("CheckPrefix(OTHER-) = %s", got)
	}
}

func strs(errs []error) []string {
	var s []string
	for _, e := range errs {
		s = append(s, e.Error())
	}
	return s
}
