package ebpf

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/model"
)

// The per-packet programs run through BPF_PROG_TEST_RUN on crafted
// packets. The test's private namespace has an uplink (tpu0, 203.0.113.1
// and 2001:db8:1::1) and a pod device (tpp0, 10.250.1.1 and
// 2001:db8:2::1) so that the programs' route lookups find the device and
// source address a real node would.
var (
	client   = netip.MustParseAddr("203.0.113.100")
	client2  = netip.MustParseAddr("203.0.113.101")
	nodeIP   = netip.MustParseAddr("203.0.113.1")
	bridgeIP = netip.MustParseAddr("10.250.1.1")
	podX     = netip.MustParseAddr("10.250.1.2")
	podY     = netip.MustParseAddr("10.250.1.3")
	client6  = netip.MustParseAddr("2001:db8:1::100")
	nodeIP6  = netip.MustParseAddr("2001:db8:1::1")
	bridge6  = netip.MustParseAddr("2001:db8:2::1")
	podX6    = netip.MustParseAddr("2001:db8:2::2")
)

const (
	actOK       = 0
	actShot     = 2
	actRedirect = 7
)

// tcEnv is the programs on fresh, unpinned maps, written by the writer.
type tcEnv struct {
	t       *testing.T
	objs    nodeportObjects
	w       *writer
	uplink  uint32 // ifindex of tpu0
	podLink uint32 // ifindex of tpp0
}

func newTCEnv(t *testing.T) *tcEnv { return newTCEnvWith(t, true) }

