package iptables_test

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	polipt "github.com/weftnet/weft/policy/iptables"
	nt "github.com/weftnet/weft/policy/netpoltest"
)

// bed is the netpol test bed on this (isolated) namespace as the node:
// namespaces x and y on bridge weft0 (bridged traffic), z on weft1 (routed).
type bed struct {
	world    *nt.World
	targets  map[string]nt.Target // IPv4
	targets6 map[string]nt.Target // IPv6
	sources  []polipt.Source      // every pod's bridge port and addresses
	// checkSources makes apply hold pod traffic to its sources.
	checkSources bool
	// pending makes apply hold pods whose addresses are not ready.
	pending bool
}

const nodeName = "node1"

func newBed(t *testing.T) *bed {
	t.Helper()
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, br := range []string{"weft0", "weft1"} {
		l := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: br}}
		if err := netlink.LinkAdd(l); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netlink.LinkDel(l) })
		for _, a := range []string{fmt.Sprintf("10.244.%d.1/24", i), fmt.Sprintf("fd00:10:244:%d::1/64", i)} {
			addr, _ := netlink.ParseAddr(a)
			addr.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(l, addr); err != nil {
				t.Fatal(err)
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	b := &bed{world: nt.NewWorld(), targets: map[string]nt.Target{}, targets6: map[string]nt.Target{}}
	t.Cleanup(func() {
		_ = (&polipt.Applier{}).Cleanup()
		_ = (&polipt.Applier{Family: 6}).Cleanup()
	})
	for i, p := range b.world.Pods {
		subnet := 0
		if p.Namespace == "z" {
			subnet = 1
		}
		ip := netip.AddrFrom4([4]byte{10, 244, byte(subnet), byte(10 + i)})
		ip6 := netip.MustParseAddr(fmt.Sprintf("fd00:10:244:%d::%x", subnet, 10+i))
		nt.SetIP(p, ip)
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip6.String()})
		p.Spec.NodeName = nodeName
		name := "pod-" + p.Namespace + "-" + p.Name
		path := b.addPod(t, name, fmt.Sprintf("weft%d", subnet), ip, ip6, subnet)
		b.targets[p.Namespace+"/"+p.Name] = nt.Target{NSPath: path, IP: ip.String()}
		b.targets6[p.Namespace+"/"+p.Name] = nt.Target{NSPath: path, IP: ip6.String()}
	}
	return b
}

// addPod makes a pod namespace wired to bridge br and serving TCP and UDP on
// the bed's ports.
func (b *bed) addPod(t *testing.T, name, br string, ip, ip6 netip.Addr, subnet int) string {
	t.Helper()
	path, err := netnsutil.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(name) })
	host := "v" + name[4:]
	b.sources = append(b.sources, polipt.Source{Port: host, Addrs: []netip.Addr{ip, ip6}})
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: "eth0"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	// Deleting the host end removes the pair now; the namespace's own
	// teardown would do it only asynchronously.
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(host); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	bridge, _ := netlink.LinkByName(br)
	peer, _ := netlink.LinkByName("eth0")
	h, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := netlink.LinkSetNsFd(peer, int(h)); err != nil {
		t.Fatal(err)
	}
	hl, _ := netlink.LinkByName(host)
	if err := netlink.LinkSetMaster(hl, bridge); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		t.Fatal(err)
	}
	err = netnsutil.Do(path, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		gw := netip.AddrFrom4([4]byte{10, 244, byte(subnet), 1})
		gw6 := netip.MustParseAddr(fmt.Sprintf("fd00:10:244:%d::1", subnet))
		for _, g := range []netip.Addr{gw, gw6} {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: g.AsSlice()}); err != nil {
				return err
			}
		}
		for _, port := range nt.Ports {
			ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() { _, _ = bufio.NewReader(c).ReadString('\n'); c.Close() }()
				}
			}()
			u, err := net.ListenPacket("udp", fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			t.Cleanup(func() { u.Close() })
			go func() {
				buf := make([]byte, 1500)
				for {
					n, from, err := u.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = u.WriteTo(buf[:n], from)
				}
			}()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	return path
}
