package model

import (
	"net/netip"
	"slices"
	"testing"
)

// e builds an endpoint 10.0.0.<n>:80 on node, in zone.
func e(n byte, node, zone string, mods ...func(*Endpoint)) Endpoint {
	x := Endpoint{IP: netip.AddrFrom4([4]byte{10, 0, 0, n}), Port: 80, Ready: true, Serving: true, NodeName: node, Zone: zone}
	for _, m := range mods {
		m(&x)
	}
	return x
}

func terminating(serving bool) func(*Endpoint) {
	return func(x *Endpoint) { x.Ready, x.Serving, x.Terminating = false, serving, true }
}

func notReady(x *Endpoint) { x.Ready, x.Serving = false, false }

func zones(zs ...string) func(*Endpoint) {
	return func(x *Endpoint) { x.Hints = &Hints{Zones: zs, Nodes: x.ForNodes()} }
}

func nodes(ns ...string) func(*Endpoint) {
	return func(x *Endpoint) { x.Hints = &Hints{Zones: x.ForZones(), Nodes: ns} }
}

func TestSelect(t *testing.T) {
	cluster := &ServicePort{}
	itpLocal := &ServicePort{InternalPolicyLocal: true}
	etpLocal := &ServicePort{ExternalPolicyLocal: true, NodePort: 30080}
	etpLocalNoExternal := &ServicePort{ExternalPolicyLocal: true}
	closeSP := &ServicePort{PreferClose: true}
	for _, tc := range []struct {
		name                      string
		sp                        *ServicePort
		eps                       []Endpoint
		internal, external, local []string
		hasAny                    bool
	}{
		{name: "no endpoints", sp: cluster},
		{name: "none usable", sp: cluster, eps: []Endpoint{e(1, "me", "", notReady), e(2, "me", "", terminating(false))}},
		{name: "all ready", sp: cluster, eps: []Endpoint{e(1, "a", ""), e(2, "me", ""), e(3, "b", "")},
			internal: ips(1, 2, 3), external: ips(1, 2, 3), local: ips(2), hasAny: true},
		{name: "ready preferred to terminating", sp: cluster, eps: []Endpoint{e(1, "a", "", terminating(true)), e(2, "b", ""), e(3, "me", "", notReady)},
			internal: ips(2), external: ips(2), hasAny: true},
		{name: "none ready, serving terminating", sp: cluster,
			eps:      []Endpoint{e(1, "a", "", terminating(true)), e(2, "me", "", terminating(false)), e(3, "me", "", terminating(true)), e(4, "b", "", notReady)},
			internal: ips(1, 3), external: ips(1, 3), local: ips(3), hasAny: true},
		{name: "local falls back alone", sp: itpLocal, eps: []Endpoint{e(1, "a", ""), e(2, "me", "", terminating(true))},
			internal: ips(2), external: ips(1), local: ips(2), hasAny: true},
		{name: "iTP Local with local endpoints", sp: itpLocal, eps: []Endpoint{e(1, "a", ""), e(2, "me", ""), e(3, "me", "")},
			internal: ips(2, 3), external: ips(1, 2, 3), local: ips(2, 3), hasAny: true},
		{name: "iTP Local without local endpoints", sp: itpLocal, eps: []Endpoint{e(1, "a", ""), e(2, "b", "")},
			external: ips(1, 2), hasAny: true},
		{name: "eTP Local", sp: etpLocal, eps: []Endpoint{e(1, "a", ""), e(2, "me", "")},
			internal: ips(1, 2), external: ips(2), local: ips(2), hasAny: true},
		{name: "eTP Local without local endpoints", sp: etpLocal, eps: []Endpoint{e(1, "a", "")},
			internal: ips(1), hasAny: true},
		{name: "eTP Local without external entry", sp: etpLocalNoExternal, eps: []Endpoint{e(1, "a", ""), e(2, "me", "")},
			internal: ips(1, 2), external: ips(1, 2), local: ips(2), hasAny: true},
		{name: "zone hints used", sp: cluster, eps: []Endpoint{e(1, "a", "z1", zones("z1")), e(2, "b", "z2", zones("z2")), e(3, "c", "z2", zones("z2", "z1"))},
			internal: ips(1, 3), external: ips(1, 3), hasAny: true},
		{name: "zone hints ignored when one lacks hints", sp: cluster, eps: []Endpoint{e(1, "a", "z1", zones("z1")), e(2, "b", "z2")},
			internal: ips(1, 2), external: ips(1, 2), hasAny: true},
		{name: "zone hints: unready endpoints do not count", sp: cluster, eps: []Endpoint{e(1, "a", "z1", zones("z1")), e(2, "b", "z2", notReady), e(3, "c", "z2", zones("z2"))},
			internal: ips(1), external: ips(1), hasAny: true},
		{name: "zone hints ignored when none is for the zone", sp: cluster, eps: []Endpoint{e(1, "a", "z2", zones("z2")), e(2, "b", "z3", zones("z3"))},
			internal: ips(1, 2), external: ips(1, 2), hasAny: true},
		{name: "zone hints ignored when terminating fallback", sp: cluster, eps: []Endpoint{e(1, "a", "z2", zones("z2"), terminating(true)), e(2, "b", "z1", zones("z1"), terminating(true))},
			internal: ips(1, 2), external: ips(1, 2), hasAny: true},
		{name: "zone hints and local policy", sp: itpLocal, eps: []Endpoint{e(1, "a", "z1", zones("z1")), e(2, "me", "z2", zones("z2"))},
			internal: ips(2), external: ips(1), local: ips(2), hasAny: true},
		{name: "PreferClose with hints", sp: closeSP, eps: []Endpoint{e(1, "a", "z1", zones("z1")), e(2, "b", "z2", zones("z2"))},
			internal: ips(1), external: ips(1), hasAny: true},
		{name: "PreferClose without hints", sp: closeSP, eps: []Endpoint{e(1, "a", "z1"), e(2, "b", "z2")},
			internal: ips(1, 2), external: ips(1, 2), hasAny: true},
		{name: "node hints used", sp: cluster, eps: []Endpoint{
			e(1, "me", "z1", zones("z1"), nodes("me")), e(2, "a", "z1", zones("z1"), nodes("a")), e(3, "b", "z2", zones("z2"), nodes("b"))},
			internal: ips(1), external: ips(1), local: ips(1), hasAny: true},
		{name: "node hints not for this node: zone hints", sp: cluster, eps: []Endpoint{
			e(1, "c", "z1", zones("z1"), nodes("c")), e(2, "a", "z1", zones("z1"), nodes("a")), e(3, "b", "z2", zones("z2"), nodes("b"))},
			internal: ips(1, 2), external: ips(1, 2), hasAny: true},
		{name: "node hints incomplete: zone hints", sp: cluster, eps: []Endpoint{
			e(1, "me", "z1", zones("z1"), nodes("me")), e(2, "a", "z1", zones("z1")), e(3, "b", "z2", zones("z2"), nodes("b"))},
			internal: ips(1, 2), external: ips(1, 2), local: ips(1), hasAny: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.eps)
			s := Select(tc.sp, tc.eps, "me", "z1")
			for _, l := range []struct {
				what      string
				got, want []string
			}{{"Internal", strs(s.Internal), tc.internal}, {"External", strs(s.External), tc.external}, {"Local", strs(s.Local), tc.local}} {
				if !slices.Equal(l.got, l.want) && len(l.got)+len(l.want) > 0 {
					t.Errorf("%s = %v, want %v", l.what, l.got, l.want)
				}
			}
			if s.HasAny != tc.hasAny {
				t.Errorf("HasAny = %v", s.HasAny)
			}
			if !EqualEndpoints(in, tc.eps) {
				t.Error("Select changed its input")
			}
		})
	}
}

func TestSelectNoNodeName(t *testing.T) {
	s := Select(&ServicePort{InternalPolicyLocal: true}, []Endpoint{e(1, "", "")}, "", "")
	if len(s.Local) != 0 || len(s.Internal) != 0 || !s.HasAny {
		t.Errorf("an endpoint without a node is local to a node without a name: %+v", s)
	}
}

func ips(ns ...byte) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, n}), 80).String()
	}
	return out
}