// newTCEnvWith loads the programs with fib_src as given (false: as on a
// kernel without BPF_FIB_LOOKUP_SRC, with the node's addresses written to
// weft_dev_addrs).
func newTCEnvWith(t *testing.T, fibSrc bool) *tcEnv {
	t.Helper()
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	for _, args := range [][]string{
		{"link", "add", "tpu0", "type", "veth", "peer", "name", "tpu1"},
		{"link", "add", "tpp0", "type", "veth", "peer", "name", "tpp1"},
		{"addr", "add", "203.0.113.1/24", "dev", "tpu0"},
		{"addr", "add", "10.250.1.1/24", "dev", "tpp0"},
		{"-6", "addr", "add", "2001:db8:1::1/64", "dev", "tpu0", "nodad"},
		{"-6", "addr", "add", "2001:db8:2::1/64", "dev", "tpp0", "nodad"},
		{"link", "set", "tpu0", "up"},
		{"link", "set", "tpp0", "up"},
		{"link", "set", "tpu1", "up"},
		{"link", "set", "tpp1", "up"},
		// Pods of another node, behind a router on the uplink.
		{"route", "add", "10.250.2.0/24", "via", "203.0.113.254", "dev", "tpu0"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", "tpu0").Run()
		_ = exec.Command("ip", "link", "del", "tpp0").Run()
	})
	// The programs look routes up as for a forwarded packet.
	for _, p := range []string{"/proc/sys/net/ipv4/conf/all/forwarding", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec, err := loadNodeport()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	if err := spec.Variables["fib_src"].Set(map[bool]uint8{false: 0, true: 1}[fibSrc]); err != nil {
		t.Fatal(err)
	}
	e := &tcEnv{t: t}
	if err := spec.LoadAndAssign(&e.objs, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.objs.Close() })
	e.w = newWriter(writerMaps{services: e.objs.WeftServices, backends: e.objs.WeftBackends, ranges: e.objs.WeftSrcRanges,
		maglev: e.objs.WeftMaglev})
	e.uplink, e.podLink = ifindex(t, "tpu0"), ifindex(t, "tpp0")
	if !fibSrc {
		if err := writeDevAddrs(e.objs.WeftDevAddrs, map[uint32]bool{}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func ifindex(t *testing.T, name string) uint32 {
	out, err := os.ReadFile("/sys/class/net/" + name + "/ifindex")
	if err != nil {
		t.Fatal(err)
	}
	var i uint32
	for _, c := range bytes.TrimSpace(out) {
		i = i*10 + uint32(c-'0')
	}
	return i
}

// program writes the frontends (all of them: the maps end up holding
// exactly these).
func (e *tcEnv) program(fronts map[FrontendKey]Frontend) {
	e.t.Helper()
	if err := e.w.apply(fronts, nil, true); err != nil {
		e.t.Fatal(err)
	}
}

// skbContext is the start of struct __sk_buff up to ifindex, the device
// the test packet arrives on.
type skbContext struct {
	_       [10]uint32
	Ifindex uint32
}

// run runs prog on pkt arriving on device ifindex; it returns the verdict
// and the packet as the program left it.
func (e *tcEnv) run(prog *ebpf.Program, ifindex uint32, pkt []byte) (uint32, []byte) {
	e.t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbContext{Ifindex: ifindex}}
	ret, err := prog.Run(opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return ret, opts.DataOut
}

// packet is a parsed or crafted TCP or UDP packet over Ethernet.
type packet struct {
	src, dst         netip.AddrPort
	udp, zeroUDPCsum bool
}

func ext(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// bytes lays p out with valid checksums (a UDP checksum of 0 over IPv4
// when zeroUDPCsum).
func (p packet) bytes() []byte {
	payload := []byte("weft test payload")
	proto := byte(6)
	l4 := make([]byte, 20)
	if p.udp {
		proto = 17
		l4 = make([]byte, 8)
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(payload)))
	} else {
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN
		binary.BigEndian.PutUint16(l4[14:], 65535)
	}
	binary.BigEndian.PutUint16(l4[0:], p.src.Port())
	binary.BigEndian.PutUint16(l4[2:], p.dst.Port())
	l4 = append(l4, payload...)
	csumOff := 16
	if p.udp {
		csumOff = 6
	}
	v6 := p.src.Addr().Is6()
	eth := make([]byte, 14)
	var l3 []byte
	if v6 {
		binary.BigEndian.PutUint16(eth[12:], 0x86dd)
		l3 = make([]byte, 40)
		l3[0] = 6 << 4
		binary.BigEndian.PutUint16(l3[4:], uint16(len(l4)))
		l3[6], l3[7] = proto, 64
		s, d := p.src.Addr().As16(), p.dst.Addr().As16()
		copy(l3[8:], s[:])
		copy(l3[24:], d[:])
	} else {
		binary.BigEndian.PutUint16(eth[12:], 0x0800)
		l3 = make([]byte, 20)
		l3[0] = 0x45
		binary.BigEndian.PutUint16(l3[2:], uint16(20+len(l4)))
		l3[8], l3[9] = 64, proto
		s, d := p.src.Addr().As4(), p.dst.Addr().As4()
		copy(l3[12:], s[:])
		copy(l3[16:], d[:])
		binary.BigEndian.PutUint16(l3[10:], ^sum(0, l3))
	}
	if !(p.udp && p.zeroUDPCsum && !v6) {
		c := ^sum(pseudo(p.src.Addr(), p.dst.Addr(), proto, len(l4)), l4)
		if c == 0 && p.udp {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(l4[csumOff:], c)
	}
	return append(append(eth, l3...), l4...)
}

// sum is the ones' complement sum of b added to s.
func sum(s uint32, b []byte) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

func pseudo(src, dst netip.Addr, proto byte, n int) uint32 {
	var b []byte
	b = append(b, src.AsSlice()...)
	b = append(b, dst.AsSlice()...)
	b = append(b, 0, proto)
	b = binary.BigEndian.AppendUint16(b, uint16(n))
	return uint32(sum(0, b))
}

// parsePacket reads a packet back, failing the test unless its checksums
// hold; it reports whether a UDP checksum was 0.
func parsePacket(t *testing.T, b []byte) packet {
	t.Helper()
	var p packet
	var l3len int
	var proto byte
	var src, dst netip.Addr
	if binary.BigEndian.Uint16(b[12:]) == 0x86dd {
		l3len, proto = 40, b[14+6]
		src, _ = netip.AddrFromSlice(b[14+8 : 14+24])
		dst, _ = netip.AddrFromSlice(b[14+24 : 14+40])
	} else {
		l3len, proto = 20, b[14+9]
		src, _ = netip.AddrFromSlice(b[14+12 : 14+16])
		dst, _ = netip.AddrFromSlice(b[14+16 : 14+20])
		if c := sum(0, b[14:34]); c != 0xffff {
			t.Fatalf("IPv4 header checksum does not hold (sum %#x)", c)
		}
	}
	l4 := b[14+l3len:]
	p.udp = proto == 17
	p.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:]))
	p.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:]))
	if p.udp && binary.BigEndian.Uint16(l4[6:]) == 0 {
		p.zeroUDPCsum = true
		return p
	}
	if c := sum(pseudo(src, dst, proto, len(l4)), l4); c != 0xffff {
		t.Fatalf("%s -> %s: L4 checksum does not hold (sum %#x)", p.src, p.dst, c)
	}
	return p
}

