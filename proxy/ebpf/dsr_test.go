package ebpf

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/weftnet/weft/proxy/model"
)

// Direct server return through BPF_PROG_TEST_RUN. The ingress program
// routes a DSR packet itself (bpf_fib_lookup): the test's namespace gets
// a device (dsrDev) with forwarding on and a route to the remote
// backends' CIDR via a next hop there, and the packets "arrive" on it.
var (
	dsrNextHop = netip.MustParseAddr("198.51.100.2")
	dsrDevAddr = netip.MustParsePrefix("198.51.100.1/24")
	// remoteCIDR holds the backends of another node, routed via dsrNextHop.
	remoteCIDR = netip.MustParsePrefix("10.250.9.0/24")
	podR       = netip.MustParseAddr("10.250.9.2")
	// unrouted is a remote backend this node has no route to.
	unrouted = netip.MustParseAddr("10.251.0.2")
)

const (
	actRedirect = 7
	dsrOptType  = 0x9e
)

var (
	dsrDevOnce sync.Once
	dsrDevIdx  int
	dsrDevErr  error
)

// dsrDevice sets the route up once in the test's private namespace and
// returns the device's ifindex.
func dsrDevice(t *testing.T) int {
	t.Helper()
	dsrDevOnce.Do(func() {
		la := netlink.NewLinkAttrs()
		la.Name = "dsr0"
		if dsrDevErr = netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "dsr0p"}); dsrDevErr != nil {
			return
		}
		l, err := netlink.LinkByName("dsr0")
		if err != nil {
			dsrDevErr = err
			return
		}
		p, _ := netlink.LinkByName("dsr0p")
		if dsrDevErr = netlink.LinkSetUp(l); dsrDevErr != nil {
			return
		}
		if dsrDevErr = netlink.LinkSetUp(p); dsrDevErr != nil {
			return
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: dsrDevAddr.Addr().AsSlice(), Mask: net.CIDRMask(dsrDevAddr.Bits(), 32)}}
		if dsrDevErr = netlink.AddrAdd(l, addr); dsrDevErr != nil {
			return
		}
		dst := &net.IPNet{IP: remoteCIDR.Addr().AsSlice(), Mask: net.CIDRMask(remoteCIDR.Bits(), 32)}
		if dsrDevErr = netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: dsrNextHop.AsSlice()}); dsrDevErr != nil {
			return
		}
		if dsrDevErr = os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); dsrDevErr != nil {
			return
		}
		dsrDevIdx = l.Attrs().Index
	})
	if dsrDevErr != nil {
		t.Fatalf("setting up the DSR route: %v", dsrDevErr)
	}
	return dsrDevIdx
}

// runDev runs prog on pkt as arriving on device idx; it returns the
// verdict, the packet and its mark.
func (e *tcEnv) runDev(prog *ebpf.Program, pkt []byte, idx int) (uint32, []byte, uint32) {
	e.t.Helper()
	out := make([]byte, len(pkt)+256)
	var ctxOut skbContext
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbContext{Ifindex: uint32(idx)}, ContextOut: &ctxOut}
	ret, err := prog.Run(opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return ret, opts.DataOut, ctxOut.Mark
}

// countEntries counts the entries of m.
func countEntries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var k, v []byte
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// withOption returns pkt (IPv4, a 20-byte header) with opt inserted after
// its IP header, the header's length, total length and checksum fixed.
func withOption(pkt, opt []byte) []byte {
	out := append(append(append([]byte{}, pkt[:34]...), opt...), pkt[34:]...)
	out[14] = 0x40 | byte((20+len(opt))/4)
	binary.BigEndian.PutUint16(out[16:], binary.BigEndian.Uint16(out[16:])+uint16(len(opt)))
	out[24], out[25] = 0, 0
	binary.BigEndian.PutUint16(out[24:], ^sum(0, out[14:34+len(opt)]))
	return out
}

// dsrOption is weft's option carrying frontend f.
func dsrOption(f netip.AddrPort) []byte {
	o := []byte{dsrOptType, 8, 0, 0}
	binary.BigEndian.PutUint16(o[2:], f.Port())
	a := f.Addr().As4()
	return append(o, a[:]...)
}

