package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// The generator's frames: Ethernet, IPv4 (20 bytes, no options, DF
// clear, TTL 64), UDP, and a payload that starts with magic and the run's
// nonce, so that a backend can tell the generator's packets from any other.
const (
	ethLen     = 14
	ipv4Len    = 20
	udpLen     = 8
	magic      = "WEFTPKT\x00"
	payloadMin = len(magic) + 8 // magic + nonce
	minFrame   = 60             // the Ethernet minimum without the FCS
	maxFrame   = ethLen + 1500  // one MTU of 1500
)

// flowFrame is one flow's frame: src:sport -> dst:dport, size bytes in all
// (Ethernet header included, FCS not), checksums filled in.
type flowFrame struct {
	dstMAC, srcMAC net.HardwareAddr
	src, dst       netip.Addr
	sport, dport   uint16
	size           int
	nonce          uint64
}

// build returns the frame's bytes.
func (f flowFrame) build() ([]byte, error) {
	if f.size < minFrame || f.size > maxFrame {
		return nil, fmt.Errorf("frame size %d: want %d..%d", f.size, minFrame, maxFrame)
	}
	if !f.src.Is4() || !f.dst.Is4() || len(f.dstMAC) != 6 || len(f.srcMAC) != 6 {
		return nil, errors.New("frame: IPv4 addresses and Ethernet MACs needed")
	}
	b := make([]byte, f.size)
	copy(b[0:6], f.dstMAC)
	copy(b[6:12], f.srcMAC)
	binary.BigEndian.PutUint16(b[12:14], 0x0800)

	ip := b[ethLen : ethLen+ipv4Len]
	ipTotal := f.size - ethLen
	ip[0] = 0x45 // version 4, 5 words
	binary.BigEndian.PutUint16(ip[2:4], uint16(ipTotal))
	binary.BigEndian.PutUint16(ip[4:6], f.sport) // an identification that varies per flow
	ip[8] = 64                                   // TTL
	ip[9] = 17                                   // UDP
	src, dst := f.src.As4(), f.dst.As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:12], checksum(ip, 0))

	udp := b[ethLen+ipv4Len:]
	binary.BigEndian.PutUint16(udp[0:2], f.sport)
	binary.BigEndian.PutUint16(udp[2:4], f.dport)
	binary.BigEndian.PutUint16(udp[4:6], uint16(len(udp)))
	copy(udp[udpLen:], magic)
	binary.BigEndian.PutUint64(udp[udpLen+len(magic):], f.nonce)
	c := checksum(udp, pseudoSum(src, dst, len(udp)))
	if c == 0 {
		c = 0xffff // 0 means "no checksum" in IPv4 UDP
	}
	binary.BigEndian.PutUint16(udp[6:8], c)
	return b, nil
}

// pseudoSum is the 32-bit sum of the UDP/IPv4 pseudo-header.
func pseudoSum(src, dst [4]byte, udpLength int) uint32 {
	var s uint32
	for _, a := range [][4]byte{src, dst} {
		s += uint32(a[0])<<8 | uint32(a[1])
		s += uint32(a[2])<<8 | uint32(a[3])
	}
	return s + 17 + uint32(udpLength)
}

// checksum is the Internet checksum (RFC 1071) of b, starting from the
// partial sum initial; the checksum field in b must be zero.
func checksum(b []byte, initial uint32) uint16 {
	s := initial
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// genPacket is what a backend's capture says of one IPv4 packet.
type genPacket struct {
	src, dst     netip.Addr
	proto        byte
	sport, dport uint16
	ours         bool // UDP, and the payload carries magic and the run's nonce
}

// parseIPv4 reads an IPv4 packet (from its IP header on) and tells
// whether it is one of the generator's of this run (nonce). ok is false
// when b is not an IPv4 packet.
func parseIPv4(b []byte, nonce uint64) (p genPacket, ok bool) {
	if len(b) < ipv4Len || b[0]>>4 != 4 {
		return p, false
	}
	hl := int(b[0]&0x0f) * 4
	if hl < ipv4Len || len(b) < hl {
		return p, false
	}
	p.src = netip.AddrFrom4([4]byte(b[12:16]))
	p.dst = netip.AddrFrom4([4]byte(b[16:20]))
	p.proto = b[9]
	if b[9] != 17 || len(b) < hl+udpLen+payloadMin {
		return p, true
	}
	udp := b[hl:]
	p.sport = binary.BigEndian.Uint16(udp[0:2])
	p.dport = binary.BigEndian.Uint16(udp[2:4])
	pl := udp[udpLen:]
	p.ours = bytes.HasPrefix(pl, []byte(magic)) && binary.BigEndian.Uint64(pl[len(magic):]) == nonce
	return p, true
}
