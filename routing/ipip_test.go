package routing_test

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/capture"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/routing"
)

// ipipMissing says why this kernel cannot run the IPIP tests ("" if it
// can). The VM suite (test/vm), whose kernel has the ipip module, makes
// a missing module a failure.
func ipipMissing(t *testing.T) string {
	t.Helper()
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root, not -short")
	}
	if err := routing.CheckIPIP(); err != nil {
		if os.Getenv("WEFT_IPIP_KERNEL") == "required" {
			t.Fatalf("the VM's kernel should have IPIP: %v", err)
		}
		return err.Error()
	}
	return ""
}

// ipipConfig is node i's IPIP configuration, cross-subnet within sub if
// it is valid.
func ipipConfig(i int, sub netip.Prefix) routing.Config {
	cfg := routing.Config{Mode: routing.ModeIPIP, Self: dualNode(i)}
	if sub.IsValid() {
		cfg.IPIP = routing.IPIPConfig{CrossSubnet: true, Subnet: sub}
	}
	return cfg
}

// TestIPIP: pods reach each other over IPIP, and the underlay carries
// their IPv4 packets as protocol 4 between node addresses; with
// cross-subnet, nodes inside the subnet get host-gw routes and the others
// IPIP, and both carry traffic. IPv6 podCIDRs are routed as in host-gw.
func TestIPIP(t *testing.T) {
	if why := ipipMissing(t); why != "" {
		t.Skip(why + " (the VM suite runs this)")
	}
	for _, tc := range []struct {
		name string
		sub  func(i int) netip.Prefix
	}{
		{"always", func(int) netip.Prefix { return netip.Prefix{} }},
		// Subnets of two: node-2 (.12) and node-3 (.13) share
		// 172.18.0.12/31, node-1 (.11) is alone in 172.18.0.10/31.
		{"cross-subnet", func(i int) netip.Prefix { return netip.PrefixFrom(nodeIP4(i), 31).Masked() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLab(t, 3)
			l.serve()
			for _, nd := range l.nodes {
				d, errs := routing.Compute(ipipConfig(nd.i, tc.sub(nd.i)), l.members())
				if len(errs) > 0 {
					t.Fatalf("node-%d: %v", nd.i, errs)
				}
				l.do(nd.ns, func() error { return nd.rec.Apply(d) })
			}
			cp, err := capture.Start(l.underlay, "node2")
			if err != nil {
				t.Fatal(err)
			}
			l.mustReach(1, 2, 3)
			l.mustReach(2, 1, 3)
			frames := cp.Stop()
			// node-2 to node-1 always crosses subnets; node-2 to node-3
			// only without cross-subnet.
			for _, want := range []struct {
				peer  int
				ipip  bool
				label string
			}{{1, true, "node-2 to node-1"}, {3, tc.name == "always", "node-2 to node-3"}} {
				var tunnel, plain int
				for _, f := range frames {
					p, ok := capture.IPv4(f)
					if !ok {
						continue
					}
					between := (p.Src == nodeIP4(2) && p.Dst == nodeIP4(want.peer)) || (p.Dst == nodeIP4(2) && p.Src == nodeIP4(want.peer))
					if between && p.Proto == unix.IPPROTO_IPIP {
						tunnel++
					}
					pods := (p.Src == podAddr(2, false) && p.Dst == podAddr(want.peer, false)) || (p.Dst == podAddr(2, false) && p.Src == podAddr(want.peer, false))
					if pods {
						plain++
					}
				}
				if want.ipip && (tunnel == 0 || plain > 0) || !want.ipip && (tunnel > 0 || plain == 0) {
					t.Errorf("%s: %d IPIP packets, %d plain pod packets on the underlay; want IPIP %v", want.label, tunnel, plain, want.ipip)
				}
			}
			// The device carries the podCIDR's network address, and goes
			// when the mode switches to host-gw.
			l.do(l.node(1).ns, func() error {
				dev, err := netlink.LinkByName(routing.DefaultIPIPDevice)
				if err != nil {
					return err
				}
				addrs, err := netlink.AddrList(dev, unix.AF_INET)
				if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != netip.PrefixFrom(podCIDR4(1).Addr(), 32).String() {
					t.Errorf("ipip device addresses %v (%v), want %s/32", addrs, err, podCIDR4(1).Addr())
				}
				return nil
			})
			l.applyAll(variants[0])
			l.do(l.node(1).ns, func() error {
				if _, err := netlink.LinkByName(routing.DefaultIPIPDevice); err == nil {
					t.Error("the ipip device is left after switching to host-gw")
				}
				return nil
			})
			l.mustReach(1, 2, 3)
		})
	}
}

// TestIPIPRefusedWithoutTheModule: on a kernel without IPIP, Apply names
// the missing module and the way out, and leaves no device or route of
// the tunnel behind.
func TestIPIPRefusedWithoutTheModule(t *testing.T) {
	if ipipMissing(t) == "" {
		t.Skip("this kernel has IPIP")
	}
	l := newLab(t, 2)
	d, errs := routing.Compute(ipipConfig(1, netip.Prefix{}), l.members())
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var err error
	l.do(l.node(1).ns, func() error { err = l.node(1).rec.Apply(d); return nil })
	if err == nil || !strings.Contains(err.Error(), "ipip module") || !strings.Contains(err.Error(), "--routing vxlan") {
		t.Fatalf("Apply: %v, want an error naming the ipip module and another mode", err)
	}
	if s := l.state(1); s.routeTo(podCIDR4(2)) != nil {
		t.Fatalf("a route to node-2's podCIDR despite the failed device: %v", s.routes)
	}
}