func backends(aps ...netip.AddrPort) []netip.AddrPort { return aps }

func nodePort(a netip.Addr, port uint16) FrontendKey {
	return FrontendKey{Addr: a, Port: port, Protocol: model.TCP, External: true}
}

// TestNodePortTranslation: a packet to an eTP Cluster NodePort is
// translated to a backend and SNATed to the node's address toward it
// (the pod device's), the client's port kept; the flow's next packet goes
// to the same backend; the backend's reply, through the pod device's
// program, is translated back to come from the NodePort. Checksums hold
// after every rewrite.
func TestNodePortTranslation(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true,
		Backends: backends(ext(podX, 80), ext(podY, 80))}})
	in := packet{src: ext(client, 40000), dst: ext(nodeIP, 30080)}
	verdict, out := e.run(e.objs.WeftNodeport, e.uplink, in.bytes())
	if verdict != actRedirect {
		t.Fatalf("verdict %d, want redirect (%d)", verdict, actRedirect)
	}
	got := parsePacket(t, out)
	if got.dst != ext(podX, 80) && got.dst != ext(podY, 80) {
		t.Fatalf("translated to %s, want a backend", got.dst)
	}
	if got.src != ext(bridgeIP, 40000) {
		t.Fatalf("source %s, want the node's address toward the backend with the client's port, %s", got.src, ext(bridgeIP, 40000))
	}
	for range 10 {
		if _, again := e.run(e.objs.WeftNodeport, e.uplink, in.bytes()); parsePacket(t, again).dst != got.dst {
			t.Fatalf("the flow's next packet went to %s, its first to %s", parsePacket(t, again).dst, got.dst)
		}
	}
	reply := packet{src: got.dst, dst: got.src}
	verdict, back := e.run(e.objs.WeftReply, e.podLink, reply.bytes())
	if verdict != actRedirect {
		t.Fatalf("reply verdict %d, want redirect", verdict)
	}
	if r := parsePacket(t, back); r.src != in.dst || r.dst != in.src {
		t.Fatalf("reply translated to %s -> %s, want %s -> %s", r.src, r.dst, in.dst, in.src)
	}
	// Another client with the same port: the backend must tell the flows
	// apart, so it gets another port.
	one := map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true, Backends: backends(ext(podX, 80))}}
	e.program(one)
	first := parsePacket(t, second(e.run(e.objs.WeftNodeport, e.uplink, packet{src: ext(client, 41000), dst: ext(nodeIP, 30080)}.bytes())))
	other := parsePacket(t, second(e.run(e.objs.WeftNodeport, e.uplink, packet{src: ext(client2, 41000), dst: ext(nodeIP, 30080)}.bytes())))
	if first.src == other.src {
		t.Fatalf("two clients' flows both SNATed to %s", first.src)
	}
}

func second(_ uint32, b []byte) []byte { return b }

// TestNodePortRemoteBackend: a backend on another node is reached through
// the uplink, SNATed to the uplink's address; its reply comes back on the
// uplink, where weft_nodeport translates it back.
func TestNodePortRemoteBackend(t *testing.T) {
	e := newTCEnv(t)
	remote := ext(netip.MustParseAddr("10.250.2.9"), 80)
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true, Backends: backends(remote)}})
	in := packet{src: ext(client, 40000), dst: ext(nodeIP, 30080)}
	verdict, out := e.run(e.objs.WeftNodeport, e.uplink, in.bytes())
	got := parsePacket(t, out)
	if verdict != actRedirect || got.dst != remote || got.src != ext(nodeIP, 40000) {
		t.Fatalf("verdict %d, %s -> %s; want redirect, %s -> %s", verdict, got.src, got.dst, ext(nodeIP, 40000), remote)
	}
	verdict, back := e.run(e.objs.WeftNodeport, e.uplink, packet{src: remote, dst: got.src}.bytes())
	if r := parsePacket(t, back); verdict != actRedirect || r.src != in.dst || r.dst != in.src {
		t.Fatalf("reply: verdict %d, %s -> %s; want redirect, %s -> %s", verdict, r.src, r.dst, in.dst, in.src)
	}
}

