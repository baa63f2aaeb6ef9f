package routing_test

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/weftnet/weft/routing"
)

// The test address plan, stated once (GUIDE §2): node i (1..9) is
// "node-<i>" at 172.18.0.1<i>/24 and fd00:172:18::1<i>/64 on the underlay;
// its pods are 10.244.<i>.0/24 and fd00:10:244:<i>::/64, the gateway (the
// node's bridge) is .1 / ::1 and the one test pod is .2 / ::2.
const (
	underlayBits4 = 24
	underlayBits6 = 64
	podPort       = 8080
	underlayMTU   = 1400 // not 1500, so a derived MTU is visibly derived
)

func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

func nodeIP4(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("172.18.0.%d", 10+i)) }

func nodeIP6(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd00:172:18::%d", 10+i)) }

func podCIDR4(i int) netip.Prefix { return netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i)) }

func podCIDR6(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", i))
}

// host returns the n-th address of p (1 is the gateway, 2 the test pod).
func host(p netip.Prefix, n int) netip.Addr {
	a := p.Addr()
	for range n {
		a = a.Next()
	}
	return a
}

// v4Node is node i, IPv4 only, with its VTEP MAC published.
func v4Node(i int) routing.Node {
	return routing.Node{
		Name:        nodeName(i),
		InternalIPs: []netip.Addr{nodeIP4(i)},
		PodCIDRs:    []netip.Prefix{podCIDR4(i)},
		VTEPMAC:     routing.VTEPMAC(nodeName(i)),
	}
}

// dualNode is node i, dual-stack.
func dualNode(i int) routing.Node {
	n := v4Node(i)
	n.InternalIPs = append(n.InternalIPs, nodeIP6(i))
	n.PodCIDRs = append(n.PodCIDRs, podCIDR6(i))
	return n
}

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// hostGWRoutes are node i's host-gw routes for the families of n.
func hostGWRoutes(n routing.Node) []routing.Route {
	var rs []routing.Route
	for _, p := range n.PodCIDRs {
		for _, a := range n.InternalIPs {
			if a.Is4() == p.Addr().Is4() {
				rs = append(rs, routing.Route{Dst: p, Via: a})
			}
		}
	}
	return rs
}

// vxlanRoutes are the VXLAN routes and neighbours that reach n.
func vxlanRoutes(n routing.Node) ([]routing.Route, []routing.Neighbor) {
	var rs []routing.Route
	var ns []routing.Neighbor
	for _, p := range n.PodCIDRs {
		rs = append(rs, routing.Route{Dst: p, Via: p.Addr(), Dev: routing.DefaultDevice, OnLink: true})
		ns = append(ns, routing.Neighbor{IP: p.Addr(), MAC: n.VTEPMAC})
	}
	return rs, ns
}
