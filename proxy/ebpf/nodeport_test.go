package ebpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/proxy/model"
)

// The per-packet programs run through BPF_PROG_TEST_RUN on crafted
// packets (they translate addresses and ports and set skb->mark; the
// kernel routes the packets, so no device of a node is needed here).
var (
	client  = netip.MustParseAddr("203.0.113.100")
	client2 = netip.MustParseAddr("203.0.113.101")
	nodeIP  = netip.MustParseAddr("203.0.113.1")
	podX    = netip.MustParseAddr("10.250.1.2")
	podY    = netip.MustParseAddr("10.250.1.3")
	client6 = netip.MustParseAddr("2001:db8:1::100")
	nodeIP6 = netip.MustParseAddr("2001:db8:1::1")
	podX6   = netip.MustParseAddr("2001:db8:2::2")
)

const (
	actOK   = 0
	actShot = 2
	// masqBit is the default masquerade mark (Config.MasqueradeBit 0).
	masqBit = 0x4000
)

// tcEnv is the programs on fresh, unpinned maps, written by the writer.
type tcEnv struct {
	t    *testing.T
	objs nodeportObjects
	w    *writer
}

func newTCEnv(t *testing.T) *tcEnv {
	t.Helper()
	if testing.Short() || !netnsutil.Isolated() {
		t.Skip("kernel test: needs root (private network namespace), not -short")
	}
	spec, err := loadNodeport()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	e := &tcEnv{t: t}
	if err := spec.LoadAndAssign(&e.objs, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.objs.Close() })
	e.w = newWriter(writerMaps{services: e.objs.WeftServices, backends: e.objs.WeftBackends, ranges: e.objs.WeftSrcRanges,
		maglev: e.objs.WeftMaglev, members: e.objs.WeftAffinityMembers})
	return e
}

// program writes the frontends (all of them: the maps end up holding
// these, and the backends it retired, marked, until dropRetired).
func (e *tcEnv) program(fronts map[FrontendKey]Frontend) {
	e.t.Helper()
	if err := e.w.apply(fronts, nil, true); err != nil {
		e.t.Fatal(err)
	}
}

// skbContext is struct __sk_buff as the test sets it (256 bytes, at least
// the kernel's size): the mark the packet has before and after the
// program, and the device it is on (lo).
type skbContext struct {
	_       [2]uint32
	Mark    uint32
	_       [7]uint32
	Ifindex uint32
	// the rest of struct __sk_buff, zero (the kernel fills it when it
	// hands the context back)
	_ [53]uint32
}

// run runs prog on pkt; it returns the verdict, the packet as the
// program left it and its mark.
func (e *tcEnv) run(prog *ebpf.Program, pkt []byte) (uint32, []byte) {
	v, out, _ := e.runMark(prog, pkt, 0)
	return v, out
}

// runMark runs prog on pkt carrying mark.
func (e *tcEnv) runMark(prog *ebpf.Program, pkt []byte, mark uint32) (uint32, []byte, uint32) {
	e.t.Helper()
	out := make([]byte, len(pkt)+256)
	var ctxOut skbContext
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: skbContext{Mark: mark, Ifindex: 1}, ContextOut: &ctxOut}
	ret, err := prog.Run(opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return ret, opts.DataOut, ctxOut.Mark
}

