package netpoltest

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

// SpoofUDP sends one UDP datagram from inside the network namespace at
// nsPath with a forged source address, through a raw socket that writes
// its own IP header, as any pod with CAP_NET_RAW (the runtimes' default)
// can.
func SpoofUDP(nsPath string, src, dst netip.Addr, port uint16, payload []byte) error {
	return netnsutil.Do(nsPath, func() error {
		family := unix.AF_INET
		if dst.Is6() {
			family = unix.AF_INET6
		}
		fd, err := unix.Socket(family, unix.SOCK_RAW, unix.IPPROTO_RAW) // IPPROTO_RAW: the header is ours
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		pkt := udpPacket(src, dst, 40000, port, payload)
		var to unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
		if dst.Is4() {
			to = &unix.SockaddrInet4{Addr: dst.As4()}
		}
		if err := unix.Sendto(fd, pkt, 0, to); err != nil {
			return fmt.Errorf("sending from %s to %s: %w", src, dst, err)
		}
		return nil
	})
}

// udpPacket builds an IPv4 or IPv6 packet carrying one UDP datagram.
func udpPacket(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	// Checksum over the pseudo-header (addresses, protocol, length) and
	// the datagram; mandatory over IPv6.
	var pseudo []byte
	pseudo = append(pseudo, src.AsSlice()...)
	pseudo = append(pseudo, dst.AsSlice()...)
	pseudo = append(pseudo, 0, unix.IPPROTO_UDP, byte(len(udp)>>8), byte(len(udp)))
	sum := checksum(append(pseudo, udp...))
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], sum)
	if dst.Is6() {
		h := make([]byte, 40)
		h[0] = 6 << 4
		binary.BigEndian.PutUint16(h[4:], uint16(len(udp)))
		h[6], h[7] = unix.IPPROTO_UDP, 64
		s, d := src.As16(), dst.As16()
		copy(h[8:], s[:])
		copy(h[24:], d[:])
		return append(h, udp...)
	}
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(udp)))
	h[8], h[9] = 64, unix.IPPROTO_UDP
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], checksum(h))
	return append(h, udp...)
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// UDPSink is a UDP socket inside a pod's network namespace that records
// the payloads it receives.
type UDPSink struct{ conn *net.UDPConn }

// ListenUDP opens a UDPSink on port in the namespace at nsPath.
func ListenUDP(nsPath string, port uint16) (*UDPSink, error) {
	var s UDPSink
	err := netnsutil.Do(nsPath, func() error {
		c, err := net.ListenUDP("udp", &net.UDPAddr{Port: int(port)})
		s.conn = c
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on udp port %d in %s: %w", port, nsPath, err)
	}
	return &s, nil
}

// Received returns the payloads that arrive within d, with their sources.
func (s *UDPSink) Received(d time.Duration) map[string]netip.Addr {
	got := map[string]netip.Addr{}
	buf := make([]byte, 2048)
	_ = s.conn.SetReadDeadline(time.Now().Add(d))
	for {
		n, from, err := s.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return got
		}
		got[string(buf[:n])] = from.Addr().Unmap()
	}
}

// Close closes the socket.
func (s *UDPSink) Close() error { return s.conn.Close() }

// ForgedArrives reports whether datagrams that spoofer sends with peer's
// address reach the sink (listening on port in to's namespace). peer's
// own datagrams, sent along, must arrive: an error says the probe could
// not tell. The spoofer first sends one datagram of its own (its
// neighbour lookup needs a source address of its own; IPv6 will not use
// a forged one); a routed forged datagram may wait for the node's
// neighbour entry (over IPv6 the first one was seen to take over 1 s), so
// forged ones keep coming for up to 4 s after the genuine ones arrived (5 s
// in all).
func ForgedArrives(sink *UDPSink, spoofer, peer, to Target, port uint16, tag string) (bool, error) {
	src, err := netip.ParseAddr(peer.IP)
	if err != nil {
		return false, err
	}
	dst, err := netip.ParseAddr(to.IP)
	if err != nil {
		return false, err
	}
	own, err := netip.ParseAddr(spoofer.IP)
	if err != nil {
		return false, err
	}
	forged, genuine := "forged-"+tag, "genuine-"+tag
	if err := SpoofUDP(spoofer.NSPath, own, dst, port, []byte("own-"+tag)); err != nil {
		return false, err
	}
	got := map[string]netip.Addr{}
	for try := 0; try < 50 && got[forged] != src && (got[genuine] != src || try < 40); try++ {
		if err := SpoofUDP(spoofer.NSPath, src, dst, port, []byte(forged)); err != nil {
			return false, err
		}
		if err := SpoofUDP(peer.NSPath, src, dst, port, []byte(genuine)); err != nil {
			return false, err
		}
		for k, v := range sink.Received(100 * time.Millisecond) {
			got[k] = v
		}
	}
	if got[forged] != src && got[genuine] != src {
		return false, fmt.Errorf("%s's own datagrams to %s never arrived (got %v)", src, dst, got)
	}
	return got[forged] == src, nil
}