// TestNodePortLocalPolicy: eTP Local keeps the client's address and uses
// the local endpoint; without one (endpoints elsewhere only) packets are
// dropped; without any endpoint the stack gets them (it refuses, as for a
// port nobody listens on).
func TestNodePortLocalPolicy(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{
		nodePort(nodeIP, 30081): {Backends: backends(ext(podY, 80))},
		nodePort(nodeIP, 30082): {Verdict: Drop},
		nodePort(nodeIP, 30083): {Verdict: Reject},
	})
	in := packet{src: ext(client, 40001), dst: ext(nodeIP, 30081)}
	verdict, out := e.run(e.objs.WeftNodeport, e.uplink, in.bytes())
	if got := parsePacket(t, out); verdict != actRedirect || got.src != in.src || got.dst != ext(podY, 80) {
		t.Fatalf("verdict %d, %s -> %s; want redirect, %s -> %s", verdict, got.src, got.dst, in.src, ext(podY, 80))
	}
	reply := packet{src: ext(podY, 80), dst: in.src}
	verdict, back := e.run(e.objs.WeftReply, e.podLink, reply.bytes())
	if r := parsePacket(t, back); verdict != actRedirect || r.src != in.dst || r.dst != in.src {
		t.Fatalf("reply: verdict %d, %s -> %s; want redirect, %s -> %s", verdict, r.src, r.dst, in.dst, in.src)
	}
	drop := packet{src: ext(client, 40002), dst: ext(nodeIP, 30082)}.bytes()
	if verdict, _ := e.run(e.objs.WeftNodeport, e.uplink, drop); verdict != actShot {
		t.Fatalf("no local endpoint: verdict %d, want drop (%d)", verdict, actShot)
	}
	reject := packet{src: ext(client, 40003), dst: ext(nodeIP, 30083)}.bytes()
	if verdict, out := e.run(e.objs.WeftNodeport, e.uplink, reject); verdict != actOK || !bytes.Equal(out, reject) {
		t.Fatalf("no endpoint: verdict %d (want %d), packet changed: %v", verdict, actOK, !bytes.Equal(out, reject))
	}
}

// TestNonServiceTrafficUntouched: packets that are not for a frontend or
// flow of weft's pass unchanged, on both programs.
func TestNonServiceTrafficUntouched(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true, Backends: backends(ext(podX, 80))},
		// A socket-scope frontend of the same address: not the tc path's.
		{Addr: nodeIP, Port: 30090, Protocol: model.TCP}: {Backends: backends(ext(podX, 80))}})
	arp := make([]byte, 42)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	for name, pkt := range map[string][]byte{
		"ssh to the node":                  packet{src: ext(client, 40000), dst: ext(nodeIP, 22)}.bytes(),
		"UDP to the NodePort number":       packet{src: ext(client, 40000), dst: ext(nodeIP, 30080), udp: true}.bytes(),
		"a socket-scope frontend":          packet{src: ext(client, 40000), dst: ext(nodeIP, 30090)}.bytes(),
		"a pod's own traffic":              packet{src: ext(podX, 5555), dst: ext(client, 443)}.bytes(),
		"ARP":                              arp,
		"IPv6 to a port with no frontend":  packet{src: ext(client6, 40000), dst: ext(nodeIP6, 30080)}.bytes(),
		"a reply of a flow never balanced": packet{src: ext(podX, 80), dst: ext(bridgeIP, 40000)}.bytes(),
	} {
		for _, prog := range []*ebpf.Program{e.objs.WeftNodeport, e.objs.WeftReply} {
			if verdict, out := e.run(prog, e.uplink, pkt); verdict != actOK || !bytes.Equal(out, pkt) {
				t.Errorf("%s through %s: verdict %d, changed %v; want it passed untouched", name, progName(prog), verdict, !bytes.Equal(out, pkt))
			}
		}
	}
}

