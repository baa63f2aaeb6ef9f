package cni_test

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/cnitest"
	"github.com/weftnet/weft/internal/netnsutil"
)

// TestAddCheckDel drives the plugin through libcni for each spec version:
// two pods get addresses, talk TCP to each other and to the node, CHECK
// passes (and fails once a route is gone), DEL twice is fine, nothing is left.
func TestAddCheckDel(t *testing.T) {
	for _, version := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(version, func(t *testing.T) {
			e := newEnv(t)
			list := e.list(version, "podnet", e.weft(subnet(podCIDR)))
			a, b := e.pod(), e.pod()
			ctx := context.Background()

			res, err := e.rt.Add(ctx, list, a)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if len(res.Interfaces) != 3 || res.Interfaces[2].Sandbox != a.NetNS || res.Interfaces[2].Name != "eth0" {
				t.Fatalf("interfaces: %+v", res.Interfaces)
			}
			if res.Interfaces[1].Name != cni.HostVethName(a.ContainerID, a.IfName) {
				t.Fatalf("host veth %q, want %q", res.Interfaces[1].Name, cni.HostVethName(a.ContainerID, a.IfName))
			}
			if len(res.IPs) != 1 || !res.IPs[0].Gateway.Equal(net.ParseIP(podGW)) {
				t.Fatalf("ips: %+v", res.IPs)
			}
			_, pods, _ := net.ParseCIDR(podCIDR)
			ipA := res.IPs[0].Address.IP
			if !pods.Contains(ipA) || ipA.Equal(net.ParseIP(podGW)) || ipA.Equal(pods.IP) {
				t.Fatalf("pod address %s is not a usable address of %s", ipA, podCIDR)
			}
			if len(res.Routes) != 1 || res.Routes[0].Dst.String() != "0.0.0.0/0" {
				t.Fatalf("routes: %+v", res.Routes)
			}
			ipB := e.add(list, b)
			if ipA.Equal(ipB) {
				t.Fatalf("both pods got %s", ipA)
			}
			assertPodWiring(t, e, a)

			serve(t, b.NetNS, "b", ":8080")
			dstB := net.JoinHostPort(ipB.String(), "8080")
			mustExchange(t, a.NetNS, dstB, "b saw "+ipA.String())
			mustExchange(t, "", dstB, "b saw "+podGW)
			serve(t, a.NetNS, "a2", ":8080") // answers the re-ADDed attachment below

			if err := e.rt.Check(ctx, list, a); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			breakDefaultRoute(t, a.NetNS)
			if err := e.rt.Check(ctx, list, a); err == nil || !strings.Contains(err.Error(), "route") {
				t.Fatalf("CHECK after removing the pod's default route: got %v, want a missing-route error", err)
			}

			e.del(list, a)
			e.del(list, a)
			e.del(list, b)
			if v := e.armedVeths(); len(v) != 0 {
				t.Fatalf("attachments still up after DEL: %v", v)
			}
			if !unreachable("", dstB) || !unreachable(a.NetNS, net.JoinHostPort(podGW, "22")) {
				t.Fatal("a deleted attachment still carries traffic")
			}
			if k := e.allocations("podnet"); len(k) != 0 {
				t.Fatalf("allocations left: %v", k)
			}

			// ADD again into the same namespace, as after a failed sandbox start.
			ipA2 := e.add(list, a)
			mustExchange(t, a.NetNS, net.JoinHostPort(ipA2.String(), "8080"), "a2 saw "+ipA2.String())
			e.del(list, a)
			deletePod(t, a)
			deletePod(t, b)
			e.waitNoVeths()
		})
	}
}