// packet is a parsed or crafted TCP or UDP packet over Ethernet.
type packet struct {
	src, dst         netip.AddrPort
	udp, zeroUDPCsum bool
	flags            byte // TCP flags; 0 is a SYN
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
		if p.flags != 0 {
			l4[13] = p.flags
		}
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

// TestNodePortTranslation: a packet to an eTP Cluster NodePort gets a
// backend as destination, keeps the client as source (the kernel forwards
// it: NetworkPolicy sees the client) and carries the masquerade bit beside
// the mark bits it had; the flow's next packet goes to the same backend;
// the backend's reply, as it leaves toward the client after conntrack
// (backend -> client), gets the NodePort back as source. Checksums hold
// after every rewrite.
func TestNodePortTranslation(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true,
		Backends: backends(ext(podX, 80), ext(podY, 80))}})
	in := packet{src: ext(client, 40000), dst: ext(nodeIP, 30080)}
	verdict, out, mark := e.runMark(e.objs.WeftNodeport, in.bytes(), 0x1)
	if verdict != actOK {
		t.Fatalf("verdict %d, want the stack's (%d)", verdict, actOK)
	}
	if mark != 0x1|masqBit {
		t.Fatalf("mark %#x, want the packet's own %#x and the masquerade bit %#x", mark, 0x1, masqBit)
	}
	got := parsePacket(t, out)
	if got.dst != ext(podX, 80) && got.dst != ext(podY, 80) {
		t.Fatalf("translated to %s, want a backend", got.dst)
	}
	if got.src != in.src {
		t.Fatalf("source %s, want the client's %s (the masquerade is the kernel's)", got.src, in.src)
	}
	for range 10 {
		if _, again := e.run(e.objs.WeftNodeport, in.bytes()); parsePacket(t, again).dst != got.dst {
			t.Fatalf("the flow's next packet went to %s, its first to %s", parsePacket(t, again).dst, got.dst)
		}
	}
	reply := packet{src: got.dst, dst: got.src}
	verdict, back := e.run(e.objs.WeftReply, reply.bytes())
	if verdict != actOK {
		t.Fatalf("reply verdict %d, want the stack's", verdict)
	}
	if r := parsePacket(t, back); r.src != in.dst || r.dst != in.src {
		t.Fatalf("reply translated to %s -> %s, want %s -> %s", r.src, r.dst, in.dst, in.src)
	}
	// The ingress program leaves a reply alone: the kernel's conntrack
	// must see it as the backend sent it.
	if verdict, out := e.run(e.objs.WeftNodeport, reply.bytes()); verdict != actOK || !bytes.Equal(out, reply.bytes()) {
		t.Fatalf("a reply through the ingress program: verdict %d, changed %v", verdict, !bytes.Equal(out, reply.bytes()))
	}
}

func second(_ uint32, b []byte) []byte { return b }

