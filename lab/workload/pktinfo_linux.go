//go:build linux

package workload

import (
	"net"
	"net/netip"
	"syscall"
	"unsafe"
)

// oobSize holds one IPv4 and one IPv6 packet-info control message.
var oobSize = syscall.CmsgSpace(syscall.SizeofInet4Pktinfo) + syscall.CmsgSpace(syscall.SizeofInet6Pktinfo)

// enablePktinfo asks the kernel to report each datagram's destination
// address, so a socket bound to a wildcard address can answer from the
// address the client sent to rather than from whichever address routing
// prefers. On a dual-stack socket both options apply: IPv4 datagrams carry
// IP_PKTINFO, IPv6 ones IPV6_PKTINFO. It reports whether either took.
func enablePktinfo(c *net.UDPConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var ok4, ok6 bool
	rc.Control(func(fd uintptr) {
		ok4 = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_PKTINFO, 1) == nil
		ok6 = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IPV6, syscall.IPV6_RECVPKTINFO, 1) == nil
	})
	return ok4 || ok6
}

// replyPktinfo turns the control messages received with a datagram into
// the control message that sends the reply from the datagram's destination
// address, or nil if there is none or that address cannot be a source.
func replyPktinfo(oob []byte) []byte {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == syscall.IPPROTO_IP && m.Header.Type == syscall.IP_PKTINFO &&
			len(m.Data) >= syscall.SizeofInet4Pktinfo:
			// struct in_pktinfo { int ipi_ifindex; struct in_addr ipi_spec_dst, ipi_addr; }
			dst := netip.AddrFrom4([4]byte(m.Data[8:12]))
			if !usableSource(dst) || dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
				return nil
			}
			b := cmsg(syscall.IPPROTO_IP, syscall.IP_PKTINFO, syscall.SizeofInet4Pktinfo)
			// ipi_ifindex 0: routing picks the interface; ipi_spec_dst is
			// the source address.
			a := dst.As4()
			copy(b[syscall.CmsgLen(0)+4:], a[:])
			return b
		case m.Header.Level == syscall.IPPROTO_IPV6 && m.Header.Type == syscall.IPV6_PKTINFO &&
			len(m.Data) >= syscall.SizeofInet6Pktinfo:
			// struct in6_pktinfo { struct in6_addr ipi6_addr; int ipi6_ifindex; }
			dst := netip.AddrFrom16([16]byte(m.Data[0:16]))
			if !usableSource(dst) {
				return nil
			}
			b := cmsg(syscall.IPPROTO_IPV6, syscall.IPV6_PKTINFO, syscall.SizeofInet6Pktinfo)
			d := b[syscall.CmsgLen(0):]
			a := dst.As16()
			copy(d[0:16], a[:])
			// A link-local source only means something on its interface.
			if dst.IsLinkLocalUnicast() {
				copy(d[16:20], m.Data[16:20])
			}
			return b
		}
	}
	return nil
}

func usableSource(a netip.Addr) bool {
	return a.IsValid() && !a.IsUnspecified() && !a.IsMulticast()
}

// cmsg returns a zeroed control message of the given level, type and data
// length, ready for its data to be filled in.
func cmsg(level, typ int32, datalen int) []byte {
	b := make([]byte, syscall.CmsgSpace(datalen))
	h := (*syscall.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level = level
	h.Type = typ
	h.SetLen(syscall.CmsgLen(datalen))
	return b
}
