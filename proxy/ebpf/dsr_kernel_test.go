package ebpf

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/internal/capture"
	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/model"
)

// The DSR topology of the real-traffic test: a LAN (a bridge in a
// namespace of its own) joins an outside client and two nodes; node2
// holds a pod (podR, in remoteCIDR) behind a veth, and node1 routes
// remoteCIDR to node2 (host-gw), or through a VXLAN device between them.
// node1 runs the per-packet programs with a NodePort whose one backend is
// node2's pod, in dsr mode; node2 runs its own programs (no frontend: the
// receive side needs none).
var (
	lanClient = netip.MustParseAddr("192.168.77.100")
	lanNode1  = netip.MustParseAddr("192.168.77.1")
	lanNode2  = netip.MustParseAddr("192.168.77.2")
	podGW     = netip.MustParseAddr("10.250.9.1")
)

const (
	dsrNodePort = 30777
	podPort     = 8080
	lanMTU      = 1500
)

// dsrLab is one topology's namespaces.
type dsrLab struct {
	client, node1, node2, pod, lan string
}

// inNS runs fn in the namespace at ns, failing the test on its error.
func inNS(t *testing.T, ns string, fn func() error) {
	t.Helper()
	if err := netnsutil.Do(ns, fn); err != nil {
		t.Fatalf("in %s: %v", filepath.Base(ns), err)
	}
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// addrUp gives device dev addr and sets it up (in the thread's namespace).
func addrUp(dev string, addr netip.Prefix) error {
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return err
	}
	if addr.IsValid() {
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet(addr)}); err != nil {
			return fmt.Errorf("address %s on %s: %w", addr, dev, err)
		}
	}
	return netlink.LinkSetUp(l)
}

func sysctl(path, v string) error {
	return os.WriteFile(filepath.Join("/proc/sys", path), []byte(v+"\n"), 0o644)
}