// TestNodePortLocalPolicy: eTP Local keeps the client's address, uses the
// local endpoint and marks nothing for masquerade; without one (endpoints
// elsewhere only) packets are dropped; without any endpoint the stack gets
// them (it refuses, as for a port nobody listens on).
func TestNodePortLocalPolicy(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{
		nodePort(nodeIP, 30081): {Backends: backends(ext(podY, 80))},
		nodePort(nodeIP, 30082): {Verdict: Drop},
		nodePort(nodeIP, 30083): {Verdict: Reject},
	})
	in := packet{src: ext(client, 40001), dst: ext(nodeIP, 30081)}
	verdict, out, mark := e.runMark(e.objs.WeftNodeport, in.bytes(), 0)
	if got := parsePacket(t, out); verdict != actOK || mark != 0 || got.src != in.src || got.dst != ext(podY, 80) {
		t.Fatalf("verdict %d, mark %#x, %s -> %s; want %d, no mark, %s -> %s", verdict, mark, got.src, got.dst, actOK, in.src, ext(podY, 80))
	}
	reply := packet{src: ext(podY, 80), dst: in.src}
	verdict, back := e.run(e.objs.WeftReply, reply.bytes())
	if r := parsePacket(t, back); verdict != actOK || r.src != in.dst || r.dst != in.src {
		t.Fatalf("reply: verdict %d, %s -> %s; want %d, %s -> %s", verdict, r.src, r.dst, actOK, in.dst, in.src)
	}
	drop := packet{src: ext(client, 40002), dst: ext(nodeIP, 30082)}.bytes()
	if verdict, _ := e.run(e.objs.WeftNodeport, drop); verdict != actShot {
		t.Fatalf("no local endpoint: verdict %d, want drop (%d)", verdict, actShot)
	}
	reject := packet{src: ext(client, 40003), dst: ext(nodeIP, 30083)}.bytes()
	if verdict, out := e.run(e.objs.WeftNodeport, reject); verdict != actOK || !bytes.Equal(out, reject) {
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
		"a reply of a flow never balanced": packet{src: ext(podX, 80), dst: ext(client, 40000)}.bytes(),
	} {
		for _, prog := range []*ebpf.Program{e.objs.WeftNodeport, e.objs.WeftReply} {
			if verdict, out, mark := e.runMark(prog, pkt, 0); verdict != actOK || !bytes.Equal(out, pkt) || mark != 0 {
				t.Errorf("%s through %s: verdict %d, changed %v, mark %#x; want it passed untouched", name, progName(prog), verdict, !bytes.Equal(out, pkt), mark)
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
		verdict, out := e.run(e.objs.WeftNodeport, in.bytes())
		got := parsePacket(t, out)
		if verdict != actOK || got.dst != ext(podX, 53) || got.src != in.src {
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
	verdict, out := e.run(e.objs.WeftNodeport, in.bytes())
	got := parsePacket(t, out)
	if verdict != actOK || got.dst != ext(podX6, 80) || got.src != in.src {
		t.Fatalf("verdict %d, %s -> %s; want %d, %s -> %s", verdict, got.src, got.dst, actOK, in.src, ext(podX6, 80))
	}
	verdict, back := e.run(e.objs.WeftReply, packet{src: got.dst, dst: got.src}.bytes())
	if r := parsePacket(t, back); verdict != actOK || r.src != in.dst || r.dst != in.src {
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
	for _, c := range []netip.Addr{client, client2} {
		verdict, out := e.run(e.objs.WeftNodeport, packet{src: ext(c, 40000), dst: ext(lb, 80)}.bytes())
		if got := parsePacket(t, out); verdict != actOK || got.dst != ext(podX, 80) {
			t.Fatalf("client %s in the range: verdict %d, to %s; want %d, to %s", c, verdict, got.dst, actOK, ext(podX, 80))
		}
	}
	outside := netip.MustParseAddr("203.0.113.200")
	if verdict, _ := e.run(e.objs.WeftNodeport, packet{src: ext(outside, 40000), dst: ext(lb, 80)}.bytes()); verdict != actShot {
		t.Fatalf("client outside the range: verdict %d, want drop", verdict)
	}
}

// TestFlowLeavesRemovedBackend: a flow whose backend left the Service (and
// the backends map) is balanced again to a present backend.
func TestFlowLeavesRemovedBackend(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true, Backends: backends(ext(podX, 80))}})
	in := packet{src: ext(client, 40000), dst: ext(nodeIP, 30080)}.bytes()
	if got := parsePacket(t, second(e.run(e.objs.WeftNodeport, in))); got.dst != ext(podX, 80) {
		t.Fatalf("first packet to %s", got.dst)
	}
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true, Backends: backends(ext(podY, 80))}})
	if got := parsePacket(t, second(e.run(e.objs.WeftNodeport, in))); got.dst != ext(podY, 80) {
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
			got = append(got, parsePacket(t, second(e.run(e.objs.WeftNodeport, packet{src: src, dst: ext(nodeIP, 30080)}.bytes()))).dst)
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

// TestBridgePortFrames: on a port of a bridge holding a node address,
// weft_nodeport_port translates the frames addressed to the bridge (its
// MAC address) and leaves alone those the bridge forwards to another host
// or floods, and every frame of a port it was not told of.
func TestBridgePortFrames(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Backends: backends(ext(podX, 80))}})
	bridgeMAC := []byte{0x02, 0x77, 0x65, 0x66, 0x74, 0x01}
	frame := func(dst []byte) []byte {
		b := packet{src: ext(client, 40000), dst: ext(nodeIP, 30080)}.bytes()
		copy(b, dst)
		return b
	}
	// The test runs the program on lo (ifindex 1).
	port := nodeportBridgePort{MacHi: binary.NativeEndian.Uint32(bridgeMAC[:4]), MacLo: binary.NativeEndian.Uint16(bridgeMAC[4:])}
	if err := syncBridgePorts(e.objs.WeftBridgePorts, map[uint32]nodeportBridgePort{1: port}); err != nil {
		t.Fatal(err)
	}
	if got := parsePacket(t, second(e.run(e.objs.WeftNodeportPort, frame(bridgeMAC)))); got.dst != ext(podX, 80) {
		t.Fatalf("a frame to the bridge went to %s, want the backend", got.dst)
	}
	for _, dst := range [][]byte{{0x02, 0x77, 0x65, 0x66, 0x74, 0x02}, {0x02, 0x77, 0x65, 0x66, 0x75, 0x01}, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff}} {
		in := frame(dst)
		if verdict, out := e.run(e.objs.WeftNodeportPort, in); verdict != actOK || !bytes.Equal(out, in) {
			t.Fatalf("a frame to %x, not the bridge: verdict %d, changed %v", dst, verdict, !bytes.Equal(out, in))
		}
	}
	if err := syncBridgePorts(e.objs.WeftBridgePorts, nil); err != nil {
		t.Fatal(err)
	}
	if in := frame(bridgeMAC); !bytes.Equal(second(e.run(e.objs.WeftNodeportPort, in)), in) {
		t.Fatal("a frame of a port no longer in the map was translated")
	}
}

