package netpoltest

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/policy"
	"github.com/weftnet/weft/policy/oracle"
)

// Bed is the kernel test bed of a policy backend: the test's (isolated)
// network namespace is the node, namespaces x and y hang off bridge weft0
// (bridged traffic between them), z off weft1 (routed), every pod is
// dual-stack and serves TCP and UDP on Ports (and SCTP, when the kernel
// has it: see enableSCTP). A backend's tests drive it through their own
// apply function (the backend hook) and hold the real probes against the
// oracle.
type Bed struct {
	World    *World
	Targets  map[string]Target // IPv4, by "ns/name"
	Targets6 map[string]Target // IPv6
	// Ports are the pods' bridge ports (the host ends of their veths,
	// named "v<ns>-<name>") and their addresses.
	Ports []BedPort
}

// BedPort is one pod's bridge port and addresses.
type BedPort struct {
	Name  string
	Addrs []netip.Addr
}

// BedNode is the node name of every pod of a Bed.
const BedNode = "node1"

// BedBridges are a Bed's pod bridges; BedPortPattern matches its pods'
// bridge ports (an nft wildcard; iptables writes "v+").
var (
	BedBridges     = []string{"weft0", "weft1"}
	BedPortPattern = "v*"
)

// NewBed builds the bed in the current network namespace, which must be a
// private one (netnsutil.Isolated); everything is removed when t ends.
func NewBed(t testing.TB) *Bed {
	t.Helper()
	if !netnsutil.Isolated() {
		t.Skip("kernel test: needs root to run in a private network namespace")
	}
	enableSCTP(t)
	for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, br := range BedBridges {
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
	b := &Bed{World: NewWorld(), Targets: map[string]Target{}, Targets6: map[string]Target{}}
	for i, p := range b.World.Pods {
		subnet := 0
		if p.Namespace == "z" {
			subnet = 1
		}
		ip := netip.AddrFrom4([4]byte{10, 244, byte(subnet), byte(10 + i)})
		ip6 := netip.MustParseAddr(fmt.Sprintf("fd00:10:244:%d::%x", subnet, 10+i))
		SetIP(p, ip)
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip6.String()})
		p.Spec.NodeName = BedNode
		name := "pod-" + p.Namespace + "-" + p.Name
		path := b.addPod(t, name, BedBridges[subnet], ip, ip6, subnet)
		b.Targets[p.Namespace+"/"+p.Name] = Target{NSPath: path, IP: ip.String()}
		b.Targets6[p.Namespace+"/"+p.Name] = Target{NSPath: path, IP: ip6.String()}
	}
	return b
}

// Compile compiles the policies over w (the bed's world, or a relabelled
// copy).
func Compile(w *World, pols []*networkingv1.NetworkPolicy) policy.Desired {
	return policy.Compile(policy.Input{Pods: w.Pods, Namespaces: w.Namespaces, Policies: pols})
}

// Check probes the whole grid over targets (the bed's Targets or
// Targets6) until it matches the oracle for w and pols, for up to 5 s.
func (b *Bed) Check(t testing.TB, targets map[string]Target, w *World, pols []*networkingv1.NetworkPolicy, what string) {
	t.Helper()
	want := oracle.Expect(oracle.World{Namespaces: w.Namespaces, Policies: pols}, w.Pods, Ports, Protocols)
	b.CheckMatrix(t, targets, want, what)
}

// CheckMatrix probes the grid over targets until it matches want, for up
// to 5 s.
func (b *Bed) CheckMatrix(t testing.TB, targets map[string]Target, want oracle.Matrix, what string) {
	t.Helper()
	got, err := WaitMatch(time.Now().Add(5*time.Second), targets, want)
	if err != nil {
		t.Fatalf("%s: %v\n%s", what, err, oracle.SideBySide(want, got))
	}
}

// Addrs are a bed pod's addresses, both families.
func (b *Bed) Addrs(pod string) []netip.Addr {
	return []netip.Addr{netip.MustParseAddr(b.Targets[pod].IP), netip.MustParseAddr(b.Targets6[pod].IP)}
}

// Relabelled returns w where namespace ns carries team=blue.
func Relabelled(w *World, ns string) *World {
	out := &World{Pods: w.Pods}
	for _, n := range w.Namespaces {
		n = n.DeepCopy()
		if n.Name == ns {
			n.Labels["team"] = "blue"
		}
		out.Namespaces = append(out.Namespaces, n)
	}
	return out
}

// UsesIPBlock reports whether some policy has an ipBlock peer: the bed's
// ipBlocks are IPv4, and the oracle judges a pod by its primary (IPv4)
// address, so such cases say nothing about IPv6 flows.
func UsesIPBlock(pols []*networkingv1.NetworkPolicy) bool {
	for _, p := range pols {
		for _, r := range p.Spec.Ingress {
			for _, peer := range r.From {
				if peer.IPBlock != nil {
					return true
				}
			}
		}
		for _, r := range p.Spec.Egress {
			for _, peer := range r.To {
				if peer.IPBlock != nil {
					return true
				}
			}
		}
	}
	return false
}

// addPod makes a pod namespace wired to bridge br and serving TCP and UDP
// on the bed's ports.
func (b *Bed) addPod(t testing.TB, name, br string, ip, ip6 netip.Addr, subnet int) string {
	t.Helper()
	path, err := netnsutil.NewNamed(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(name) })
	host := "v" + name[4:]
	b.Ports = append(b.Ports, BedPort{Name: host, Addrs: []netip.Addr{ip, ip6}})
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
	err = netnsutil.Do(path, func() error { return servePod(t, ip, ip6, subnet) })
	if err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	return path
}

// servePod, inside a pod's namespace, addresses eth0, routes through the
// bridge's gateway and serves TCP and UDP echo on the bed's ports, and
// accepts SCTP there when SCTP is one of Protocols.
func servePod(t testing.TB, ip, ip6 netip.Addr, subnet int) error {
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
	sctp := slices.Contains(Protocols, corev1.ProtocolSCTP)
	for _, port := range Ports {
		if sctp {
			if err := serveSCTP(t, port); err != nil {
				return err
			}
		}
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
}