// assertPodWiring checks in the kernel what ADD promises beyond the result.
func assertPodWiring(t *testing.T, e *env, a cnitest.Attachment) {
	t.Helper()
	name := cni.HostVethName(a.ContainerID, a.IfName)
	host, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("host veth: %v", err)
	}
	br, err := netlink.LinkByName(e.bridge)
	if err != nil {
		t.Fatalf("bridge: %v", err)
	}
	if host.Attrs().MasterIndex != br.Attrs().Index || host.Attrs().MTU != testMTU {
		t.Fatalf("host veth %s: master %d (bridge is %d), mtu %d", name, host.Attrs().MasterIndex, br.Attrs().Index, host.Attrs().MTU)
	}
	if got := readTrim(t, "/sys/class/net/"+name+"/brport/hairpin_mode"); got != "1" {
		t.Fatalf("hairpin_mode on %s = %s, want 1", name, got)
	}
	if got := readTrim(t, "/proc/sys/net/ipv4/ip_forward"); got != "1" {
		t.Fatalf("ip_forward = %s, want 1", got)
	}
	addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != podGW+"/24" {
		t.Fatalf("bridge addresses %v (%v), want %s/24", addrs, err, podGW)
	}
	err = netnsutil.Do(a.NetNS, func() error {
		l, err := netlink.LinkByName(a.IfName)
		if err != nil {
			return err
		}
		if l.Attrs().MTU != testMTU || l.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("pod %s: mtu %d flags %v", a.IfName, l.Attrs().MTU, l.Attrs().Flags)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func breakDefaultRoute(t *testing.T, path string) {
	t.Helper()
	err := netnsutil.Do(path, func() error {
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Gw != nil {
				return netlink.RouteDel(&r)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDelAfterNetnsDeleted: the runtime may remove the namespace first.
func TestDelAfterNetnsDeleted(t *testing.T) {
	e := newEnv(t)
	list := e.list("1.1.0", "podnet", e.weft(subnet(podCIDR)))
	a := e.pod()
	e.add(list, a)
	deletePod(t, a)
	if _, err := os.Stat(a.NetNS); !os.IsNotExist(err) {
		t.Fatalf("netns %s still there: %v", a.NetNS, err)
	}
	e.del(list, a)
	e.del(list, a)
	if k := e.allocations("podnet"); len(k) != 0 {
		t.Fatalf("allocations left after DEL of a deleted netns: %v", k)
	}
	e.waitNoVeths()
}

// TestBridgeRepair: ADD checks the node bridge on every call, not only the
// first: a bridge set down, or missing a gateway of the pod's families, is
// repaired by the next ADD (its pod reaches the node through it), and a
// link of the bridge's name that is not a bridge is refused by name.
func TestBridgeRepair(t *testing.T) {
	e := newEnv(t)
	list := e.list("1.1.0", "podnet", e.weft(subnet(podCIDR), subnet(podCIDR6)))
	e.add(list, e.pod())
	br, err := netlink.LinkByName(e.bridge)
	if err != nil {
		t.Fatal(err)
	}
	for _, gw := range []string{podGW + "/24", podGW6 + "/64"} {
		addr, err := netlink.ParseAddr(gw)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.AddrDel(br, addr); err != nil {
			t.Fatalf("removing %s from the bridge: %v", gw, err)
		}
	}
	if err := netlink.LinkSetDown(br); err != nil {
		t.Fatal(err)
	}
	b := e.pod()
	ipB := e.add(list, b)
	if br, err = netlink.LinkByName(e.bridge); err != nil || br.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("bridge after ADD: %+v, %v; want it up", br, err)
	}
	serve(t, "", "node", ":8081")
	mustExchange(t, b.NetNS, net.JoinHostPort(podGW, "8081"), "node saw "+ipB.String())
	e.del(list, b)

	if err := netlink.LinkDel(br); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: e.bridge}, PeerName: e.bridge + "p"}); err != nil {
		t.Fatal(err)
	}
	_, err = e.rt.Add(context.Background(), list, e.pod())
	if err == nil || !strings.Contains(err.Error(), e.bridge+" exists but is a veth, not a bridge") {
		t.Fatalf("ADD with a veth called %s: %v, want a not-a-bridge error", e.bridge, err)
	}
}