// newDSRLab builds the topology (vxlan: node1 reaches node2's pods
// through a VXLAN device on each node instead of a host-gw route).
func newDSRLab(t *testing.T, vxlan bool) dsrLab {
	t.Helper()
	prefix := fmt.Sprintf("dsr%d-", os.Getpid())
	var l dsrLab
	for _, p := range []*string{&l.client, &l.node1, &l.node2, &l.pod, &l.lan} {
		name := prefix + map[*string]string{&l.client: "client", &l.node1: "node1", &l.node2: "node2", &l.pod: "pod", &l.lan: "lan"}[p]
		path, err := netnsutil.NewNamed(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netnsutil.Delete(name) })
		*p = path
	}
	lan24 := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, 24) }
	inNS(t, l.lan, func() error {
		la := netlink.NewLinkAttrs()
		la.Name = "br0"
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil {
			return err
		}
		if err := addrUp("br0", netip.Prefix{}); err != nil {
			return err
		}
		for _, n := range []struct{ name, ns string }{{"vclient", l.client}, {"vnode1", l.node1}, {"vnode2", l.node2}} {
			if err := netnsutil.BridgedVeth(n.name, "br0", n.ns, "eth0", lanMTU); err != nil {
				return err
			}
		}
		return nil
	})
	inNS(t, l.client, func() error { return addrUp("eth0", lan24(lanClient)) })
	inNS(t, l.node1, func() error {
		if err := addrUp("eth0", lan24(lanNode1)); err != nil {
			return err
		}
		return sysctl("net/ipv4/ip_forward", "1")
	})
	inNS(t, l.node2, func() error {
		if err := addrUp("eth0", lan24(lanNode2)); err != nil {
			return err
		}
		la := netlink.NewLinkAttrs()
		la.Name = "vpod"
		fd, err := os.Open(l.pod)
		if err != nil {
			return err
		}
		defer fd.Close()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(fd.Fd()))}); err != nil {
			return err
		}
		if err := addrUp("vpod", netip.PrefixFrom(podGW, 24)); err != nil {
			return err
		}
		return sysctl("net/ipv4/ip_forward", "1")
	})
	inNS(t, l.pod, func() error {
		if err := addrUp("eth0", netip.PrefixFrom(podR, 24)); err != nil {
			return err
		}
		eth0, _ := netlink.LinkByName("eth0")
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: podGW.AsSlice()})
	})
	if !vxlan {
		inNS(t, l.node1, func() error {
			eth0, _ := netlink.LinkByName("eth0")
			return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipnet(remoteCIDR), Gw: lanNode2.AsSlice()})
		})
		return l
	}
	// VXLAN as weft's routing/vxlan lays it out: a device per node, the
	// peer's pod CIDR via its tunnel address (the CIDR's first address)
	// onlink, a neighbour entry and an FDB entry to the peer's node.
	node1MAC, _ := net.ParseMAC("0e:77:00:00:00:01")
	node2MAC, _ := net.ParseMAC("0e:77:00:00:00:02")
	node1CIDR := netip.MustParsePrefix("10.250.8.0/24")
	mk := func(local netip.Addr, mac net.HardwareAddr, own netip.Prefix) error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		la := netlink.NewLinkAttrs()
		la.Name, la.HardwareAddr, la.MTU = "weft.vxlan", mac, lanMTU-50
		v := &netlink.Vxlan{LinkAttrs: la, VxlanId: 1, VtepDevIndex: eth0.Attrs().Index, SrcAddr: local.AsSlice(), Port: 8472, Learning: false}
		if err := netlink.LinkAdd(v); err != nil {
			return fmt.Errorf("vxlan: %w", err)
		}
		return addrUp("weft.vxlan", netip.PrefixFrom(own.Addr(), 32))
	}
	peer := func(peerCIDR netip.Prefix, peerMAC net.HardwareAddr, peerNode netip.Addr) error {
		v, err := netlink.LinkByName("weft.vxlan")
		if err != nil {
			return err
		}
		idx := v.Attrs().Index
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: idx, State: netlink.NUD_PERMANENT, IP: peerCIDR.Addr().AsSlice(), HardwareAddr: peerMAC}); err != nil {
			return fmt.Errorf("neighbour: %w", err)
		}
		if err := netlink.NeighAppend(&netlink.Neigh{LinkIndex: idx, Family: 7 /* AF_BRIDGE */, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT,
			IP: peerNode.AsSlice(), HardwareAddr: peerMAC}); err != nil {
			return fmt.Errorf("fdb: %w", err)
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: ipnet(peerCIDR), Gw: peerCIDR.Addr().AsSlice(), Flags: int(netlink.FLAG_ONLINK)})
	}
	inNS(t, l.node1, func() error {
		if err := mk(lanNode1, node1MAC, node1CIDR); err != nil {
			return err
		}
		return peer(netip.PrefixFrom(remoteCIDR.Addr(), 24), node2MAC, lanNode2)
	})
	inNS(t, l.node2, func() error {
		if err := mk(lanNode2, node2MAC, remoteCIDR); err != nil {
			return err
		}
		return peer(node1CIDR, node1MAC, lanNode1)
	})
	return l
}

// attachTCX attaches prog to one side of dev in the namespace at ns until
// the test ends.
func attachTCX(t *testing.T, ns, dev string, egress bool, prog *ebpf.Program) {
	t.Helper()
	inNS(t, ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		at := ebpf.AttachTCXIngress
		if egress {
			at = ebpf.AttachTCXEgress
		}
		lk, err := link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: prog, Attach: at})
		if err != nil {
			return err
		}
		t.Cleanup(func() { _ = lk.Close() })
		return nil
	})
}

// servePod answers, in the pod, every TCP connection and UDP datagram on
// podPort with the address it came from.
func servePod(t *testing.T, pod string) {
	t.Helper()
	var ln net.Listener
	var pc net.PacketConn
	inNS(t, pod, func() (err error) {
		if ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", podPort)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", podPort))
		return err
	})
	t.Cleanup(func() { _ = ln.Close(); _ = pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, c.RemoteAddr().String())
			_ = c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(from.String()), from)
		}
	}()
}

