package routing_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/weftnet/weft/routing"
)

// badCase is one bad node: Compute must leave out what wantRoutes does not
// list, report exactly wantErrs, and still route node-2 and node-3.
type badCase struct {
	name     string
	mode     routing.Mode
	node     func() routing.Node
	wantErrs []wantErr
	// routed are the bad node's podCIDRs that are still routed (the other
	// family of a half-bad node).
	routed []netip.Prefix
}

type wantErr struct {
	node, field string
	is          error
}

func withNode(i int, edit func(*routing.Node)) func() routing.Node {
	return func() routing.Node { n := dualNode(i); edit(&n); return n }
}

var badCases = []badCase{
	{name: "no podCIDR", node: withNode(4, func(n *routing.Node) { n.PodCIDRs = nil }),
		wantErrs: []wantErr{{"node-4", "PodCIDRs", routing.ErrMissing}}},
	{name: "unparseable InternalIP", mode: routing.ModeHostGW,
		node:     withNode(4, func(n *routing.Node) { n.InternalIPs = []netip.Addr{{}} }),
		wantErrs: []wantErr{{"node-4", "InternalIPs", routing.ErrInvalid}, {"node-4", "InternalIPs", routing.ErrMissing}, {"node-4", "InternalIPs", routing.ErrMissing}}},
	{name: "unparseable InternalIP", mode: routing.ModeVXLAN,
		node:     withNode(4, func(n *routing.Node) { n.InternalIPs = []netip.Addr{{}} }),
		wantErrs: []wantErr{{"node-4", "InternalIPs", routing.ErrInvalid}, {"node-4", "InternalIPs", routing.ErrMissing}}},
	{name: "no InternalIP of the family", mode: routing.ModeHostGW,
		node:     withNode(4, func(n *routing.Node) { n.InternalIPs = n.InternalIPs[:1] }),
		wantErrs: []wantErr{{"node-4", "InternalIPs", routing.ErrMissing}}, routed: []netip.Prefix{podCIDR4(4)}},
	{name: "no InternalIP of the underlay family", mode: routing.ModeVXLAN,
		node:     withNode(4, func(n *routing.Node) { n.InternalIPs = n.InternalIPs[1:] }),
		wantErrs: []wantErr{{"node-4", "InternalIPs", routing.ErrMissing}}},
	{name: "loopback InternalIP", mode: routing.ModeHostGW,
		node:     withNode(4, func(n *routing.Node) { n.InternalIPs[0] = netip.MustParseAddr("127.0.0.1") }),
		wantErrs: []wantErr{{"node-4", "InternalIPs", routing.ErrInvalid}, {"node-4", "InternalIPs", routing.ErrMissing}}, routed: []netip.Prefix{podCIDR6(4)}},
	{name: "two IPv4 InternalIPs", mode: routing.ModeHostGW,
		node:     withNode(4, func(n *routing.Node) { n.InternalIPs = append(n.InternalIPs, nodeIP4(9)) }),
		wantErrs: []wantErr{{"node-4", "InternalIPs", routing.ErrDuplicate}, {"node-4", "InternalIPs", routing.ErrMissing}}, routed: []netip.Prefix{podCIDR6(4)}},
	{name: "InternalIP of another node", mode: routing.ModeHostGW,
		node:     withNode(4, func(n *routing.Node) { n.InternalIPs[0] = nodeIP4(2) }),
		wantErrs: []wantErr{{"node-4", "InternalIPs", routing.ErrDuplicate}}, routed: []netip.Prefix{podCIDR6(4)}},
	{name: "podCIDR with host bits",
		node:     withNode(4, func(n *routing.Node) { n.PodCIDRs[0] = netip.MustParsePrefix("10.244.4.7/24") }),
		wantErrs: []wantErr{{"node-4", "PodCIDRs", routing.ErrInvalid}}, routed: []netip.Prefix{podCIDR6(4)}},
	{name: "two IPv6 podCIDRs",
		node:     withNode(4, func(n *routing.Node) { n.PodCIDRs = append(n.PodCIDRs, podCIDR6(9)) }),
		wantErrs: []wantErr{{"node-4", "PodCIDRs", routing.ErrDuplicate}}, routed: []netip.Prefix{podCIDR4(4)}},
	{name: "podCIDR overlapping self's",
		node:     withNode(4, func(n *routing.Node) { n.PodCIDRs[0] = netip.MustParsePrefix("10.244.0.0/16") }),
		wantErrs: []wantErr{{"node-4", "PodCIDRs", routing.ErrOverlap}}, routed: []netip.Prefix{podCIDR6(4)}},
	{name: "podCIDR overlapping an earlier node's",
		node:     withNode(4, func(n *routing.Node) { n.PodCIDRs[1] = podCIDR6(3) }),
		wantErrs: []wantErr{{"node-4", "PodCIDRs", routing.ErrOverlap}}, routed: []netip.Prefix{podCIDR4(4)}},
	{name: "no VTEP MAC", mode: routing.ModeVXLAN, node: withNode(4, func(n *routing.Node) { n.VTEPMAC = nil }),
		wantErrs: []wantErr{{"node-4", "VTEPMAC", routing.ErrMissing}}},
	{name: "multicast VTEP MAC", mode: routing.ModeVXLAN,
		node:     withNode(4, func(n *routing.Node) { n.VTEPMAC = mac("01:00:5e:00:00:01") }),
		wantErrs: []wantErr{{"node-4", "VTEPMAC", routing.ErrInvalid}}},
	{name: "VTEP MAC of another node", mode: routing.ModeVXLAN,
		node:     withNode(4, func(n *routing.Node) { n.VTEPMAC = routing.VTEPMAC(nodeName(2)) }),
		wantErrs: []wantErr{{"node-4", "VTEPMAC", routing.ErrDuplicate}}},
	{name: "no name", node: withNode(4, func(n *routing.Node) { n.Name = "" }),
		wantErrs: []wantErr{{"", "Name", routing.ErrMissing}}},
	{name: "listed twice", node: func() routing.Node { n := dualNode(2); n.PodCIDRs = nil; return n },
		wantErrs: []wantErr{{"node-2", "Name", routing.ErrDuplicate}}},
}

