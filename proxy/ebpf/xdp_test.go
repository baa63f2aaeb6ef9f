package ebpf

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/weftnet/weft/proxy/model"
)

// weft_nodeport_xdp through BPF_PROG_TEST_RUN, on the maps tc's programs
// use (tcEnv): its verdicts, translations and metadata, and flows going on
// from one hook to the other.

const (
	xdpDrop = 1
	xdpPass = 2
)

// xdpMD is struct xdp_md as the test passes it: no metadata in, the
// offsets of the packet's start (data_meta, data) out.
type xdpMD struct {
	Data, DataEnd, DataMeta uint32
	_                       [3]uint32
}

// runXDP runs weft_nodeport_xdp on pkt; it returns the verdict, the packet
// as the program left it and the metadata word it put in front (0: none).
func (e *tcEnv) runXDP(pkt []byte) (uint32, []byte, uint32) {
	e.t.Helper()
	out := make([]byte, len(pkt)+256)
	var md xdpMD
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: xdpMD{DataEnd: uint32(len(pkt))}, ContextOut: &md}
	ret, err := e.objs.WeftNodeportXdp.Run(opts)
	if err != nil {
		e.t.Fatal(err)
	}
	// The data out starts at the metadata.
	out = opts.DataOut
	var meta uint32
	if n := md.Data - md.DataMeta; n == 4 {
		meta = binary.NativeEndian.Uint32(out[:4])
	} else if n != 0 {
		e.t.Fatalf("%d bytes of metadata, want 0 or 4", n)
	}
	return ret, out[md.Data-md.DataMeta:], meta
}

// xdpStat sums counter i of weft_xdp_stats.
func (e *tcEnv) xdpStat(name string) uint64 {
	e.t.Helper()
	st, err := xdpStats(e.objs.WeftXdpStats)
	if err != nil {
		e.t.Fatal(err)
	}
	return st[name]
}

const (
	metaDone = 0x77656600
	metaMasq = 0x77656601
)

// TestXDPTranslation: eTP Local (TCP, UDP with and without checksum,
// IPv6) is translated at XDP to the local backend, client kept, metadata
// "done"; eTP Cluster the same with metadata "masquerade" (weft_nodeport
// turns it into the mark); the flows' entries are the tc programs': tc's
// weft_reply translates the replies, and tc's weft_nodeport, given the
// flow's packet untranslated (a device whose XDP program went), sends it
// to the backend XDP chose.
func TestXDPTranslation(t *testing.T) {
	e := newTCEnv(t)
	e.program(map[FrontendKey]Frontend{
		nodePort(nodeIP, 30081):  {Backends: backends(ext(podY, 80))},
		nodePort(nodeIP6, 30081): {Backends: backends(ext(podX6, 80))},
		{Addr: nodeIP, Port: 30053, Protocol: model.UDP, External: true}: {Backends: backends(ext(podX, 53))},
		nodePort(nodeIP, 30080): {Masquerade: true, Backends: backends(ext(podX, 80), ext(podY, 80))},
	})
	for _, c := range []struct {
		in   packet
		to   netip.AddrPort
		meta uint32
	}{
		{packet{src: ext(client, 40001), dst: ext(nodeIP, 30081)}, ext(podY, 80), metaDone},
		{packet{src: ext(client6, 40001), dst: ext(nodeIP6, 30081)}, ext(podX6, 80), metaDone},
		{packet{src: ext(client, 40001), dst: ext(nodeIP, 30053), udp: true}, ext(podX, 53), metaDone},
		{packet{src: ext(client, 40002), dst: ext(nodeIP, 30053), udp: true, zeroUDPCsum: true}, ext(podX, 53), metaDone},
		{packet{src: ext(client, 40003), dst: ext(nodeIP, 30080)}, netip.AddrPort{}, metaMasq},
	} {
		verdict, out, meta := e.runXDP(c.in.bytes())
		got := parsePacket(t, out)
		if verdict != xdpPass || got.src != c.in.src || meta != c.meta {
			t.Fatalf("%s -> %s: verdict %d, %s -> %s, metadata %#x; want %d, the client kept, metadata %#x",
				c.in.src, c.in.dst, verdict, got.src, got.dst, meta, xdpPass, c.meta)
		}
		if c.to.IsValid() && got.dst != c.to {
			t.Fatalf("%s -> %s translated to %s, want %s", c.in.src, c.in.dst, got.dst, c.to)
		}
		if !c.to.IsValid() && got.dst != ext(podX, 80) && got.dst != ext(podY, 80) {
			t.Fatalf("%s -> %s translated to %s, want a backend", c.in.src, c.in.dst, got.dst)
		}
		if got.zeroUDPCsum != c.in.zeroUDPCsum {
			t.Fatalf("%s: zero UDP checksum %v became %v", c.in.src, c.in.zeroUDPCsum, got.zeroUDPCsum)
		}
		verdict, back := e.run(e.objs.WeftReply, packet{src: got.dst, dst: got.src, udp: c.in.udp}.bytes())
		if r := parsePacket(t, back); verdict != actOK || r.src != c.in.dst || r.dst != c.in.src {
			t.Fatalf("reply through tc: verdict %d, %s -> %s; want %s -> %s", verdict, r.src, r.dst, c.in.dst, c.in.src)
		}
		_, again, mark := e.runMark(e.objs.WeftNodeport, c.in.bytes(), 0)
		if p := parsePacket(t, again); p.dst != got.dst || (mark != 0) != (c.meta == metaMasq) {
			t.Fatalf("the flow's packet through tc went to %s (mark %#x), XDP sent it to %s", p.dst, mark, got.dst)
		}
	}
	if n := e.xdpStat("translated"); n != 5 {
		t.Fatalf("%d packets counted translated, want 5", n)
	}
}

