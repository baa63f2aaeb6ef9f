package lab

import (
	"strings"
	"testing"
)

func TestMembersOnRacks(t *testing.T) {
	type want struct{ ip, gw string }
	for _, tc := range []struct {
		nodes, racks int
		want         map[string]want
	}{
		{3, 0, map[string]want{
			"cp": {"172.18.0.2", "172.18.0.100"}, "ext": {"172.18.0.100", "invalid IP"},
			"node1": {"172.18.0.11", "172.18.0.100"}, "node3": {"172.18.0.13", "172.18.0.100"},
		}},
		{3, 2, map[string]want{
			"cp": {"172.18.0.2", "172.18.0.1"}, "ext": {"172.18.100.100", "172.18.100.1"},
			"node1": {"172.18.0.11", "172.18.0.1"}, "node2": {"172.18.1.12", "172.18.1.1"}, "node3": {"172.18.0.13", "172.18.0.1"},
		}},
	} {
		ms := Members(tc.nodes, tc.racks)
		if got := len(NodeMembers(ms)); got != tc.nodes {
			t.Errorf("%d racks: %d nodes, want %d", tc.racks, got, tc.nodes)
		}
		for _, m := range ms {
			w, ok := tc.want[m.Name]
			if !ok {
				continue
			}
			if m.IP.String() != w.ip || m.Gateway.String() != w.gw {
				t.Errorf("%d racks: %s at %s via %s, want %s via %s", tc.racks, m.Name, m.IP, m.Gateway, w.ip, w.gw)
			}
		}
	}
}

func TestCheckTopology(t *testing.T) {
	for _, tc := range []struct {
		o       Options
		wantErr string
	}{
		{Options{Routing: "hostgw"}, ""},
		{Options{Routing: "bgp", Racks: 2}, ""},
		{Options{Routing: "vxlan", Racks: 2}, ""},
		{Options{Routing: "hostgw", Racks: 2}, "--routing hostgw: nodes on 2 racks are on different subnets"},
		{Options{Routing: "bgp", Racks: MaxRacks + 1}, "--racks"},
		{Options{Routing: "ospf"}, `--routing: "ospf"`},
	} {
		err := checkTopology(tc.o)
		if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.wantErr)
		}
	}
}

func TestBirdConfigPeersEveryNode(t *testing.T) {
	conf := birdConfig(Members(3, 2), 64512)
	for _, want := range []string{
		"protocol bgp node1 from node { neighbor 172.18.0.11 as 64512; }",
		"protocol bgp node2 from node { neighbor 172.18.1.12 as 64512; }",
		"protocol bgp node3 from node { neighbor 172.18.0.13 as 64512; }",
		"local as 65000;", `password "` + ToRPassword() + `";`, "graceful restart on;", "merge paths on;",
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("the ToR's configuration lacks %q:\n%s", want, conf)
		}
	}
}

func TestDualStackMembers(t *testing.T) {
	ms := Members(2, 0)
	addIPv6(ms)
	want := map[string][3]string{ // IP6, Gateway6, the kubelet's --node-ip
		"cp":    {"fd00:18::2", "fd00:18::100", "172.18.0.2,fd00:18::2"},
		"ext":   {"fd00:18::100", "invalid IP", "172.18.0.100,fd00:18::100"},
		"node2": {"fd00:18::12", "fd00:18::100", "172.18.0.12,fd00:18::12"},
	}
	for _, m := range ms {
		w, ok := want[m.Name]
		if !ok {
			continue
		}
		if got := [3]string{m.IP6.String(), m.Gateway6.String(), m.nodeIPs()}; got != w {
			t.Errorf("%s: got %v, want %v", m.Name, got, w)
		}
	}
}