// withoutOption checks the IPv4 header of b with its 8-byte option
// (IHL 7, total length, checksum over 28 bytes) and returns the option
// and b without it (a 20-byte header again, its checksum fixed).
func withoutOption(t *testing.T, b []byte) (opt, rest []byte) {
	t.Helper()
	if b[14] != 0x47 {
		t.Fatalf("version/IHL %#x, want 0x47 (a 28-byte header)", b[14])
	}
	if got, want := int(binary.BigEndian.Uint16(b[16:])), len(b)-14; got != want {
		t.Fatalf("total length %d, the packet is %d", got, want)
	}
	if c := sum(0, b[14:42]); c != 0xffff {
		t.Fatalf("IPv4 header checksum over 28 bytes does not hold (sum %#x)", c)
	}
	opt = append([]byte{}, b[34:42]...)
	rest = append(append([]byte{}, b[:34]...), b[42:]...)
	rest[14] = 0x45
	binary.BigEndian.PutUint16(rest[16:], uint16(len(rest)-14))
	rest[24], rest[25] = 0, 0
	binary.BigEndian.PutUint16(rest[24:], ^sum(0, rest[14:34]))
	return opt, rest
}

func udpPort(a netip.Addr, port uint16) FrontendKey {
	return FrontendKey{Addr: a, Port: port, Protocol: model.UDP, External: true}
}

// dsrFronts: a DSR frontend per protocol with one remote backend, one
// with a local backend, one with an unrouted remote backend, and the UDP
// frontend as hybrid mode renders it (masqueraded, no DSR).
func dsrFronts() map[FrontendKey]Frontend {
	return map[FrontendKey]Frontend{
		nodePort(nodeIP, 31000): {Masquerade: true, DSR: true, Backends: backends(ext(podR, 80)), Remote: []bool{true}},
		udpPort(nodeIP, 31001):  {Masquerade: true, DSR: true, Backends: backends(ext(podR, 53)), Remote: []bool{true}},
		udpPort(nodeIP, 31002):  {Masquerade: true, Backends: backends(ext(podR, 54)), Remote: []bool{true}},
		nodePort(nodeIP, 31003): {Masquerade: true, DSR: true, Backends: backends(ext(podX, 80)), Remote: []bool{false}},
		nodePort(nodeIP, 31004): {Masquerade: true, DSR: true, Backends: backends(ext(unrouted, 80)), Remote: []bool{true}},
	}
}

// TestDSRSyn: a SYN to a DSR frontend whose backend is remote leaves
// translated (client -> backend), with weft's option naming the frontend
// (IHL 7, total length and header checksum right), TTL decremented, no
// masquerade mark, redirected by the program; the connection's later
// segment goes the same way without the option.
func TestDSRSyn(t *testing.T) {
	e := newTCEnv(t)
	idx := dsrDevice(t)
	e.program(dsrFronts())
	in := packet{src: ext(client, 41000), dst: ext(nodeIP, 31000)}
	verdict, out, mark := e.runDev(e.objs.WeftNodeport, in.bytes(), idx)
	if verdict != actRedirect {
		t.Fatalf("SYN: verdict %d, want a redirect (%d)", verdict, actRedirect)
	}
	if mark&masqBit != 0 {
		t.Fatalf("SYN: mark %#x carries the masquerade bit", mark)
	}
	opt, rest := withoutOption(t, out)
	if !bytes.Equal(opt, dsrOption(in.dst)) {
		t.Fatalf("option % x, want % x", opt, dsrOption(in.dst))
	}
	if ttl := out[14+8]; ttl != 63 {
		t.Fatalf("TTL %d, want 63", ttl)
	}
	if got := parsePacket(t, rest); got.src != in.src || got.dst != ext(podR, 80) {
		t.Fatalf("SYN translated to %s -> %s, want %s -> %s", got.src, got.dst, in.src, ext(podR, 80))
	}
	ack := packet{src: in.src, dst: in.dst, flags: 0x10}
	verdict, out, mark = e.runDev(e.objs.WeftNodeport, ack.bytes(), idx)
	if verdict != actRedirect || mark&masqBit != 0 {
		t.Fatalf("ACK: verdict %d mark %#x, want a redirect without masquerade", verdict, mark)
	}
	if out[14] != 0x45 {
		t.Fatalf("ACK: version/IHL %#x, want 0x45 (no option after the SYN)", out[14])
	}
	if got := parsePacket(t, out); got.dst != ext(podR, 80) || got.src != in.src {
		t.Fatalf("ACK translated to %s -> %s", got.src, got.dst)
	}
	// The ingress node keeps no reply translation of a DSR flow: the
	// reply leaves the backend's node.
	if n := countEntries(t, e.objs.WeftNatRev); n != 0 {
		t.Fatalf("%d nat_rev entries on the ingress node, want 0", n)
	}
}

