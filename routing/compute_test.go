package routing_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/weftnet/weft/routing"
)

func hostGWConfig(self routing.Node) routing.Config {
	return routing.Config{Mode: routing.ModeHostGW, Self: self}
}

func vxlanConfig(self routing.Node) routing.Config {
	return routing.Config{Mode: routing.ModeVXLAN, Self: self, VXLAN: routing.VXLANConfig{UnderlayMTU: 1500}}
}

// selfDevice is the device Compute derives for vxlanConfig(self).
func selfDevice(self routing.Node, local netip.Addr, mtu int) *routing.VXLANDevice {
	d := &routing.VXLANDevice{Name: routing.DefaultDevice, VNI: routing.DefaultVNI, Port: routing.DefaultPort,
		Local: local, MTU: mtu, MAC: routing.VTEPMAC(self.Name)}
	for _, p := range self.PodCIDRs {
		d.Addrs = append(d.Addrs, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
	}
	return d
}

func mustCompute(t *testing.T, cfg routing.Config, nodes []routing.Node) routing.Desired {
	t.Helper()
	d, errs := routing.Compute(cfg, nodes)
	if len(errs) > 0 {
		t.Fatalf("Compute: unexpected errors %v", errs)
	}
	return d
}

func assertDesired(t *testing.T, got, want routing.Desired) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("desired state:\n got %s\nwant %s", dumpDesired(got), dumpDesired(want))
	}
}

func dumpDesired(d routing.Desired) string {
	var b strings.Builder
	fmt.Fprintf(&b, "mode=%s", d.Mode)
	if d.Device != nil {
		fmt.Fprintf(&b, "\n  device %+v", *d.Device)
	}
	for _, r := range d.Routes {
		fmt.Fprintf(&b, "\n  %s", r)
	}
	for _, n := range d.Neighbors {
		fmt.Fprintf(&b, "\n  %s", n)
	}
	for _, f := range d.FDB {
		fmt.Fprintf(&b, "\n  %s", f)
	}
	return b.String()
}

// TestComputeHostGW: one route per other node, via its InternalIP, in
// podCIDR order; self is excluded even when listed.
func TestComputeHostGW(t *testing.T) {
	for _, tc := range []struct {
		name string
		node func(int) routing.Node
	}{{"ipv4", v4Node}, {"dual-stack", dualNode}} {
		t.Run(tc.name, func(t *testing.T) {
			self := tc.node(1)
			d := mustCompute(t, hostGWConfig(self), []routing.Node{tc.node(3), self, tc.node(2)})
			want := routing.Desired{Mode: routing.ModeHostGW}
			want.Routes = append(hostGWRoutes(tc.node(2)), hostGWRoutes(tc.node(3))...)
			slices.SortFunc(want.Routes, func(a, b routing.Route) int { return a.Dst.Addr().Compare(b.Dst.Addr()) })
			assertDesired(t, d, want)
		})
	}
}

// TestComputeVXLAN: the device, and per remote node a route and neighbour
// per family and one FDB entry to its underlay address.
func TestComputeVXLAN(t *testing.T) {
	for _, tc := range []struct {
		name  string
		node  func(int) routing.Node
		ipv6  bool
		local func(int) netip.Addr
		mtu   int
	}{
		{"ipv4", v4Node, false, nodeIP4, 1500 - routing.OverheadIPv4},
		{"dual-stack over ipv4", dualNode, false, nodeIP4, 1500 - routing.OverheadIPv4},
		{"dual-stack over ipv6", dualNode, true, nodeIP6, 1500 - routing.OverheadIPv6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			self := tc.node(1)
			cfg := vxlanConfig(self)
			cfg.VXLAN.IPv6Underlay = tc.ipv6
			d := mustCompute(t, cfg, []routing.Node{tc.node(3), tc.node(2), self})
			want := routing.Desired{Mode: routing.ModeVXLAN, Device: selfDevice(self, tc.local(1), tc.mtu)}
			for _, i := range []int{2, 3} {
				rs, ns := vxlanRoutes(tc.node(i))
				want.Routes = append(want.Routes, rs...)
				want.Neighbors = append(want.Neighbors, ns...)
				want.FDB = append(want.FDB, routing.FDBEntry{MAC: routing.VTEPMAC(nodeName(i)), Dst: tc.local(i)})
			}
			slices.SortFunc(want.Routes, func(a, b routing.Route) int { return a.Dst.Addr().Compare(b.Dst.Addr()) })
			slices.SortFunc(want.Neighbors, func(a, b routing.Neighbor) int { return a.IP.Compare(b.IP) })
			slices.SortFunc(want.FDB, func(a, b routing.FDBEntry) int { return strings.Compare(a.MAC.String(), b.MAC.String()) })
			assertDesired(t, d, want)
		})
	}
}

