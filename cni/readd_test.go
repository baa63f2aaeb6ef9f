package cni_test

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/cni"
	"github.com/weftnet/weft/internal/cnitest"
)

// TestAddAfterDelSameNetns: once DEL has returned, the pod namespace holds
// no weft interface, and ADD for another container into that namespace and
// CNI_IFNAME succeeds and carries traffic, as with the reference bridge
// plugin. A pair left disarmed in the namespace (a DEL killed half-way, or
// an older weft) does not block that ADD either.
func TestAddAfterDelSameNetns(t *testing.T) {
	for _, version := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		t.Run(version, func(t *testing.T) {
			e := newEnv(t)
			list := e.list(version, "readd", e.weft(subnet(podCIDR)))
			a := e.pod()
			e.add(list, a)
			e.del(list, a)
			if l := podLinks(t, a.NetNS); len(l) != 0 {
				t.Fatalf("pod namespace after DEL holds %v, want no interface", l)
			}

			b := cnitest.Attachment{ContainerID: a.ContainerID + "-b", NetNS: a.NetNS, IfName: a.IfName}
			ipB := e.add(list, b)
			serve(t, b.NetNS, "b", ":8080")
			mustExchange(t, "", net.JoinHostPort(ipB.String(), "8080"), "b saw "+podGW)

			// A disarmed pair left in the namespace: host side down, as
			// DEL leaves it before the pair is gone.
			disarm(t, cni.HostVethName(b.ContainerID, b.IfName))
			c := cnitest.Attachment{ContainerID: a.ContainerID + "-c", NetNS: a.NetNS, IfName: a.IfName}
			ipC := e.add(list, c)
			if l := podLinks(t, a.NetNS); len(l) != 1 {
				t.Fatalf("pod namespace after ADD over a disarmed pair holds %v, want one interface", l)
			}
			mustExchange(t, "", net.JoinHostPort(ipC.String(), "8080"), "b saw "+podGW)
			if v := e.hostVeths(); len(v) != 1 || v[0] != cni.HostVethName(c.ContainerID, c.IfName) {
				t.Fatalf("bridge ports %v, want only %s's", v, c.ContainerID)
			}
			e.del(list, b)
			e.del(list, c)
			if l := podLinks(t, a.NetNS); len(l) != 0 {
				t.Fatalf("pod namespace after the last DEL holds %v", l)
			}
			if k := e.allocations("readd"); len(k) != 0 {
				t.Fatalf("allocations left: %v", k)
			}
		})
	}
}

// disarm sets a host-side veth down.
func disarm(t *testing.T, name string) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetDown(l); err != nil {
		t.Fatal(err)
	}
}
