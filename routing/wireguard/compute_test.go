package wireguard_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/weftnet/weft/routing/wireguard"
)

func pub(t *testing.T) string {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey().String()
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestComputePeersRoutesAndErrors(t *testing.T) {
	self := wireguard.Node{Name: "a", PodCIDRs: []netip.Prefix{pfx("10.244.1.0/24"), pfx("fd00:10:244:1::/64")}}
	shared := pub(t)
	nodes := []wireguard.Node{
		self,
		{Name: "b", PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24"), pfx("fd00:10:244:2::/64")}, PublicKey: pub(t), Endpoint: "192.168.0.2:51822"},
		{Name: "c", PodCIDRs: []netip.Prefix{pfx("10.244.3.0/24")}, PublicKey: pub(t), Endpoint: "[fd00::3]:51822"},
		{Name: "d", PodCIDRs: []netip.Prefix{pfx("10.244.4.0/24")}, PublicKey: "short", Endpoint: "192.168.0.4:51822"},
		{Name: "e", PodCIDRs: []netip.Prefix{pfx("10.244.5.0/24")}, PublicKey: pub(t), Endpoint: "127.0.0.1:51822"},
		{Name: "f", PodCIDRs: []netip.Prefix{pfx("10.244.6.0/24")}, PublicKey: pub(t), Endpoint: "192.168.0.6:0"},
		{Name: "g", PodCIDRs: []netip.Prefix{pfx("10.244.7.0/24")}},
		{Name: "h", PodCIDRs: []netip.Prefix{pfx("10.244.8.0/24")}, PublicKey: shared, Endpoint: "192.168.0.8:51822"},
		{Name: "i", PodCIDRs: []netip.Prefix{pfx("10.244.9.0/24")}, PublicKey: shared, Endpoint: "192.168.0.9:51822"},
		{Name: "j", PublicKey: pub(t), Endpoint: "192.168.0.10:51822"}, // no podCIDR: nothing to route
	}
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			d, errs := wireguard.Compute(wireguard.Config{Self: self, Strict: strict}, nodes)
			var peers []string
			for _, p := range d.Peers {
				peers = append(peers, fmt.Sprintf("%s %s %v", p.Node, p.Endpoint, p.AllowedIPs))
			}
			want := []string{
				"b 192.168.0.2:51822 [10.244.2.0/24 fd00:10:244:2::/64]",
				"c [fd00::3]:51822 [10.244.3.0/24]",
				"h 192.168.0.8:51822 [10.244.8.0/24]",
			}
			if !slices.Equal(peers, want) {
				t.Errorf("peers\n%s\nwant\n%s", strings.Join(peers, "\n"), strings.Join(want, "\n"))
			}
			var bad []string
			for _, e := range errs {
				bad = append(bad, e.Node+" "+e.Field)
			}
			wantBad := []string{
				"d metadata.annotations[" + wireguard.PublicKeyAnnotation + "]",
				"e metadata.annotations[" + wireguard.EndpointAnnotation + "]",
				"f metadata.annotations[" + wireguard.EndpointAnnotation + "]",
				"g metadata.annotations[" + wireguard.PublicKeyAnnotation + "]",
				"i metadata.annotations[" + wireguard.PublicKeyAnnotation + "]",
			}
			if !slices.Equal(bad, wantBad) {
				t.Errorf("errors %v, want %v", bad, wantBad)
			}
			var routes []string
			for _, r := range d.Routes {
				routes = append(routes, r.String())
			}
			wantRoutes := []string{
				"route 10.244.2.0/24 dev weft.wg table 87 src 10.244.1.0",
				"route 10.244.3.0/24 dev weft.wg table 87 src 10.244.1.0",
				"route 10.244.8.0/24 dev weft.wg table 87 src 10.244.1.0",
				"route fd00:10:244:2::/64 dev weft.wg table 87 src fd00:10:244:1::",
			}
			if strict {
				// Every other node's podCIDRs, tunnel or not.
				for _, p := range []string{"10.244.2.0/24", "10.244.3.0/24", "10.244.4.0/24", "10.244.5.0/24", "10.244.6.0/24",
					"10.244.7.0/24", "10.244.8.0/24", "10.244.9.0/24", "fd00:10:244:2::/64"} {
					wantRoutes = append(wantRoutes, "blackhole "+p+" metric 4096 table 87")
				}
			}
			slices.Sort(routes)
			slices.Sort(wantRoutes)
			if !slices.Equal(routes, wantRoutes) {
				t.Errorf("routes\n%s\nwant\n%s", strings.Join(routes, "\n"), strings.Join(wantRoutes, "\n"))
			}
			if fmt.Sprint(d.Addrs) != "[10.244.1.0/32 fd00:10:244:1::/128]" {
				t.Errorf("device addresses %v", d.Addrs)
			}
		})
	}
}

