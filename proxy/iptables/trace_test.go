package iptables_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/iptables/tracer"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/proxytest"
)

func renderTraced(t *testing.T) *tracer.Ruleset {
	t.Helper()
	svcs, eps := proxytest.Scenario()
	st, errs := model.Build(svcs, eps)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	cfg := iptables.Config{NodeName: proxytest.NodeName, NodePortIPs: []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(proxytest.Cluster)}}
	rs, err := tracer.Parse(iptables.Payload(iptables.Render(cfg, st, 4)))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestTraceFlows walks the generated rules for the first packet of each flow
// and compares every possible outcome with what kube-proxy semantics say.
func TestTraceFlows(t *testing.T) {
	rs := renderTraced(t)
	if errs := rs.CheckPrefix("WEFT-"); len(errs) > 0 {
		t.Fatalf("ruleset structure: %v", errs)
	}
	ep := func(ip string, port int, masq bool) string { return fmt.Sprintf("%s:%d masq=%v", ip, port, masq) }
	const pod, ext, ext2, node = proxytest.PodA, proxytest.ExtIP, proxytest.ExtIP2, proxytest.NodeIP
	const podA, podB, podC, remoteEP = proxytest.PodA, proxytest.PodB, proxytest.PodC, proxytest.RemoteEP
	const lbIP, extIPv4 = proxytest.LBIP, proxytest.ExtIPv4
	cases := []struct {
		name     string
		src, dst string
		proto    string
		dport    uint16
		local    bool // sent by the node itself
		want     []string
	}{
		{"clusterIP from pod a: a (hairpin, masq), b, c", pod, "10.96.0.10", "tcp", 80, false, []string{ep(podA, 80, true), ep(podB, 80, false), ep(podC, 80, false)}},
		{"clusterIP from pod b", podB, "10.96.0.10", "tcp", 80, false, []string{ep(podA, 80, false), ep(podB, 80, true), ep(podC, 80, false)}},
		{"clusterIP second port", pod, "10.96.0.10", "tcp", 81, false, []string{ep(podA, 81, true), ep(podB, 81, false), ep(podC, 81, false)}},
		{"clusterIP from outside the cluster CIDR is masqueraded", ext, "10.96.0.10", "tcp", 80, false, []string{ep(podA, 80, true), ep(podB, 80, true), ep(podC, 80, true)}},
		{"clusterIP from the node is masqueraded", node, "10.96.0.10", "tcp", 80, true, []string{ep(podA, 80, true), ep(podB, 80, true), ep(podC, 80, true)}},
		{"clusterIP wrong port", pod, "10.96.0.10", "tcp", 8080, false, []string{"ACCEPT"}},
		{"clusterIP wrong protocol", pod, "10.96.0.10", "udp", 80, false, []string{"ACCEPT"}},
		{"unknown VIP in a used bucket", pod, "10.96.0.99", "tcp", 80, false, []string{"ACCEPT"}},
		{"VIP in an unused bucket", pod, "10.96.7.1", "tcp", 80, false, []string{"ACCEPT"}},
		{"nodePort from outside", ext, node, "tcp", 30080, false, []string{ep(podB, 80, true), ep(podC, 80, true)}},
		{"nodePort from a pod", pod, node, "tcp", 30080, false, []string{ep(podB, 80, true), ep(podC, 80, true)}},
		{"nodePort from the node", node, node, "tcp", 30080, true, []string{ep(podB, 80, true), ep(podC, 80, true)}},
		{"nodePort of np's clusterIP port is not a nodePort", ext, node, "tcp", 80, false, []string{"ACCEPT"}},
		{"unused nodePort", ext, node, "tcp", 30099, false, []string{"ACCEPT"}},
		{"nodePort UDP of a TCP service", ext, node, "udp", 30080, false, []string{"ACCEPT"}},
		{"nodePort on a non-node address", ext, "172.18.0.9", "tcp", 30080, false, []string{"ACCEPT"}},
		{"eTP Local nodePort from outside: local endpoint, source kept", ext, node, "tcp", 30081, false, []string{ep(podC, 80, false)}},
		{"eTP Local nodePort from a pod: any endpoint", pod, node, "tcp", 30081, false, []string{ep(podC, 80, false), ep(remoteEP, 80, false)}},
		{"eTP Local nodePort from the node: any endpoint, masq", node, node, "tcp", 30081, true, []string{ep(podC, 80, true), ep(remoteEP, 80, true)}},
		{"eTP Local clusterIP is cluster-wide", pod, "10.96.0.12", "tcp", 80, false, []string{ep(podC, 80, false), ep(remoteEP, 80, false)}},
		{"eTP Local nodePort without local endpoint drops", ext, node, "tcp", 30082, false, []string{"DROP"}},
		{"eTP Local without local endpoint, from a pod", pod, node, "tcp", 30082, false, []string{ep(remoteEP, 80, false)}},
		{"remote-only clusterIP works", pod, "10.96.0.13", "tcp", 80, false, []string{ep(remoteEP, 80, false)}},
		{"LB IP from an allowed source", ext, lbIP, "tcp", 80, false, []string{ep(podB, 80, true)}},
		{"LB IP from a blocked source", ext2, lbIP, "tcp", 80, false, []string{"DROP"}},
		{"LB IP from a pod (blocked: not in sourceRanges)", pod, lbIP, "tcp", 80, false, []string{"DROP"}},
		{"LB IP second port", ext, lbIP, "tcp", 81, false, []string{ep(podB, 81, true)}},
		{"LB nodePort ignores sourceRanges", ext2, node, "tcp", 30083, false, []string{ep(podB, 80, true)}},
		{"LB clusterIP", pod, "10.96.0.14", "tcp", 80, false, []string{ep(podB, 80, false)}},
		{"affinity service balances first packets", pod, "10.96.0.15", "tcp", 80, false, []string{ep(podA, 80, true), ep(podB, 80, false), ep(podC, 80, false)}},
		{"no endpoints: REJECT", pod, "10.96.0.16", "tcp", 80, false, []string{"REJECT"}},
		{"no endpoints from the node: REJECT", node, "10.96.0.16", "tcp", 80, true, []string{"REJECT"}},
		{"hairpin service: a reaches itself, masqueraded", pod, "10.96.0.21", "tcp", 80, false, []string{ep(podA, 80, true)}},
		{"no endpoints, other port also REJECT", pod, "10.96.0.16", "tcp", 81, false, []string{"REJECT"}},
		{"iTP Local: only the local endpoint", podB, "10.96.0.17", "tcp", 80, false, []string{ep(podA, 80, false)}},
		{"iTP Local without local endpoint: DROP", pod, "10.96.0.18", "tcp", 80, false, []string{"DROP"}},
		{"externalIP from outside: masq", ext, extIPv4, "tcp", 80, false, []string{ep(podB, 80, true)}},
		{"externalIP from a pod", pod, extIPv4, "tcp", 80, false, []string{ep(podB, 80, true)}},
		{"externalIP wrong port", ext, extIPv4, "tcp", 443, false, []string{"ACCEPT"}},
		{"UDP service", podB, "10.96.0.53", "udp", 81, false, []string{ep(podA, 81, false)}},
		{"UDP service hairpin", pod, "10.96.0.53", "udp", 81, false, []string{ep(podA, 81, true)}},
		{"UDP service over TCP", pod, "10.96.0.53", "tcp", 81, false, []string{"ACCEPT"}},
		{"pod to pod untouched", pod, podB, "tcp", 80, false, []string{"ACCEPT"}},
		{"outside to the node untouched", ext, node, "tcp", 22, false, []string{"ACCEPT"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			outs, err := rs.Trace(tracer.Flow{Src: netip.MustParseAddr(tc.src), Dst: netip.MustParseAddr(tc.dst), Proto: tc.proto,
				DPort: tc.dport, SPort: 40000, NodeIPs: []netip.Addr{netip.MustParseAddr(proxytest.NodeIP)}, Local: tc.local})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range outs {
				switch {
				case o.Verdict != "ACCEPT":
					got = append(got, o.Verdict)
				case o.DNAT.IsValid():
					got = append(got, fmt.Sprintf("%s masq=%v", o.DNAT, o.Masquerade))
				default:
					got = append(got, "ACCEPT")
				}
			}
			slices.Sort(got)
			got = slices.Compact(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				var trails []string
				for _, o := range outs {
					trails = append(trails, o.String()+": "+o.Trail())
				}
				t.Fatalf("got %v, want %v\n%s", got, want, strings.Join(trails, "\n"))
			}
		})
	}
}