// TestDSRUDP: in dsr mode every UDP packet carries the option; hybrid
// mode renders UDP frontends without DSR, which stay masqueraded.
func TestDSRUDP(t *testing.T) {
	e := newTCEnv(t)
	idx := dsrDevice(t)
	e.program(dsrFronts())
	in := packet{src: ext(client, 41001), dst: ext(nodeIP, 31001), udp: true}
	for i := range 2 {
		verdict, out, mark := e.runDev(e.objs.WeftNodeport, in.bytes(), idx)
		if verdict != actRedirect || mark&masqBit != 0 {
			t.Fatalf("UDP packet %d: verdict %d mark %#x, want a redirect without masquerade", i, verdict, mark)
		}
		opt, rest := withoutOption(t, out)
		if !bytes.Equal(opt, dsrOption(in.dst)) {
			t.Fatalf("UDP packet %d: option % x", i, opt)
		}
		if got := parsePacket(t, rest); got.dst != ext(podR, 53) || got.src != in.src {
			t.Fatalf("UDP packet %d translated to %s -> %s", i, got.src, got.dst)
		}
	}
	hyb := packet{src: ext(client, 41002), dst: ext(nodeIP, 31002), udp: true}
	verdict, out, mark := e.runDev(e.objs.WeftNodeport, hyb.bytes(), idx)
	if verdict != actOK || mark&masqBit == 0 || out[14] != 0x45 {
		t.Fatalf("hybrid UDP: verdict %d mark %#x IHL %#x, want the stack's, masqueraded, no option", verdict, mark, out[14])
	}
	if got := parsePacket(t, out); got.dst != ext(podR, 54) {
		t.Fatalf("hybrid UDP translated to %s", got.dst)
	}
	// And as the renderer decides: hybrid is DSR for TCP only.
	for _, c := range []struct {
		mode     string
		tcp, udp bool
	}{{LBModeSNAT, false, false}, {LBModeDSR, true, true}, {LBModeHybrid, true, false}} {
		cfg := Config{LBMode: c.mode}
		if cfg.dsr(model.TCP) != c.tcp || cfg.dsr(model.UDP) != c.udp {
			t.Errorf("mode %s: DSR for TCP %v UDP %v, want %v %v", c.mode, cfg.dsr(model.TCP), cfg.dsr(model.UDP), c.tcp, c.udp)
		}
	}
}

// TestDSRLocalAndUnrouted: a DSR frontend's local backend gets today's
// path (the stack, masqueraded, no option); a remote backend this node
// cannot route to is masqueraded instead, and counted.
func TestDSRLocalAndUnrouted(t *testing.T) {
	e := newTCEnv(t)
	idx := dsrDevice(t)
	e.program(dsrFronts())
	for _, c := range []struct {
		port uint16
		to   netip.AddrPort
	}{{31003, ext(podX, 80)}, {31004, ext(unrouted, 80)}} {
		in := packet{src: ext(client, 41003), dst: ext(nodeIP, c.port)}
		verdict, out, mark := e.runDev(e.objs.WeftNodeport, in.bytes(), idx)
		if verdict != actOK || mark&masqBit == 0 || out[14] != 0x45 {
			t.Fatalf("port %d: verdict %d mark %#x IHL %#x, want the stack's, masqueraded, no option", c.port, verdict, mark, out[14])
		}
		if got := parsePacket(t, out); got.dst != c.to || got.src != in.src {
			t.Fatalf("port %d: translated to %s -> %s", c.port, got.src, got.dst)
		}
	}
	n, err := counterSum(e.objs.WeftDsrFallbacks, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d fallbacks counted, want 1 (the unrouted backend)", n)
	}
}