// TestComputeBadNodes: each bad node (or bad family of a node) is left
// out with a NodeError naming it and the field; the others keep working.
func TestComputeBadNodes(t *testing.T) {
	for _, tc := range badCases {
		for _, mode := range []routing.Mode{routing.ModeHostGW, routing.ModeVXLAN} {
			if tc.mode != "" && tc.mode != mode {
				continue
			}
			t.Run(tc.name+"/"+string(mode), func(t *testing.T) {
				cfg := routing.Config{Mode: mode, Self: dualNode(1)}
				bad := tc.node()
				d, errs := routing.Compute(cfg, []routing.Node{dualNode(3), bad, dualNode(2)})
				if len(errs) != len(tc.wantErrs) {
					t.Fatalf("errors %v, want %d like %v", errs, len(tc.wantErrs), tc.wantErrs)
				}
				for i, w := range tc.wantErrs {
					e := errs[i]
					if e.Node != w.node || e.Field != w.field || !errors.Is(e, w.is) {
						t.Errorf("error %d: %#v (%v), want node %q field %s wrapping %v", i, e, e, w.node, w.field, w.is)
					}
					if msg := e.Error(); !strings.Contains(msg, `"`+w.node+`"`) || !strings.Contains(msg, w.field) {
						t.Errorf("error %q names neither node %q nor field %s", msg, w.node, w.field)
					}
				}
				var got []netip.Prefix
				for _, r := range d.Routes {
					got = append(got, r.Dst)
				}
				want := append(slices.Clone(dualNode(2).PodCIDRs), dualNode(3).PodCIDRs...)
				want = append(want, tc.routed...)
				slices.SortFunc(got, netip.Prefix.Compare)
				slices.SortFunc(want, netip.Prefix.Compare)
				if !slices.Equal(got, want) {
					t.Fatalf("routed %v, want %v", got, want)
				}
				if mode == routing.ModeVXLAN && len(d.FDB) != 2+min(1, len(tc.routed)) {
					t.Fatalf("fdb %v: want node-2's, node-3's and a routed bad node's", d.FDB)
				}
			})
		}
	}
}