// TestXDPVerdicts: sources outside a LoadBalancer IP's ranges and eTP
// Local without a local endpoint are dropped at XDP; a frontend without
// endpoints passes untouched (the stack refuses); a DSR frontend's flow
// and a packet with IPv4 options (weft's DSR option) are left untouched
// to tc; non-service traffic passes untouched, uncounted.
func TestXDPVerdicts(t *testing.T) {
	e := newTCEnv(t)
	lb := netip.MustParseAddr("192.0.2.10")
	e.program(map[FrontendKey]Frontend{
		{Addr: lb, Port: 80, Protocol: model.TCP, External: true}: {Masquerade: true,
			Backends: backends(ext(podX, 80)), SourceRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.96/29")}},
		nodePort(nodeIP, 30082): {Verdict: Drop},
		nodePort(nodeIP, 30083): {Verdict: Reject},
		nodePort(nodeIP, 30084): {Masquerade: true, DSR: true, Backends: backends(ext(podX, 80)), Remote: []bool{true}},
	})
	if verdict, _, _ := e.runXDP(packet{src: ext(client, 40000), dst: ext(lb, 80)}.bytes()); verdict != xdpPass {
		t.Fatalf("client in the ranges: verdict %d, want pass", verdict)
	}
	for name, c := range map[string]struct {
		pkt     []byte
		verdict uint32
	}{
		"outside the ranges":       {packet{src: ext(netip.MustParseAddr("203.0.113.200"), 40000), dst: ext(lb, 80)}.bytes(), xdpDrop},
		"eTP Local, none local":    {packet{src: ext(client, 40000), dst: ext(nodeIP, 30082)}.bytes(), xdpDrop},
		"no endpoints":             {packet{src: ext(client, 40000), dst: ext(nodeIP, 30083)}.bytes(), xdpPass},
		"DSR frontend":             {packet{src: ext(client, 40000), dst: ext(nodeIP, 30084)}.bytes(), xdpPass},
		"weft's DSR option":        {withOption(packet{src: ext(client, 40000), dst: ext(nodeIP, 30083)}.bytes(), dsrOption(ext(nodeIP, 30084))), xdpPass},
		"ssh to the node":          {packet{src: ext(client, 40000), dst: ext(nodeIP, 22)}.bytes(), xdpPass},
		"IPv6 to no frontend":      {packet{src: ext(client6, 40000), dst: ext(nodeIP6, 30080)}.bytes(), xdpPass},
		"UDP to a TCP frontend":    {packet{src: ext(client, 40000), dst: ext(nodeIP, 30082), udp: true}.bytes(), xdpPass},
		"a reply of no known flow": {packet{src: ext(podX, 80), dst: ext(client, 40000)}.bytes(), xdpPass},
	} {
		verdict, out, meta := e.runXDP(c.pkt)
		if verdict != c.verdict || (verdict == xdpPass && (!bytes.Equal(out, c.pkt) || meta != 0)) {
			t.Errorf("%s: verdict %d (want %d), changed %v, metadata %#x", name, verdict, c.verdict, !bytes.Equal(out, c.pkt), meta)
		}
	}
	if d, h := e.xdpStat("dropped"), e.xdpStat("handoff"); d != 2 || h != 1 {
		t.Fatalf("counted %d dropped, %d handed off; want 2 and 1 (the DSR frontend)", d, h)
	}
	// tc balances the DSR frontend's flow itself (its fib lookup fails in
	// the test: masqueraded, as with snat).
	if _, out, mark := e.runMark(e.objs.WeftNodeport, packet{src: ext(client, 40000), dst: ext(nodeIP, 30084)}.bytes(), 0); parsePacket(t, out).dst != ext(podX, 80) || mark == 0 {
		t.Fatalf("the DSR frontend's flow through tc: to %s, mark %#x", parsePacket(t, out).dst, mark)
	}
}
