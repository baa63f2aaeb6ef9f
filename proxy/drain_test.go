package proxy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weftnet/weft/proxy/model"
)

// TestGoneEndpoints: which endpoints count as gone from which ports, and
// the frontends their connections may have come through.
func TestGoneEndpoints(t *testing.T) {
	name := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.TCP}
	port := func(mod func(*model.ServicePort)) *model.ServicePort {
		p := &model.ServicePort{Name: name, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00::10")},
			Port: 80, Protocol: model.TCP, NodePort: 30080, ExternalIPs: []netip.Addr{netip.MustParseAddr("198.51.100.5")},
			LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}
		if mod != nil {
			mod(p)
		}
		return p
	}
	ep := func(addr string, port uint16, terminating bool) model.Endpoint {
		return model.Endpoint{IP: netip.MustParseAddr(addr), Port: port, Ready: !terminating, Serving: true, Terminating: terminating}
	}
	a, b := ep("10.244.1.2", 8080, false), ep("10.244.1.3", 8080, false)
	for _, tc := range []struct {
		name      string
		prev, now *model.ServicePort
		had, has  []model.Endpoint
		want      []string // endpoints
	}{
		{name: "removed", prev: port(nil), now: port(nil), had: []model.Endpoint{a, b}, has: []model.Endpoint{b}, want: []string{"10.244.1.2:8080"}},
		{name: "terminating stays: it drains", prev: port(nil), now: port(nil), had: []model.Endpoint{a, b},
			has: []model.Endpoint{ep("10.244.1.2", 8080, true), b}},
		{name: "not ready stays", prev: port(nil), now: port(nil), had: []model.Endpoint{a},
			has: []model.Endpoint{{IP: a.IP, Port: a.Port}}},
		{name: "target port changed", prev: port(nil), now: port(nil), had: []model.Endpoint{a},
			has: []model.Endpoint{ep("10.244.1.2", 8081, false)}, want: []string{"10.244.1.2:8080"}},
		{name: "all removed", prev: port(nil), now: port(nil), had: []model.Endpoint{a, b}, want: []string{"10.244.1.2:8080", "10.244.1.3:8080"}},
		{name: "opted out", prev: port(nil), now: port(func(p *model.ServicePort) { p.KeepConnections = true }), had: []model.Endpoint{a}},
		{name: "Service deleted: its connections keep their path", prev: port(nil), had: []model.Endpoint{a}},
		{name: "UDP", prev: port(func(p *model.ServicePort) { p.Protocol = model.UDP }), now: port(func(p *model.ServicePort) { p.Protocol = model.UDP }),
			had: []model.Endpoint{a}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := model.State{Ports: map[model.ServicePortName]*model.ServicePort{}, Endpoints: map[model.ServicePortName][]model.Endpoint{name: tc.has}}
			if tc.now != nil {
				st.Ports[name] = tc.now
			}
			gone := goneEndpoints(st, map[model.ServicePortName]model.Prior{name: {Port: tc.prev, Endpoints: tc.had}})
			var got []string
			for _, g := range gone {
				got = append(got, g.Endpoint.String())
				if g.Service != name || g.NodePort != 30080 || !g.fronts(netip.MustParseAddrPort("172.18.0.1:30080")) ||
					!g.fronts(netip.MustParseAddrPort("[fd00::10]:80")) || !g.fronts(netip.MustParseAddrPort("198.51.100.5:80")) ||
					!g.fronts(netip.MustParseAddrPort("192.0.2.10:80")) || g.fronts(netip.MustParseAddrPort("10.96.0.10:81")) {
					t.Errorf("%+v: wrong service or frontends", g)
				}
			}
			slices.Sort(got)
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("gone %v, want %v", got, tc.want)
			}
		})
	}
}