// TestComputeOverlapLaterNameLoses: of two overlapping podCIDRs, the node
// whose name sorts later is left out, even if it comes first in the list.
func TestComputeOverlapLaterNameLoses(t *testing.T) {
	early := v4Node(2)
	early.Name = "a-node" // sorts before node-2 and takes its podCIDR
	early.InternalIPs = []netip.Addr{nodeIP4(9)}
	d, errs := routing.Compute(hostGWConfig(v4Node(1)), []routing.Node{v4Node(2), early})
	if len(errs) != 1 || errs[0].Node != nodeName(2) || !errors.Is(errs[0], routing.ErrOverlap) {
		t.Fatalf("errors %v, want node-2's podCIDR reported as overlapping", errs)
	}
	if len(d.Routes) != 1 || d.Routes[0].Via != nodeIP4(9) {
		t.Fatalf("routes %v", d.Routes)
	}
}

// TestComputeBadConfig: a bad own configuration yields a zero Desired and
// errors naming the node itself, and Apply refuses that zero Desired
// without touching the kernel.
func TestComputeBadConfig(t *testing.T) {
	self := v4Node(1)
	for _, tc := range []struct {
		name, field string
		cfg         routing.Config
	}{
		{"no mode", "Mode", routing.Config{Self: self}},
		{"unknown mode", "Mode", routing.Config{Mode: "bgp", Self: self}},
		{"vxlan without underlay address", "InternalIPs",
			routing.Config{Mode: routing.ModeVXLAN, Self: routing.Node{Name: self.Name, PodCIDRs: self.PodCIDRs}}},
		{"VNI over 24 bits", "VXLAN.VNI", routing.Config{Mode: routing.ModeVXLAN, Self: self, VXLAN: routing.VXLANConfig{VNI: 1 << 24}}},
		{"device name too long", "VXLAN.Device", routing.Config{Mode: routing.ModeVXLAN, Self: self, VXLAN: routing.VXLANConfig{Device: "a-very-long-device-name"}}},
		{"MTU too small", "VXLAN.MTU", routing.Config{Mode: routing.ModeVXLAN, Self: self, VXLAN: routing.VXLANConfig{UnderlayMTU: 1300}}},
		{"bad own podCIDR", "PodCIDRs", routing.Config{Mode: routing.ModeHostGW, Self: routing.Node{Name: self.Name, PodCIDRs: []netip.Prefix{{}}}}},
		{"ipip without an IPv4 address", "InternalIPs",
			routing.Config{Mode: routing.ModeIPIP, Self: routing.Node{Name: self.Name, InternalIPs: []netip.Addr{nodeIP6(1)}, PodCIDRs: self.PodCIDRs}}},
		{"ipip cross-subnet without the subnet", "IPIP.Subnet", routing.Config{Mode: routing.ModeIPIP, Self: self, IPIP: routing.IPIPConfig{CrossSubnet: true}}},
		{"ipip cross-subnet, subnet without the node", "IPIP.Subnet",
			routing.Config{Mode: routing.ModeIPIP, Self: self, IPIP: routing.IPIPConfig{CrossSubnet: true, Subnet: netip.MustParsePrefix("192.168.0.0/24")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, errs := routing.Compute(tc.cfg, []routing.Node{v4Node(2)})
			if d.Mode != "" || len(d.Routes) != 0 || d.Device != nil || d.IPIP != nil {
				t.Fatalf("desired state from a bad config: %s", dumpDesired(d))
			}
			if len(errs) == 0 || errs[0].Node != self.Name || errs[0].Field != tc.field {
				t.Fatalf("errors %v, want one naming %q and %s", errs, self.Name, tc.field)
			}
			if err := routing.NewReconciler().Apply(d); !errors.Is(err, routing.ErrInvalid) {
				t.Fatalf("Apply of the zero Desired: %v, want a refusal", err)
			}
		})
	}
}