// TestDSRReceive: the backend's node strips weft's option from a packet
// to its backend (a plain 20-byte header, checksums right), records the
// reply's translation, and its egress program gives the reply the
// frontend's address; a packet with another option, or weft's type with
// another length, is left alone.
func TestDSRReceive(t *testing.T) {
	e := newTCEnv(t)
	front := ext(nodeIP, 31000)
	plain := packet{src: ext(client, 42000), dst: ext(podX, 80)}
	verdict, out := e.run(e.objs.WeftNodeport, withOption(plain.bytes(), dsrOption(front)))
	if verdict != actOK {
		t.Fatalf("verdict %d, want the stack's", verdict)
	}
	if !bytes.Equal(out, plain.bytes()) {
		t.Fatalf("the option was not stripped back to the plain packet:\n got % x\nwant % x", out, plain.bytes())
	}
	reply := packet{src: plain.dst, dst: plain.src, flags: 0x12}
	verdict, back := e.run(e.objs.WeftReply, reply.bytes())
	if r := parsePacket(t, back); verdict != actOK || r.src != front || r.dst != plain.src {
		t.Fatalf("reply: verdict %d, %s -> %s, want %s -> %s", verdict, r.src, r.dst, front, plain.src)
	}
	// UDP the same.
	udp := packet{src: ext(client, 42001), dst: ext(podX, 53), udp: true}
	if _, out := e.run(e.objs.WeftNodeport, withOption(udp.bytes(), dsrOption(ext(nodeIP, 31001)))); !bytes.Equal(out, udp.bytes()) {
		t.Fatal("UDP: the option was not stripped back to the plain packet")
	}
	before := countEntries(t, e.objs.WeftNatRev)
	foreign := packet{src: ext(client2, 42002), dst: ext(podX, 80)}
	for _, opt := range [][]byte{
		{0x07, 7, 4, 0, 0, 0, 0, 0},                      // record route
		{dsrOptType, 4, 0x79, 0x18, 1, 0, 0, 0},          // weft's type, another length
		{0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x00}, // no-ops
	} {
		pkt := withOption(foreign.bytes(), opt)
		if verdict, out := e.run(e.objs.WeftNodeport, pkt); verdict != actOK || !bytes.Equal(out, pkt) {
			t.Fatalf("option % x: verdict %d, changed %v", opt, verdict, !bytes.Equal(out, pkt))
		}
	}
	if n := countEntries(t, e.objs.WeftNatRev); n != before {
		t.Fatalf("nat_rev went from %d to %d entries on foreign options", before, n)
	}
}

// TestRenderDSR: dsr mode marks the external eTP Cluster IPv4 frontends
// DSR (not eTP Local, not IPv6: those keep their path) and says which
// backends are remote by their endpoints' node.
func TestRenderDSR(t *testing.T) {
	v6Node := netip.MustParseAddr("2001:db8:1::1")
	sp := &model.ServicePort{Name: model.ServicePortName{Namespace: "ns", Name: "s", Port: "p", Protocol: model.TCP},
		Protocol: model.TCP, Port: 80, NodePort: 30500}
	eps := []model.Endpoint{
		{IP: podX, Port: 8080, NodeName: "node-a", Ready: true, Serving: true},
		{IP: podR, Port: 8080, NodeName: "node-b", Ready: true, Serving: true},
		{IP: podX6, Port: 8080, NodeName: "node-b", Ready: true, Serving: true},
	}
	st := model.State{Ports: map[model.ServicePortName]*model.ServicePort{sp.Name: sp},
		Endpoints: map[model.ServicePortName][]model.Endpoint{sp.Name: eps}}
	cfg := Config{NodeName: "node-a", NodePortIPs: []netip.Addr{nodeIP, v6Node}, LBMode: LBModeDSR}
	out := Render(cfg, st)
	f4 := out[nodePort(nodeIP, 30500)]
	if !f4.DSR || !f4.Masquerade {
		t.Fatalf("IPv4 NodePort: DSR %v masquerade %v, want both", f4.DSR, f4.Masquerade)
	}
	for i, b := range f4.Backends {
		if want := b.Addr() == podR; f4.Remote[i] != want {
			t.Errorf("backend %s: remote %v, want %v", b, f4.Remote[i], want)
		}
	}
	if f6 := out[nodePort(v6Node, 30500)]; f6.DSR || !f6.Masquerade {
		t.Fatalf("IPv6 NodePort: DSR %v masquerade %v, want masqueraded without DSR", f6.DSR, f6.Masquerade)
	}
	if f := out[FrontendKey{Addr: nodeIP, Port: 30500, Protocol: model.TCP}]; f.DSR {
		t.Fatal("the node's own NodePort (socket scope) is DSR")
	}
	local := *sp
	local.ExternalPolicyLocal = true
	st.Ports[sp.Name] = &local
	if f := Render(cfg, st)[nodePort(nodeIP, 30500)]; f.DSR {
		t.Fatal("eTP Local NodePort is DSR")
	}
	if f := Render(Config{NodeName: "node-a", NodePortIPs: []netip.Addr{nodeIP}}, st)[nodePort(nodeIP, 30500)]; f.DSR || f.Remote != nil {
		t.Fatal("snat mode renders DSR or remote backends")
	}
	if err := CheckLBMode("direct"); err == nil || !bytes.Contains([]byte(err.Error()), []byte("--bpf-lb-mode")) {
		t.Fatalf("CheckLBMode(direct): %v, want an error naming --bpf-lb-mode", err)
	}
}

