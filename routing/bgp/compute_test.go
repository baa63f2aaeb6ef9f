package bgp_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weftnet/weft/routing/bgp"
)

func TestParseRefusesBadConfigNamingTheField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, field string
	}{
		{"unknown key", "asn: 64512\nbogus: 1\n", `unknown field "bogus"`},
		{"asn type", "asn: sixty\n", "asn"},
		{"restart time", "restartTimeSeconds: 5000\n", "restartTimeSeconds"},
		{"reflector selector empty", "routeReflectors: {nodeSelector: {}}\n", "routeReflectors.nodeSelector"},
		{"reflector selector", "routeReflectors: {nodeSelector: {'a b': x}}\n", "routeReflectors.nodeSelector"},
		{"cluster id", "routeReflectors: {nodeSelector: {rr: 'true'}, clusterID: 'fd00::1'}\n", "routeReflectors.clusterID"},
		{"import prefix", "import: {prefixes: [10.0.0.1/8]}\n", "import.prefixes[0]"},
		{"service cidr", "announce: {serviceCIDRs: [10.96.0.0/16, nope]}\n", "announce.serviceCIDRs[1]"},
		{"community", "announce: {communities: {podCIDR: ['70000:1']}}\n", "announce.communities.podCIDR[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := bgp.Parse(map[string]string{bgp.ConfigKey: tc.yaml})
			if err == nil || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), bgp.ConfigKey) {
				t.Fatalf("Parse(%q) = %v, want an error naming %s and %q", tc.yaml, err, bgp.ConfigKey, tc.field)
			}
		})
	}
	if _, _, err := bgp.Parse(map[string]string{"config.yml": "asn: 1"}); err == nil || !strings.Contains(err.Error(), "config.yml") {
		t.Errorf("a ConfigMap key other than %s: %v", bgp.ConfigKey, err)
	}
}

func TestParseSkipsOnlyTheBadPeer(t *testing.T) {
	yaml := `peers:
- {name: good, address: 172.18.0.1, asn: 65000}
- {name: badaddr, address: 172.18.0.300, asn: 65000}
- {name: badasn, address: 172.18.0.2, asn: 0}
- {name: both, address: 172.18.0.3, asn: 65000, passwordFile: /x, passwordSecret: {name: s, key: k}}
- {name: dup, address: 172.18.0.1, asn: 65001}
- {name: timers, address: 172.18.0.4, asn: 65000, holdTimeSeconds: 9, keepaliveSeconds: 4}
- {name: fam, address: 172.18.0.5, asn: 65000, families: [ipv4, ipx]}
- {name: ibgp-multihop, address: 172.18.0.6, asn: 64512, multihopTTL: 2}
- {name: v6, address: "fd00:18::1", asn: 65000, families: [ipv6], nodeSelector: {rack: a}}
`
	s, peerErrs, err := bgp.Parse(map[string]string{bgp.ConfigKey: yaml})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range s.Peers {
		names = append(names, p.Name)
	}
	if !slices.Equal(names, []string{"good", "v6"}) {
		t.Errorf("peers kept %v, want good and v6", names)
	}
	want := []string{"peers[1].address", "peers[2].asn", "peers[3].passwordSecret", "peers[4].address", "peers[5].keepaliveSeconds", "peers[6].families[1]", "peers[7].multihopTTL"}
	if len(peerErrs) != len(want) {
		t.Fatalf("peer errors %v, want %d", peerErrs, len(want))
	}
	for i, e := range peerErrs {
		if !strings.Contains(e.Error(), want[i]) || !strings.Contains(e.Error(), bgp.ConfigKey) {
			t.Errorf("error %d: %v, want it to name %s", i, e, want[i])
		}
	}
	if v6 := s.Peers[1]; v6.IPv4 || !v6.IPv6 {
		t.Errorf("families of v6: ipv4 %v ipv6 %v", v6.IPv4, v6.IPv6)
	}
	if s.ASN != bgp.DefaultASN || s.RestartTime != bgp.DefaultRestartTime {
		t.Errorf("defaults: asn %d restart %d", s.ASN, s.RestartTime)
	}
}

func mustParse(t *testing.T, yaml string) bgp.Settings {
	t.Helper()
	s, errs, err := bgp.Parse(map[string]string{bgp.ConfigKey: yaml})
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	return s
}

func testNodes() []bgp.Node {
	var ns []bgp.Node
	for i := 1; i <= 4; i++ {
		n := bgp.Node{Name: nodeName(i), InternalIPs: []netip.Addr{nodeIP4(i), nodeIP6(i)}, PodCIDRs: []netip.Prefix{podCIDR4(i), podCIDR6(i)}}
		if i <= 2 {
			n.Labels = map[string]string{"rr": "true", "rack": "a"}
		}
		ns = append(ns, n)
	}
	return ns
}