// TestComputeVXLANDevice: defaults, overrides and the MTU arithmetic.
func TestComputeVXLANDevice(t *testing.T) {
	self := dualNode(1)
	for _, tc := range []struct {
		name string
		vx   routing.VXLANConfig
		want routing.VXLANDevice
	}{
		{"defaults, MTU left to Apply", routing.VXLANConfig{},
			routing.VXLANDevice{Name: "weft.vxlan", VNI: 1, Port: 8472, Local: nodeIP4(1)}},
		{"ipv4 underlay jumbo", routing.VXLANConfig{UnderlayMTU: 9000},
			routing.VXLANDevice{Name: "weft.vxlan", VNI: 1, Port: 8472, Local: nodeIP4(1), MTU: 8950}},
		{"ipv6 underlay", routing.VXLANConfig{UnderlayMTU: 9000, IPv6Underlay: true},
			routing.VXLANDevice{Name: "weft.vxlan", VNI: 1, Port: 8472, Local: nodeIP6(1), MTU: 8930}},
		{"explicit MTU wins", routing.VXLANConfig{MTU: 1400, UnderlayMTU: 9000},
			routing.VXLANDevice{Name: "weft.vxlan", VNI: 1, Port: 8472, Local: nodeIP4(1), MTU: 1400}},
		{"overrides", routing.VXLANConfig{Device: "vx7", VNI: 7, Port: 4789},
			routing.VXLANDevice{Name: "vx7", VNI: 7, Port: 4789, Local: nodeIP4(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := mustCompute(t, routing.Config{Mode: routing.ModeVXLAN, Self: self, VXLAN: tc.vx}, nil)
			tc.want.MAC = routing.VTEPMAC(self.Name)
			tc.want.Addrs = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/32"), netip.MustParsePrefix("fd00:10:244:1::/128")}
			if d.Device == nil || !reflect.DeepEqual(*d.Device, tc.want) {
				t.Fatalf("device %+v, want %+v", d.Device, tc.want)
			}
		})
	}
	own := mac("02:00:00:00:00:01")
	self.VTEPMAC = own
	if d := mustCompute(t, vxlanConfig(self), nil); d.Device.MAC.String() != own.String() {
		t.Fatalf("device MAC %s, want the published %s", d.Device.MAC, own)
	}
}

// TestComputeOrderIndependent: every permutation of the same nodes, good
// and bad, gives the same Desired and the same errors.
func TestComputeOrderIndependent(t *testing.T) {
	nodes := []routing.Node{dualNode(2), dualNode(3), v4Node(4), dualNode(5)}
	clash := dualNode(6)
	clash.PodCIDRs[0] = podCIDR4(3) // loses to node-3, whatever the order
	noMAC := dualNode(7)
	noMAC.VTEPMAC = nil
	nodes = append(nodes, clash, noMAC, routing.Node{Name: "node-8"})
	for _, cfg := range []routing.Config{hostGWConfig(dualNode(1)), vxlanConfig(dualNode(1))} {
		t.Run(string(cfg.Mode), func(t *testing.T) {
			want, wantErrs := routing.Compute(cfg, nodes)
			if len(wantErrs) == 0 {
				t.Fatal("the bad nodes were not reported")
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for range 20 {
				shuffled := slices.Clone(nodes)
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				got, errs := routing.Compute(cfg, shuffled)
				assertDesired(t, got, want)
				if fmt.Sprint(errs) != fmt.Sprint(wantErrs) {
					t.Fatalf("errors depend on order:\n got %v\nwant %v", errs, wantErrs)
				}
			}
		})
	}
}

// TestVTEPMAC: deterministic, unicast, locally administered, distinct.
func TestVTEPMAC(t *testing.T) {
	seen := map[string]string{}
	for i := range 1000 {
		name := fmt.Sprintf("worker-%d", i)
		m := routing.VTEPMAC(name)
		if len(m) != 6 || m[0]&0x01 != 0 || m[0]&0x02 == 0 {
			t.Fatalf("VTEPMAC(%q) = %s: not a locally administered unicast MAC", name, m)
		}
		if again := routing.VTEPMAC(name); again.String() != m.String() {
			t.Fatalf("VTEPMAC(%q) = %s then %s", name, m, again)
		}
		if other, dup := seen[m.String()]; dup {
			t.Fatalf("VTEPMAC(%q) = VTEPMAC(%q) = %s", name, other, m)
		}
		seen[m.String()] = name
	}
}