// TestUDPChecksums: a UDP datagram without checksum (0, IPv4) keeps none
// through the translation; one with a checksum keeps it valid.
func TestUDPChecksums(t *testing.T) {
	e := newTCEnv(t)
	k := FrontendKey{Addr: nodeIP, Port: 30053, Protocol: model.UDP, External: true}
	e.program(map[FrontendKey]Frontend{k: {Masquerade: true, Backends: backends(ext(podX, 53))}})
	for _, zero := range []bool{true, false} {
		in := packet{src: ext(client, 50000), dst: ext(nodeIP, 30053), udp: true, zeroUDPCsum: zero}
		verdict, out := e.run(e.objs.WeftNodeport, e.uplink, in.bytes())
		got := parsePacket(t, out)
		if verdict != actRedirect || got.dst != ext(podX, 53) || got.src.Addr() != bridgeIP {
			t.Fatalf("zero checksum %v: verdict %d, %s -> %s", zero, verdict, got.src, got.dst)
		}
		if got.zeroUDPCsum != zero {
			t.Fatalf("a datagram with zero checksum %v left with zero checksum %v", zero, got.zeroUDPCsum)
		}
	}
}

// TestNodePortIPv6: the same translation over IPv6 (no IPv4 header
// checksum: the TCP checksum carries the addresses).
func TestNodePortIPv6(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP6, 30080): {Masquerade: true, Backends: backends(ext(podX6, 80))}})
	in := packet{src: ext(client6, 40000), dst: ext(nodeIP6, 30080)}
	verdict, out := e.run(e.objs.WeftNodeport, e.uplink, in.bytes())
	got := parsePacket(t, out)
	if verdict != actRedirect || got.dst != ext(podX6, 80) || got.src != ext(bridge6, 40000) {
		t.Fatalf("verdict %d, %s -> %s; want redirect, %s -> %s", verdict, got.src, got.dst, ext(bridge6, 40000), ext(podX6, 80))
	}
	verdict, back := e.run(e.objs.WeftReply, e.podLink, packet{src: got.dst, dst: got.src}.bytes())
	if r := parsePacket(t, back); verdict != actRedirect || r.src != in.dst || r.dst != in.src {
		t.Fatalf("reply: verdict %d, %s -> %s", verdict, r.src, r.dst)
	}
}

// TestSourceRanges: a LoadBalancer IP with sourceRanges serves clients in
// them and drops the others.
func TestSourceRanges(t *testing.T) {
	e := newTCEnv(t)
	lb := netip.MustParseAddr("192.0.2.10")
	e.program(map[FrontendKey]Frontend{{Addr: lb, Port: 80, Protocol: model.TCP, External: true}: {Masquerade: true,
		Backends: backends(ext(podX, 80)), SourceRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.96/29")}}})
	if verdict, _ := e.run(e.objs.WeftNodeport, e.uplink, packet{src: ext(client, 40000), dst: ext(lb, 80)}.bytes()); verdict != actRedirect {
		t.Fatalf("client in the range: verdict %d, want redirect", verdict)
	}
	if verdict, _ := e.run(e.objs.WeftNodeport, e.uplink, packet{src: ext(client2, 40000), dst: ext(lb, 80)}.bytes()); verdict != actRedirect {
		t.Fatalf("second client in the range: verdict %d, want redirect", verdict)
	}
	outside := netip.MustParseAddr("203.0.113.200")
	if verdict, _ := e.run(e.objs.WeftNodeport, e.uplink, packet{src: ext(outside, 40000), dst: ext(lb, 80)}.bytes()); verdict != actShot {
		t.Fatalf("client outside the range: verdict %d, want drop", verdict)
	}
}

// TestFlowLeavesRemovedBackend: a flow whose backend left the Service (and
// the backends map) is balanced again to a present backend.
func TestFlowLeavesRemovedBackend(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true, Backends: backends(ext(podX, 80))}})
	in := packet{src: ext(client, 40000), dst: ext(nodeIP, 30080)}.bytes()
	if got := parsePacket(t, second(e.run(e.objs.WeftNodeport, e.uplink, in))); got.dst != ext(podX, 80) {
		t.Fatalf("first packet to %s", got.dst)
	}
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true, Backends: backends(ext(podY, 80))}})
	if got := parsePacket(t, second(e.run(e.objs.WeftNodeport, e.uplink, in))); got.dst != ext(podY, 80) {
		t.Fatalf("after the backend was replaced the flow went to %s, want %s", got.dst, ext(podY, 80))
	}
}