func neighbors(p bgp.Plan) []string {
	var out []string
	for _, n := range p.Neighbors {
		s := n.Name
		if n.RRClient {
			s += "(client)"
		}
		if n.External {
			s += "(ext)"
		}
		out = append(out, s)
	}
	return out
}

func TestComputeSessions(t *testing.T) {
	nodes := testNodes()
	mesh, errs := bgp.Compute(bgp.Input{Self: nodeName(3), Nodes: nodes, Settings: mustParse(t, "")})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := neighbors(mesh); !slices.Equal(got, []string{"node-1", "node-2", "node-4"}) {
		t.Errorf("full mesh: %v", got)
	}
	if n := mesh.Neighbors[0]; n.ASN != bgp.DefaultASN || n.Local != nodeIP4(3) || !n.IPv4 || !n.IPv6 || !n.Passive {
		t.Errorf("mesh neighbour %+v: want the cluster ASN, local address node-3's IPv4, both families, passive (node-1 dials)", n)
	}
	if n := mesh.Neighbors[2]; n.Passive {
		t.Errorf("mesh neighbour %+v: node-3 dials node-4", n)
	}
	rr := mustParse(t, "routeReflectors: {nodeSelector: {rr: 'true'}}\npeers:\n- {name: tor-a, address: 172.18.0.1, asn: 65000, nodeSelector: {rack: a}}\n")
	client, _ := bgp.Compute(bgp.Input{Self: nodeName(3), Nodes: nodes, Settings: rr})
	if got := neighbors(client); !slices.Equal(got, []string{"node-1", "node-2"}) || client.Reflector {
		t.Errorf("client: %v reflector %v, want only the reflectors", got, client.Reflector)
	}
	refl, _ := bgp.Compute(bgp.Input{Self: nodeName(1), Nodes: nodes, Settings: rr})
	if got := neighbors(refl); !slices.Equal(got, []string{"tor-a(ext)", "node-2", "node-3(client)", "node-4(client)"}) || !refl.Reflector || refl.ClusterID != nodeIP4(1) {
		t.Errorf("reflector: %v reflector %v cluster id %s", got, refl.Reflector, refl.ClusterID)
	}
}

func TestComputePasswords(t *testing.T) {
	s := mustParse(t, "peers:\n- {name: tor, address: 172.18.0.1, asn: 65000, passwordSecret: {name: bgp, key: tor}}\n")
	p, errs := bgp.Compute(bgp.Input{Self: nodeName(1), Nodes: testNodes(), Settings: s})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "peers[0].passwordSecret") || slices.Contains(neighbors(p), "tor(ext)") {
		t.Errorf("missing password: errors %v, neighbours %v: want the peer skipped, the field named", errs, neighbors(p))
	}
	pw, lerrs := bgp.LoadPasswords(s, func(name, key string) (string, error) {
		if name == "bgp" && key == "tor" {
			return "s3cret", nil
		}
		return "", errors.New("not found")
	})
	p, errs = bgp.Compute(bgp.Input{Self: nodeName(1), Nodes: testNodes(), Settings: s, Passwords: pw})
	if len(lerrs)+len(errs) > 0 || p.Neighbors[0].Password != "s3cret" {
		t.Errorf("with the secret: %v %v %+v", lerrs, errs, p.Neighbors[0])
	}
}

func TestComputeAnnouncements(t *testing.T) {
	s := mustParse(t, `announce:
  serviceCIDRs: [10.96.0.0/16]
  externalIPs: true
  loadBalancerIPs: true
  communities: {podCIDR: ["64512:100"], loadBalancerIP: ["64512:300", "7"], externalIP: ["64512:200"]}
`)
	svcs := []bgp.Service{
		{Key: "a/cluster", ExternalIPs: []netip.Addr{netip.MustParseAddr("172.20.0.1")}, LBIPs: []netip.Addr{netip.MustParseAddr("172.20.0.1"), netip.MustParseAddr("fd00:20::1")}},
		{Key: "a/local-ready", LBIPs: []netip.Addr{netip.MustParseAddr("172.20.0.2")}, LocalOnly: true, LocalReady: true},
		{Key: "a/local-elsewhere", LBIPs: []netip.Addr{netip.MustParseAddr("172.20.0.3")}, LocalOnly: true},
	}
	p, errs := bgp.Compute(bgp.Input{Self: nodeName(1), Nodes: testNodes(), Settings: s, Services: svcs})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var got []string
	for _, a := range p.Announcements {
		got = append(got, fmt.Sprint(a.Prefix, " ", a.NextHop, " ", a.Kind, " ", a.Communities))
	}
	const pod, ext, lb = 64512<<16 | 100, 64512<<16 | 200, 64512<<16 | 300
	want := []string{
		"10.96.0.0/16 172.18.0.11 serviceCIDR []",
		fmt.Sprint("10.244.1.0/24 172.18.0.11 podCIDR ", []uint32{pod}),
		fmt.Sprint("172.20.0.1/32 172.18.0.11 externalIP ", []uint32{7, ext, lb}),
		fmt.Sprint("172.20.0.2/32 172.18.0.11 loadBalancerIP ", []uint32{7, lb}),
		fmt.Sprint("fd00:10:244:1::/64 fd00:18::11 podCIDR ", []uint32{pod}),
		fmt.Sprint("fd00:20::1/128 fd00:18::11 loadBalancerIP ", []uint32{7, lb}),
	}
	if !slices.Equal(got, want) {
		t.Errorf("announcements\n got %q\nwant %q", got, want)
	}
	// A node without an IPv6 address cannot announce IPv6: said, not
	// silently dropped.
	nodes := testNodes()
	nodes[0].InternalIPs = nodes[0].InternalIPs[:1]
	_, errs = bgp.Compute(bgp.Input{Self: nodeName(1), Nodes: nodes, Settings: s, Services: svcs})
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "PodCIDRs") || !strings.Contains(errs[1].Error(), "service a/cluster: status.loadBalancer.ingress") {
		t.Errorf("IPv4-only node: %v", errs)
	}
	if _, errs := bgp.Compute(bgp.Input{Self: "ghost", Nodes: nodes}); len(errs) != 1 {
		t.Errorf("self missing: %v", errs)
	}
}