// TestClosedFlowsLeave: a TCP flow's entries go once it is closed, at the
// last ACK after both FINs or at a reset, from either side; an open flow's
// stay, and its reply entry, once evicted, is written again by the
// client's next packet.
func TestClosedFlowsLeave(t *testing.T) {
	const fin, rst, ack = 0x01, 0x04, 0x10
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{nodePort(nodeIP, 30080): {Masquerade: true, Backends: backends(ext(podX, 80))}})
	count := func() (int, int) {
		n := func(m *ebpf.Map) int {
			var k nodeportTuple
			var v []byte
			c := 0
			for it := m.Iterate(); it.Next(&k, &v); {
				c++
			}
			return c
		}
		return n(e.objs.WeftCt), n(e.objs.WeftNatRev)
	}
	want := func(ct, rev int, when string) {
		t.Helper()
		if c, r := count(); c != ct || r != rev {
			t.Fatalf("%s: %d conntrack and %d reply entries, want %d and %d", when, c, r, ct, rev)
		}
	}
	front := ext(nodeIP, 30080)
	for i, tc := range []struct {
		name  string
		steps []struct {
			reply bool
			flags byte
		}
	}{
		{"client closes first", []struct {
			reply bool
			flags byte
		}{{false, fin | ack}, {true, fin | ack}, {false, ack}}},
		{"server closes first", []struct {
			reply bool
			flags byte
		}{{true, fin | ack}, {false, fin | ack}, {true, ack}}},
		{"client resets", []struct {
			reply bool
			flags byte
		}{{false, rst}}},
		{"server resets", []struct {
			reply bool
			flags byte
		}{{true, rst | ack}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := ext(client, uint16(41000+i))
			e.run(e.objs.WeftNodeport, packet{src: client, dst: front}.bytes())
			want(1, 1, "after the SYN")
			e.run(e.objs.WeftNodeport, packet{src: client, dst: front, flags: ack}.bytes())
			for j, s := range tc.steps {
				want(1, 1, fmt.Sprintf("before step %d", j+1))
				if s.reply {
					e.run(e.objs.WeftReply, packet{src: ext(podX, 80), dst: client, flags: s.flags}.bytes())
				} else {
					e.run(e.objs.WeftNodeport, packet{src: client, dst: front, flags: s.flags}.bytes())
				}
			}
			want(0, 0, "once closed")
		})
	}
	// An open flow whose reply entry was evicted gets it back.
	c := ext(client, 42000)
	e.run(e.objs.WeftNodeport, packet{src: c, dst: front}.bytes())
	rk := nodeportTuple{Saddr: toWords(podX), Daddr: toWords(client), Sport: htons(80), Dport: htons(42000), Proto: 6}
	if err := e.objs.WeftNatRev.Delete(rk); err != nil {
		t.Fatal(err)
	}
	e.run(e.objs.WeftNodeport, packet{src: c, dst: front, flags: ack}.bytes())
	if back := second(e.run(e.objs.WeftReply, packet{src: ext(podX, 80), dst: c, flags: ack}.bytes())); parsePacket(t, back).src != front {
		t.Fatalf("the reply after the eviction left from %s, want %s", parsePacket(t, back).src, front)
	}
}