// TestMaglevFlows: new flows to an external frontend follow its Maglev
// table: after one of 10 backends is removed (and the flows' state lost,
// as on another node), at most 1 % of the flows on the other backends
// land elsewhere; the choice is a function of the flow, so it holds
// exactly, run after run.
func TestMaglevFlows(t *testing.T) {
	e := newTCEnv(t)
	var bs []netip.AddrPort
	for i := range 10 {
		bs = append(bs, ext(netip.AddrFrom4([4]byte{10, 250, 1, byte(2 + i)}), 80))
	}
	route := func(list []netip.AddrPort) []netip.AddrPort {
		e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true, Backends: list}})
		for _, m := range []*ebpf.Map{e.objs.WeftCt, e.objs.WeftNatRev} {
			var k nodeportTuple
			var keys []nodeportTuple
			it := m.Iterate()
			var v []byte
			for it.Next(&k, &v) {
				keys = append(keys, k)
			}
			for _, k := range keys {
				if err := m.Delete(k); err != nil {
					t.Fatal(err)
				}
			}
		}
		var got []netip.AddrPort
		for i := range 4000 {
			src := ext(netip.AddrFrom4([4]byte{203, 0, 113, byte(100 + i%50)}), uint16(20000+i))
			got = append(got, parsePacket(t, second(e.run(e.objs.WeftNodeport, e.uplink, packet{src: src, dst: ext(nodeIP, 30080)}.bytes()))).dst)
		}
		return got
	}
	before := route(bs)
	count := map[netip.AddrPort]int{}
	for _, b := range before {
		count[b]++
	}
	if len(count) != len(bs) {
		t.Fatalf("4000 flows reached %d of 10 backends", len(count))
	}
	removed := bs[4]
	after := route(append(append([]netip.AddrPort{}, bs[:4]...), bs[5:]...))
	moved, others := 0, 0
	for i := range before {
		if after[i] == removed {
			t.Fatalf("flow %d went to the removed backend", i)
		}
		if before[i] != removed {
			others++
			if after[i] != before[i] {
				moved++
			}
		}
	}
	if float64(moved) > 0.01*float64(others) {
		t.Fatalf("%d of the %d flows on the remaining backends moved, want at most 1 %%", moved, others)
	}
	t.Logf("%d of %d flows on the remaining backends moved", moved, others)
}

// TestSNATWithoutFibSrc: on a kernel whose route lookup cannot give the
// source, the program takes the address of the device the route names
// from weft_dev_addrs: the pod device's for a local backend (IPv4 and
// IPv6), the uplink's for a backend on another node.
func TestSNATWithoutFibSrc(t *testing.T) {
	e := newTCEnvWith(t, false)
	remote := ext(netip.MustParseAddr("10.250.2.9"), 80)
	e.program(map[FrontendKey]Frontend{
		nodePort(nodeIP, 30080):  {Masquerade: true, Backends: backends(ext(podX, 80))},
		nodePort(nodeIP, 30081):  {Masquerade: true, Backends: backends(remote)},
		nodePort(nodeIP6, 30080): {Masquerade: true, Backends: backends(ext(podX6, 80))},
	})
	for _, tc := range []struct {
		in       packet
		dst, src netip.AddrPort
	}{
		{packet{src: ext(client, 40000), dst: ext(nodeIP, 30080)}, ext(podX, 80), ext(bridgeIP, 40000)},
		{packet{src: ext(client, 40000), dst: ext(nodeIP, 30081)}, remote, ext(nodeIP, 40000)},
		{packet{src: ext(client6, 40000), dst: ext(nodeIP6, 30080)}, ext(podX6, 80), ext(bridge6, 40000)},
	} {
		verdict, out := e.run(e.objs.WeftNodeport, e.uplink, tc.in.bytes())
		if got := parsePacket(t, out); verdict != actRedirect || got.dst != tc.dst || got.src != tc.src {
			t.Errorf("%s -> %s: verdict %d, %s -> %s; want redirect, %s -> %s", tc.in.src, tc.in.dst, verdict, got.src, got.dst, tc.src, tc.dst)
		}
	}
}