func TestImportPolicyAndECMP(t *testing.T) {
	s := mustParse(t, "import: {prefixes: [203.0.113.0/24, 10.0.0.0/8, 'fd00:99::/32']}\nannounce: {serviceCIDRs: [10.96.0.0/16]}\n")
	plan, _ := bgp.Compute(bgp.Input{Self: nodeName(1), Nodes: testNodes(), Settings: s, ClusterCIDRs: clusterCIDRs})
	tor1, tor2 := routerIP4(1), routerIP4(2)
	c := func(prefix string, nh netip.Addr, mod ...func(*bgp.Candidate)) bgp.Candidate {
		cd := bgp.Candidate{Prefix: netip.MustParsePrefix(prefix), NextHop: nh, LocalPref: 100, ASPathLen: 1}
		for _, m := range mod {
			m(&cd)
		}
		return cd
	}
	longer := func(cd *bgp.Candidate) { cd.ASPathLen = 2 }
	local := func(cd *bgp.Candidate) { cd.Local = true }
	paths := []bgp.Candidate{
		c("10.244.2.0/24", nodeIP4(2)),            // node-2's podCIDR from node-2
		c("10.244.3.0/24", tor1),                  // node-3's podCIDR from a router: refused...
		c("10.244.3.0/24", nodeIP4(3), longer),    // ...so node-3's own, though longer, wins
		c("fd00:10:244:4::/64", nodeIP6(4)),       // IPv6 podCIDR
		c("10.244.1.0/24", nodeIP4(1), local),     // our own
		c("10.244.9.0/24", tor1),                  // no such node: inside the cluster CIDR
		c("10.244.0.0/16", tor1),                  // the cluster CIDR itself
		c("10.96.0.0/16", nodeIP4(2)),             // the service CIDR
		c("10.96.5.5/32", tor1),                   // inside it
		c("0.0.0.0/0", tor1),                      // default
		c("::/0", nodeIP6(2)),                     // default
		c("198.51.100.0/24", tor1),                // outside the import prefixes
		c("10.0.0.0/8", tor1),                     // wider than the cluster CIDR
		c("10.1.0.0/16", tor1),                    // inside an import prefix
		c("203.0.113.0/24", tor1),                 // ECMP
		c("203.0.113.0/24", tor2),                 // ECMP
		c("203.0.113.0/24", routerIP4(3), longer), // not equal
		c("fd00:99:1::/48", netip.MustParseAddr("fd00:18::1")),
		c("fd00:99:2::/48", tor1), // family mismatch
	}
	got := bgp.Select(paths, plan.Import)
	want := []bgp.Route{
		route(netip.MustParsePrefix("10.1.0.0/16"), tor1),
		route(podCIDR4(2), nodeIP4(2)),
		route(podCIDR4(3), nodeIP4(3)),
		route(external, tor1, tor2),
		route(netip.MustParsePrefix("fd00:10:244:4::/64"), nodeIP6(4)),
		route(netip.MustParsePrefix("fd00:99:1::/48"), netip.MustParseAddr("fd00:18::1")),
	}
	if show(got) != show(want) {
		t.Errorf("Select\n got %s\nwant %s", show(got), show(want))
	}
	// Deleting node-2 from the API drops its route, whatever the RIB holds.
	nodes := slices.DeleteFunc(testNodes(), func(n bgp.Node) bool { return n.Name == nodeName(2) })
	plan, _ = bgp.Compute(bgp.Input{Self: nodeName(1), Nodes: nodes, Settings: s, ClusterCIDRs: clusterCIDRs})
	for _, r := range bgp.Select(paths, plan.Import) {
		if r.Dst == podCIDR4(2) {
			t.Errorf("deleted node-2's podCIDR still selected: %v", r)
		}
	}
}