func TestComputeIsOrderIndependent(t *testing.T) {
	shared := pub(t)
	nodes := []wireguard.Node{
		{Name: "x", PodCIDRs: []netip.Prefix{pfx("10.244.2.0/24")}, PublicKey: shared, Endpoint: "192.168.0.2:1"},
		{Name: "y", PodCIDRs: []netip.Prefix{pfx("10.244.3.0/24")}, PublicKey: shared, Endpoint: "192.168.0.3:1"},
	}
	self := wireguard.Config{Self: wireguard.Node{Name: "a", PodCIDRs: []netip.Prefix{pfx("10.244.1.0/24")}}}
	d1, e1 := wireguard.Compute(self, nodes)
	d2, e2 := wireguard.Compute(self, []wireguard.Node{nodes[1], nodes[0]})
	if fmt.Sprint(d1, e1) != fmt.Sprint(d2, e2) || len(d1.Peers) != 1 || d1.Peers[0].Node != "x" {
		t.Fatalf("order changed the result:\n%v %v\n%v %v", d1, e1, d2, e2)
	}
}

// TestPeerChanges: a resync writes only new or changed peers and removes
// the ones no longer wanted; the same peers in another order, or an
// endpoint the kernel reports IPv4-mapped, are no change.
func TestPeerChanges(t *testing.T) {
	k := func() wgtypes.Key {
		key, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		return key.PublicKey()
	}
	a, b, c, d := k(), k(), k(), k()
	ep := netip.MustParseAddrPort
	have := []wireguard.Peer{
		{PublicKey: a, Endpoint: ep("[::ffff:192.168.0.1]:51822"), AllowedIPs: []netip.Prefix{pfx("fd00::/64"), pfx("10.244.1.0/24")}},
		{PublicKey: b, Endpoint: ep("192.168.0.2:51822"), AllowedIPs: []netip.Prefix{pfx("10.244.2.0/24")}},
		{PublicKey: c, Endpoint: ep("192.168.0.3:51822"), AllowedIPs: []netip.Prefix{pfx("10.244.3.0/24")}},
	}
	want := []wireguard.Peer{
		{PublicKey: a, Endpoint: ep("192.168.0.1:51822"), AllowedIPs: []netip.Prefix{pfx("10.244.1.0/24"), pfx("fd00::/64")}},
		{PublicKey: b, Endpoint: ep("192.168.0.22:51822"), AllowedIPs: []netip.Prefix{pfx("10.244.2.0/24")}},
		{PublicKey: d, Endpoint: ep("192.168.0.4:51822"), AllowedIPs: []netip.Prefix{pfx("10.244.4.0/24")}},
	}
	remove, upsert := wireguard.PeerChanges(have, want)
	if !slices.Equal(remove, []wgtypes.Key{c}) || len(upsert) != 2 || upsert[0].PublicKey != b || upsert[1].PublicKey != d {
		t.Fatalf("remove %v, upsert %v: want c removed, b (new endpoint) and d (new) written", remove, upsert)
	}
	if remove, upsert := wireguard.PeerChanges(want, want); len(remove) != 0 || len(upsert) != 0 {
		t.Fatalf("no change: remove %v, upsert %v", remove, upsert)
	}
}
