package main

import (
	"encoding/binary"
	"math"
	"net"
	"net/netip"
	"testing"
	"time"
)

var (
	testDst = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	testSrc = net.HardwareAddr{0x02, 0, 0, 0, 0, 2}
)

// sumOK reports whether the ones'-complement sum of b (with initial)
// folds to 0xffff: what a receiver checks.
func sumOK(b []byte, initial uint32) bool { return checksum(b, initial) == 0 }

func TestFrameChecksums(t *testing.T) {
	for _, size := range []int{minFrame, 61, 64, 128, 511, maxFrame} {
		for _, sport := range []uint16{sportMin, sportMin + 1, 65535} {
			f := flowFrame{dstMAC: testDst, srcMAC: testSrc, src: genUplinkIP, dst: node1IP, sport: sport, dport: nodePort, size: size, nonce: 0x0102030405060708}
			b, err := f.build()
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != size {
				t.Fatalf("size %d: built %d bytes", size, len(b))
			}
			ip := b[ethLen : ethLen+ipv4Len]
			if !sumOK(ip, 0) {
				t.Errorf("size %d sport %d: IPv4 header checksum %#04x does not verify", size, sport, binary.BigEndian.Uint16(ip[10:12]))
			}
			if got := int(binary.BigEndian.Uint16(ip[2:4])); got != size-ethLen {
				t.Errorf("IPv4 total length %d, want %d", got, size-ethLen)
			}
			udp := b[ethLen+ipv4Len:]
			if c := binary.BigEndian.Uint16(udp[6:8]); c == 0 {
				t.Errorf("UDP checksum 0 (none)")
			}
			if !sumOK(udp, pseudoSum(genUplinkIP.As4(), node1IP.As4(), len(udp))) {
				t.Errorf("size %d sport %d: UDP checksum does not verify", size, sport)
			}
			p, ok := parseIPv4(b[ethLen:], f.nonce)
			if !ok || !p.ours || p.sport != sport || p.dport != nodePort || p.src != genUplinkIP || p.dst != node1IP {
				t.Errorf("parsed %+v, %v", p, ok)
			}
			if p, _ := parseIPv4(b[ethLen:], f.nonce+1); p.ours {
				t.Error("another run's nonce taken for this run's")
			}
		}
	}
}

// TestChecksumKnown checks the checksum against RFC 1071's worked example.
func TestChecksumKnown(t *testing.T) {
	// RFC 1071 section 3: the sum of 0001 f203 f4f5 f6f7 is 0xddf2 (folded).
	b := []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}
	if got := checksum(b, 0); got != ^uint16(0xddf2) {
		t.Errorf("checksum %#04x, want %#04x", got, ^uint16(0xddf2))
	}
}

func TestFrameBadSizes(t *testing.T) {
	for _, size := range []int{minFrame - 1, maxFrame + 1} {
		f := flowFrame{dstMAC: testDst, srcMAC: testSrc, src: genUplinkIP, dst: node1IP, size: size}
		if _, err := f.build(); err == nil {
			t.Errorf("size %d built", size)
		}
	}
	f := flowFrame{dstMAC: testDst, srcMAC: testSrc, src: netip.MustParseAddr("::1"), dst: node1IP, size: 64}
	if _, err := f.build(); err == nil {
		t.Error("an IPv6 source built")
	}
}

func TestFigures(t *testing.T) {
	// Baseline: 1,000,000 packets for 200 ms of pipeline CPU: 200 ns each.
	// Forward: 500,000 sent in 1 s for 600 ms (500 ms generator, 100 ms
	// ksoftirqd): 100 ms of it is sending (500,000 × 200 ns), 500 ms the
	// node's, over 400,000 forwarded (300,000 local): 1250 ns each.
	p := pair{
		base: run{gen: genResult{Sent: 1_000_000, Elapsed: time.Second, CPU: 150 * time.Millisecond}, softirqd: 50 * time.Millisecond},
		fwd: run{gen: genResult{Sent: 500_000, Elapsed: time.Second, CPU: 500 * time.Millisecond}, softirqd: 100 * time.Millisecond,
			arrived: 500_000, fwd: []uint64{200_000, 100_000, 60_000, 40_000}, busy: 1500 * time.Millisecond, proxyCPU: 100 * time.Millisecond},
	}
	f, ok := figuresOf(p, []bool{true, true, false, false})
	if !ok {
		t.Fatal("no figures")
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("offered", f.offeredPPS, 500_000)
	near("arrived", f.arrivedPPS, 500_000)
	near("forwarded", f.forwardedPPS, 400_000)
	near("delivered", f.delivered, 0.8)
	near("local share", f.localShare, 0.75)
	near("sender ns", f.senderNs, 200)
	near("pipeline ns", f.pipelineNs, 1200)
	near("node ns", f.nodeNs, 1250)
	near("per core", f.perCore(), 800_000)
	near("proxy cores", f.proxyCores, 0.1)
	near("other cores", f.otherCores, 0.8)

	if _, ok := figuresOf(pair{}, nil); ok {
		t.Error("figures of empty runs")
	}
}

func TestMedians(t *testing.T) {
	m := medians([]figures{{nodeNs: 3}, {nodeNs: 1}, {nodeNs: 2}})
	if m.nodeNs != 2 {
		t.Errorf("median of 3 = %v", m.nodeNs)
	}
	m = medians([]figures{{nodeNs: 4}, {nodeNs: 1}})
	if m.nodeNs != 2.5 {
		t.Errorf("median of 2 = %v", m.nodeNs)
	}
}

func TestPlan(t *testing.T) {
	pods := plan(2, 3)
	want := []struct {
		name  string
		ip    string
		local bool
	}{{"l0", "10.244.1.2", true}, {"l1", "10.244.1.3", true}, {"r0", "10.244.2.2", false}, {"r1", "10.244.2.3", false}, {"r2", "10.244.2.4", false}}
	if len(pods) != len(want) {
		t.Fatalf("%d pods", len(pods))
	}
	for i, w := range want {
		if p := pods[i]; p.name != w.name || p.ip.String() != w.ip || p.local != w.local {
			t.Errorf("pod %d: %+v, want %+v", i, p, w)
		}
	}
}
