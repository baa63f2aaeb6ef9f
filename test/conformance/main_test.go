package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestFlags(t *testing.T) {
	t.Setenv("CONFORMANCE_MODES", "")
	for _, tc := range []struct {
		name        string
		args        []string
		env         string
		modes       []string
		focus, skip string
	}{
		{"defaults", nil, "", []string{"iptables", "nftables", "ebpf"}, defaultFocus, defaultSkip()},
		{"env", nil, "nftables, ebpf", []string{"nftables", "ebpf"}, defaultFocus, defaultSkip()},
		{"flag over env", []string{"-modes", "iptables"}, "ebpf", []string{"iptables"}, defaultFocus, defaultSkip()},
		{"conformance only", []string{"-conformance-only"}, "", []string{"iptables", "nftables", "ebpf"}, conformanceFocus, conformanceSkip},
		{"conformance only, own focus", []string{"-conformance-only", "-focus", "DNS"}, "", []string{"iptables", "nftables", "ebpf"}, "DNS", conformanceSkip},
		{"one spec", []string{"-modes", "iptables", "-focus", "should provide DNS for the cluster", "-conformance-only=false"}, "", []string{"iptables"}, "should provide DNS for the cluster", defaultSkip()},
		{"policy suite", []string{"-suite", "network-policy-api"}, "", npapiModes, "", ""},
		{"policy suite, env modes", []string{"-suite", "network-policy-api"}, "ebpf", []string{"ebpf"}, "", ""},
		{"policy suite, one test", []string{"-suite", "network-policy-api", "-focus", "CNPAdminTierPriorityField", "-modes", "nftables"}, "", []string{"nftables"}, "CNPAdminTierPriorityField", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CONFORMANCE_MODES", tc.env)
			c, err := parseFlags(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.modes, tc.modes) || c.focus != tc.focus || c.skip != tc.skip {
				t.Errorf("modes %q focus %q skip %q, want %q %q %q", c.modes, c.focus, c.skip, tc.modes, tc.focus, tc.skip)
			}
		})
	}
	if _, err := parseFlags([]string{"-modes", ","}); err == nil {
		t.Error("-modes , accepted")
	}
	for _, bad := range [][]string{{"-suite", "cyclonus"}, {"-suite", "network-policy-api", "-conformance-only"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestDefaultSkip checks that the groups' regexps compile, and leave out
// what they are meant to and nothing of a sample the lab runs.
func TestDefaultSkip(t *testing.T) {
	for _, g := range skipGroups {
		if _, err := regexp.Compile(g.Regexp); err != nil {
			t.Errorf("%s: %v", g.Reason, err)
		}
	}
	skip := regexp.MustCompile(defaultSkip())
	for _, spec := range []string{
		"[sig-network] Networking should allow creating a Pod with an SCTP HostPort [LinuxOnly] [Serial]",
		"[sig-network] [Feature:IPv6DualStack] Granular Checks: Services Secondary IP Family [LinuxOnly] should function for pod-Service: sctp [Feature:SCTPConnectivity]",
		"[sig-network] Services should work after restarting apiserver [Disruptive]",
		"[sig-network] Networking should check kube-proxy urls",
		"[sig-network] DNS configMap nameserver Forward PTR lookup should forward PTR records lookup to upstream nameserver [Slow] [Serial]",
	} {
		if !skip.MatchString(spec) {
			t.Errorf("not skipped: %s", spec)
		}
	}
	for _, spec := range []string{
		"[sig-network] DNS should provide DNS for the cluster [Conformance]",
		"[sig-network] Netpol NetworkPolicy between server and client should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP [Feature:NetworkPolicy]",
		"[sig-network] Services should serve endpoints on same port and different protocol for internal traffic on Type LoadBalancer",
		"[sig-network] IngressClass [Feature:Ingress] should set default value on new IngressClass [Serial]",
		"[sig-network] Services should implement service.kubernetes.io/service-proxy-name",
		"[sig-network] [Feature:IPv6DualStack] should create service with ipv6 cluster ip",
		"[sig-network] LoadBalancers [Feature:LoadBalancer] should handle load balancer cleanup finalizer for service [Slow]",
	} {
		if skip.MatchString(spec) {
			t.Errorf("skipped: %s", spec)
		}
	}
}

// TestDocumented checks that docs/conformance.md shows the default skip
// and each group's regexp.
func TestDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/conformance.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.Contains(doc, "\n"+defaultSkip()+"\n") {
		t.Errorf("docs/conformance.md does not show the default skip %s", defaultSkip())
	}
	for _, g := range skipGroups {
		if !strings.Contains(doc, "`"+g.Regexp+"`") {
			t.Errorf("docs/conformance.md does not name group %q's regexp `%s`", g.Reason, g.Regexp)
		}
	}
	for _, s := range []string{conformanceFocus, conformanceSkip, defaultFocus} {
		if !strings.Contains(doc, s) {
			t.Errorf("docs/conformance.md does not name %s", s)
		}
	}
}