// ask sends one request from the client to the NodePort over network and
// returns the answer (the address the pod saw).
func ask(t *testing.T, clientNS, network string) string {
	t.Helper()
	dial := netnsutil.Dialer(clientNS, nil)
	var answer string
	var err error
	for try := 0; try < 3; try++ {
		answer, err = askOnce(dial, network)
		if err == nil {
			return answer
		}
	}
	t.Fatalf("%s to the NodePort: %v", network, err)
	return ""
}

func askOnce(dial func(ctx context.Context, network, addr string) (net.Conn, error), network string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := dial(ctx, network, netip.AddrPortFrom(lanNode1, dsrNodePort).String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if network == "udp4" {
		if _, err := c.Write([]byte("hello")); err != nil {
			return "", err
		}
		buf := make([]byte, 256)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// TestDSRRealTraffic: TCP and UDP from an outside client to node1's
// NodePort reach node2's pod with the client's address, and the replies
// reach the client from the NodePort's address without crossing node1:
// node1's LAN link carries the client's packets in and the same packets
// out to node2 (the SYN and UDP ones with weft's option), never a reply;
// node2's LAN link carries the replies, from the NodePort, to the client.
// Over host-gw routes, and over VXLAN (where node2's receive side runs on
// the VXLAN device, whose rp_filter the proxy sets loose).
func TestDSRRealTraffic(t *testing.T) {
	for _, vxlan := range []bool{false, true} {
		name := "host-gw"
		if vxlan {
			name = "vxlan"
		}
		t.Run(name, func(t *testing.T) { dsrRealTraffic(t, vxlan, 0) })
	}
	// With weft_nodeport_xdp on both nodes' LAN links (--bpf-xdp): it
	// leaves the DSR flows to tc (bpf/xdp.h), which must make no
	// difference to them.
	for name, mode := range map[string]link.XDPAttachFlags{"host-gw-xdp-native": link.XDPDriverMode, "host-gw-xdp-generic": link.XDPGenericMode} {
		t.Run(name, func(t *testing.T) { dsrRealTraffic(t, false, mode) })
	}
}

// attachXDP attaches prog to dev in the namespace at ns in mode until the
// test ends.
func attachXDP(t *testing.T, ns, dev string, mode link.XDPAttachFlags, prog *ebpf.Program) {
	t.Helper()
	inNS(t, ns, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		lk, err := link.AttachXDP(link.XDPOptions{Interface: l.Attrs().Index, Program: prog, Flags: mode})
		if err != nil {
			return err
		}
		t.Cleanup(func() { _ = lk.Close() })
		return nil
	})
}

// dsrRealTraffic runs the test; xdp, when not 0, is the XDP mode
// weft_nodeport_xdp runs in on both nodes' LAN links.
func dsrRealTraffic(t *testing.T, vxlan bool, xdp link.XDPAttachFlags) {
	n1 := newTCEnv(t)
	n2 := newTCEnv(t)
	lab := newDSRLab(t, vxlan)
	front := netip.AddrPortFrom(lanNode1, dsrNodePort)
	be := backends(ext(podR, podPort))
	n1.program(map[FrontendKey]Frontend{
		{Addr: lanNode1, Port: dsrNodePort, Protocol: model.TCP, External: true}: {Masquerade: true, DSR: true, Backends: be, Remote: []bool{true}},
		{Addr: lanNode1, Port: dsrNodePort, Protocol: model.UDP, External: true}: {Masquerade: true, DSR: true, Backends: be, Remote: []bool{true}},
	})
	attachTCX(t, lab.node1, "eth0", false, n1.objs.WeftNodeport)
	attachTCX(t, lab.node1, "eth0", true, n1.objs.WeftReply)
	attachTCX(t, lab.node2, "eth0", false, n2.objs.WeftNodeport)
	attachTCX(t, lab.node2, "eth0", true, n2.objs.WeftReply)
	if xdp != 0 {
		attachXDP(t, lab.node1, "eth0", xdp, n1.objs.WeftNodeportXdp)
		attachXDP(t, lab.node2, "eth0", xdp, n2.objs.WeftNodeportXdp)
	}
	if vxlan {
		// As the proxy does on a node with the VXLAN device: the receive
		// side on its ingress, its reverse-path filter loose. Strict (1)
		// in "all" is what a hardened node has: the test sets it so that
		// the loose setting is what lets the packet in.
		attachTCX(t, lab.node2, "weft.vxlan", false, n2.objs.WeftNodeport)
		inNS(t, lab.node2, func() error {
			if err := sysctl("net/ipv4/conf/all/rp_filter", "1"); err != nil {
				return err
			}
			return looseRPFilter("weft.vxlan")
		})
	}
	servePod(t, lab.pod)

	var c1, c2 *capture.Capture
	var err error
	if c1, err = capture.Start(lab.node1, "eth0"); err != nil {
		t.Fatal(err)
	}
	if c2, err = capture.Start(lab.node2, "eth0"); err != nil {
		c1.Stop()
		t.Fatal(err)
	}
	for _, network := range []string{"tcp4", "udp4"} {
		got := ask(t, lab.client, network)
		if host, _, _ := strings.Cut(got, ":"); host != lanClient.String() {
			t.Errorf("%s: the pod saw %q, want the client's address %s", network, got, lanClient)
		}
	}
	f1, f2 := c1.Stop(), c2.Stop()

	// node1: the client's packets in, to node2 out; nothing from the pod
	// or from the NodePort (a reply) crosses it.
	var in, out, tunneled, withOpt, replies int
	for _, f := range f1 {
		p, ok := capture.IPv4(f)
		if !ok {
			continue
		}
		inner := p
		if vxlan && p.Proto == 17 && p.DstPort == 8472 && len(f) > 14+20+8+8+14 {
			inner, _ = capture.IPv4(f[14+20+8+8:])
			if inner.Src == lanClient && inner.Dst == podR {
				out++
				tunneled++
				if f[14+20+8+8+14] == 0x47 {
					withOpt++
				}
			}
			continue
		}
		switch {
		case p.Src == lanClient && p.Dst == lanNode1 && p.DstPort == dsrNodePort:
			in++
		case p.Src == lanClient && p.Dst == podR:
			out++
			if f[14] == 0x47 {
				withOpt++
			}
		case p.Src == podR || (p.Src == lanNode1 && p.SrcPort == dsrNodePort):
			replies++
		}
	}
	t.Logf("node1's LAN link: %d packets from the client in, %d to node2's pod out (%d in VXLAN, %d with weft's option), %d replies", in, out, tunneled, withOpt, replies)
	if vxlan && tunneled != out || !vxlan && tunneled != 0 {
		t.Errorf("node1: %d of %d packets to the pod went through VXLAN, vxlan %v", tunneled, out, vxlan)
	}
	if in == 0 || out != in || withOpt < 2 {
		t.Errorf("node1: %d in, %d out, %d with the option; want every packet in forwarded, the SYN and the UDP datagram with the option", in, out, withOpt)
	}
	if replies != 0 {
		t.Errorf("node1: %d replies crossed its link, want none (direct server return)", replies)
	}
	// node2: the replies leave to the client, from the NodePort.
	var direct, fromPod int
	for _, f := range f2 {
		p, ok := capture.IPv4(f)
		if !ok {
			continue
		}
		if p.Src == front.Addr() && p.SrcPort == front.Port() && p.Dst == lanClient {
			direct++
		}
		if p.Src == podR {
			fromPod++
		}
	}
	t.Logf("node2's LAN link: %d replies from the NodePort to the client, %d with the pod's address", direct, fromPod)
	if direct < 3 || fromPod != 0 {
		t.Errorf("node2: %d replies from %s to the client, %d from the pod's address; want the TCP and UDP replies, all from the NodePort", direct, front, fromPod)
	}
	if n, err := counterSum(n1.objs.WeftDsrFallbacks, 0); err != nil {
		t.Fatal(err)
	} else if n != 0 {
		t.Errorf("node1 counted %d DSR fallbacks", n)
	}
	if xdp != 0 {
		st, err := xdpStats(n1.objs.WeftXdpStats)
		if err != nil {
			t.Fatal(err)
		}
		if st["handoff"] < uint64(in) || st["translated"] != 0 {
			t.Errorf("node1's XDP program: %v; want the %d packets of the DSR flows handed to tc, none translated", st, in)
		}
	}
}