// TestDSRNotOverL3Devices: a DSR flow whose route leaves by a device
// without Ethernet headers (a TUN device here; WireGuard's and IPIP's in
// a cluster), where the other node's receive side does not run, is
// masqueraded instead; the proxy lists such devices in weft_no_dsr.
func TestDSRNotOverL3Devices(t *testing.T) {
	e := newTCEnv(t)
	idx := dsrDevice(t)
	tunCIDR := netip.MustParsePrefix("10.252.0.0/24")
	podT := netip.MustParseAddr("10.252.0.2")
	la := netlink.NewLinkAttrs()
	la.Name = "dsrtun0"
	if err := netlink.LinkAdd(&netlink.Tuntap{LinkAttrs: la, Mode: netlink.TUNTAP_MODE_TUN, Flags: netlink.TUNTAP_DEFAULTS}); err != nil {
		t.Skipf("no TUN device: %v", err)
	}
	tun, err := netlink.LinkByName("dsrtun0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(tun) })
	if err := netlink.LinkSetUp(tun); err != nil {
		t.Fatal(err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: tun.Attrs().Index, Dst: &net.IPNet{IP: tunCIDR.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := syncNoDSR(e.objs.WeftNoDsr); err != nil {
		t.Fatal(err)
	}
	var v uint8
	if err := e.objs.WeftNoDsr.Lookup(uint32(tun.Attrs().Index), &v); err != nil {
		t.Fatalf("the TUN device is not in weft_no_dsr: %v", err)
	}
	if err := e.objs.WeftNoDsr.Lookup(uint32(idx), &v); err == nil {
		t.Fatal("an Ethernet device is in weft_no_dsr")
	}
	e.program(map[FrontendKey]Frontend{
		nodePort(nodeIP, 31010): {Masquerade: true, DSR: true, Backends: backends(ext(podT, 80)), Remote: []bool{true}},
	})
	in := packet{src: ext(client, 41010), dst: ext(nodeIP, 31010)}
	verdict, out, mark := e.runDev(e.objs.WeftNodeport, in.bytes(), idx)
	if verdict != actOK || mark&masqBit == 0 || out[14] != 0x45 {
		t.Fatalf("verdict %d mark %#x IHL %#x, want the stack's, masqueraded, no option", verdict, mark, out[14])
	}
}

// TestDSRLaterPacketUnrouted: a packet of an established DSR flow whose
// route went away goes to the stack translated (not dropped, not marked:
// the flow stays DSR), and is counted.
func TestDSRLaterPacketUnrouted(t *testing.T) {
	e := newTCEnv(t)
	idx := dsrDevice(t)
	podV := netip.MustParseAddr("10.253.0.2")
	route := &netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: net.IPv4(10, 253, 0, 0).To4(), Mask: net.CIDRMask(24, 32)}, Gw: dsrNextHop.AsSlice()}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatal(err)
	}
	e.program(map[FrontendKey]Frontend{
		nodePort(nodeIP, 31020): {Masquerade: true, DSR: true, Backends: backends(ext(podV, 80)), Remote: []bool{true}},
	})
	syn := packet{src: ext(client, 41020), dst: ext(nodeIP, 31020)}
	if verdict, _, _ := e.runDev(e.objs.WeftNodeport, syn.bytes(), idx); verdict != actRedirect {
		t.Fatalf("SYN: verdict %d, want a redirect", verdict)
	}
	if err := netlink.RouteDel(route); err != nil {
		t.Fatal(err)
	}
	ack := packet{src: syn.src, dst: syn.dst, flags: 0x10}
	verdict, out, mark := e.runDev(e.objs.WeftNodeport, ack.bytes(), idx)
	if verdict != actOK || mark&masqBit != 0 {
		t.Fatalf("ACK without a route: verdict %d mark %#x, want the stack's, unmarked", verdict, mark)
	}
	if got := parsePacket(t, out); got.dst != ext(podV, 80) || got.src != syn.src {
		t.Fatalf("ACK translated to %s -> %s", got.src, got.dst)
	}
	n, err := counterSum(e.objs.WeftDsrFallbacks, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d fallbacks counted, want 1", n)
	}
}