// TestAffinityTimeout: with ClientIP affinity, a client's new flows from
// outside go to the backend of its last one while the timeout runs and
// that backend stays; a remembered backend whose timeout has passed is
// not used: the flow is balanced (by its 5-tuple) and remembered anew.
// The expiry is made by writing an aged entry (bpf_ktime_get_ns is
// CLOCK_MONOTONIC), so no test waits for a clock.
func TestAffinityTimeout(t *testing.T) {
	e := newTCEnv(t)
	three := backends(ext(podX, 80), ext(podY, 80), ext(netip.MustParseAddr("10.250.1.4"), 80))
	front := nodePort(nodeIP, 30080)
	const timeout = 3600
	e.program(map[FrontendKey]Frontend{front: {AffinitySeconds: timeout, Backends: three}})
	to := func(sport uint16) netip.AddrPort {
		return parsePacket(t, second(e.run(e.objs.WeftNodeport, packet{src: ext(client, sport), dst: ext(nodeIP, 30080)}.bytes()))).dst
	}
	first := to(40000)
	for sport := uint16(40001); sport < 40020; sport++ {
		if got := to(sport); got != first {
			t.Fatalf("flow from port %d went to %s, the client's first to %s", sport, got, first)
		}
	}
	// The remembered backend leaves: the next flow goes elsewhere, and
	// stays there.
	var rest []netip.AddrPort
	for _, b := range three {
		if b != first {
			rest = append(rest, b)
		}
	}
	e.program(map[FrontendKey]Frontend{front: {AffinitySeconds: timeout, Backends: rest}})
	next := to(41000)
	if next == first {
		t.Fatalf("a new flow went to %s, which left the Service", first)
	}
	for sport := uint16(41001); sport < 41010; sport++ {
		if got := to(sport); got != next {
			t.Fatalf("flow from port %d went to %s, the client's last to %s", sport, got, next)
		}
	}
	// An entry older than the timeout: each flow after it is balanced by
	// its 5-tuple (over 20 flows, not all to the aged entry's backend: 1
	// in 3^20 by chance) and remembered with a fresh time.
	e.program(map[FrontendKey]Frontend{front: {AffinitySeconds: timeout, Backends: three}})
	key := nodeportExtAffinityKey{SvcId: e.w.fronts[front].id, Addr: toWords(client)}
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		t.Fatal(err)
	}
	// On a machine up for less than the timeout this wraps around, as it
	// does in the program's subtraction: still an entry timeout+1 s old.
	aged := uint64(now.Nano()) - (timeout+1)*uint64(time.Second)
	moved := false
	firstID, _ := e.w.backendID(first)
	for sport := uint16(42000); sport < 42020; sport++ {
		if err := e.objs.WeftExtAffinity.Put(key, nodeportExtAffinityValue{LastNs: aged, BackendId: firstID}); err != nil {
			t.Fatal(err)
		}
		got := to(sport)
		moved = moved || got != first
		var v nodeportExtAffinityValue
		if err := e.objs.WeftExtAffinity.Lookup(key, &v); err != nil {
			t.Fatal(err)
		}
		if v.LastNs < uint64(now.Nano()) || e.w.backendAddr(v.BackendId) != got {
			t.Fatalf("after an expired entry, the client's entry holds %s from %d, want %s from %d or later", e.w.backendAddr(v.BackendId), v.LastNs, got, now.Nano())
		}
	}
	if !moved {
		t.Fatalf("20 flows after an expired entry all went to its backend %s", first)
	}
}
