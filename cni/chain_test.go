package cni_test

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/netnsutil"
)

// external attaches an "outside" host to the node: a namespace joined to the
// node by a veth on the node network. It returns the namespace's path.
func external(t *testing.T, e *env) string {
	t.Helper()
	name := "ext-" + sanitize(t.Name())
	path, err := netnsutil.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(name) })
	uplink := fmt.Sprintf("up%s", e.bridge)
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: uplink, Flags: net.FlagUp}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	addr, _ := netlink.ParseAddr(fmt.Sprintf("%s/%d", nodeIP, nodeBits))
	if err := netlink.AddrAdd(veth, addr); err != nil {
		t.Fatal(err)
	}
	err = netnsutil.Do(path, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr(fmt.Sprintf("%s/%d", extIP, nodeBits))
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// TestChainPortmapBandwidth chains the reference portmap and bandwidth
// plugins after weft: an outside client reaches the pod through the host
// port, the pod's traffic is shaped, and CHECK and DEL run the whole chain.
func TestChainPortmapBandwidth(t *testing.T) {
	e := newEnv(t)
	ext := external(t, e)
	list := e.list("1.1.0", "chained",
		e.weft(subnet(podCIDR)),
		map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		map[string]any{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
	)
	a := e.pod()
	a.Caps = map[string]any{
		"portMappings": []map[string]any{{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}},
		"bandwidth":    map[string]any{"ingressRate": 100_000_000, "ingressBurst": 1_000_000, "egressRate": 100_000_000, "egressBurst": 1_000_000},
	}
	ctx := context.Background()
	res, err := e.rt.Add(ctx, list, a)
	if err != nil {
		t.Fatalf("ADD through the chain: %v", err)
	}
	serve(t, a.NetNS, "a", ":80")
	mustExchange(t, ext, net.JoinHostPort(nodeIP, "8080"), "a saw "+extIP)

	host, err := netlink.LinkByName(cni.HostVethName(a.ContainerID, a.IfName))
	if err != nil {
		t.Fatal(err)
	}
	if !hasTBF(t, host) {
		t.Fatalf("bandwidth: no tbf qdisc on %s; result interfaces %+v", host.Attrs().Name, res.Interfaces)
	}
	if err := e.rt.Check(ctx, list, a); err != nil {
		t.Fatalf("CHECK through the chain: %v", err)
	}
	e.del(list, a)
	e.del(list, a)
	if v := e.armedVeths(); len(v) != 0 {
		t.Fatalf("attachments still up after DEL: %v", v)
	}
	if !unreachable(ext, net.JoinHostPort(nodeIP, "8080")) {
		t.Fatal("host port still forwards after DEL")
	}
	deletePod(t, a)
	e.waitNoVeths()
}

func hasTBF(t *testing.T, l netlink.Link) bool {
	t.Helper()
	qdiscs, err := netlink.QdiscList(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qdiscs {
		if q.Type() == "tbf" {
			return true
		}
	}
	return false
}

// TestDualStack gives a pod one IPv4 and one IPv6 address and carries TCP
// over both families.
func TestDualStack(t *testing.T) {
	e := newEnv(t)
	list := e.list("1.1.0", "dual", e.weft(subnet(podCIDR), subnet(podCIDR6)))
	a, b := e.pod(), e.pod()
	ctx := context.Background()
	res, err := e.rt.Add(ctx, list, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 2 || res.IPs[0].Address.IP.To4() == nil || res.IPs[1].Address.IP.To4() != nil {
		t.Fatalf("want one IPv4 and one IPv6 address, got %+v", res.IPs)
	}
	if !res.IPs[1].Gateway.Equal(net.ParseIP(podGW6)) || len(res.Routes) != 2 {
		t.Fatalf("ipv6 gateway/routes: %+v %+v", res.IPs[1], res.Routes)
	}
	resB, err := e.rt.Add(ctx, list, b)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, b.NetNS, "b", ":8080")
	ip6A, ip6B := res.IPs[1].Address.IP.String(), resB.IPs[1].Address.IP.String()
	mustExchange(t, a.NetNS, net.JoinHostPort(ip6B, "8080"), "b saw "+ip6A)
	mustExchange(t, "", net.JoinHostPort(ip6B, "8080"), "b saw "+podGW6)
	mustExchange(t, a.NetNS, net.JoinHostPort(resB.IPs[0].Address.IP.String(), "8080"), "b saw "+res.IPs[0].Address.IP.String())
	if err := e.rt.Check(ctx, list, a); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	e.del(list, a)
	e.del(list, b)
	if k := e.allocations("dual"); len(k) != 0 {
		t.Fatalf("allocations left: %v", k)
	}
}
