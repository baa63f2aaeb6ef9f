// Package nflog reads the packets netfilter rules send to an nflog group
// (iptables' NFLOG target, nftables' "log group N"): the rule's prefix
// and the packet's first bytes, from the network namespace the reader
// was opened in. It speaks nfnetlink_log directly: bind the group, ask
// for a copy of each packet's head, read.
package nflog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// nfnetlink_log's constants (linux/netfilter/nfnetlink_log.h).
const (
	subsysULOG     = 4
	msgPacket      = 0
	msgConfig      = 1
	cfgCmd         = 1
	cfgMode        = 2
	cmdBind        = 1
	copyPacket     = 2
	attrPrefix     = 10
	attrPayload    = 9
	nfnlHeaderSize = 4 // struct nfgenmsg
)

// copyRange is how much of each packet the kernel sends: the IP and
// transport headers.
const copyRange = 128

// Reader reads one nflog group. Its socket is in the runtime's poller, so
// Close wakes a Read that waits.
type Reader struct {
	fd   int
	file *os.File
	conn syscall.RawConn
}

// Packet is one logged packet: the rule's prefix and the packet's head,
// from its IP header on.
type Packet struct {
	Prefix  string
	Payload []byte
}

// Open binds group in the calling thread's network namespace.
func Open(group uint16) (*Reader, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("opening an nfnetlink socket: %w", err)
	}
	r := &Reader{fd: fd}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		r.Close()
		return nil, fmt.Errorf("binding the nfnetlink socket: %w", err)
	}
	mode := make([]byte, 6) // struct nfulnl_msg_config_mode
	binary.BigEndian.PutUint32(mode, copyRange)
	mode[4] = copyPacket
	for i, attr := range []struct {
		typ  uint16
		data []byte
	}{{cfgCmd, []byte{cmdBind}}, {cfgMode, mode}} {
		if err := r.config(group, uint32(i+1), attr.typ, attr.data); err != nil {
			r.Close()
			return nil, fmt.Errorf("nflog group %d: %w", group, err)
		}
	}
	// Configured (blocking, acknowledged); now read through the poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		r.Close()
		return nil, err
	}
	r.file = os.NewFile(uintptr(fd), "nflog")
	conn, err := r.file.SyscallConn()
	if err != nil {
		r.Close()
		return nil, err
	}
	r.conn = conn
	return r, nil
}

// config sends one configuration message for group and reads its ack.
func (r *Reader) config(group uint16, seq uint32, typ uint16, data []byte) error {
	msg := make([]byte, unix.SizeofNlMsghdr+nfnlHeaderSize)
	binary.NativeEndian.PutUint16(msg[4:], subsysULOG<<8|msgConfig)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], seq)
	nf := msg[unix.SizeofNlMsghdr:]
	nf[0] = unix.AF_UNSPEC
	binary.BigEndian.PutUint16(nf[2:], group)
	msg = appendAttr(msg, typ, data)
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	if err := unix.Sendto(r.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(r.fd, buf, 0)
	if err != nil {
		return err
	}
	if n < unix.SizeofNlMsghdr+4 || binary.NativeEndian.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return errors.New("no acknowledgment")
	}
	if errno := unix.Errno(-int32(binary.NativeEndian.Uint32(buf[unix.SizeofNlMsghdr:]))); errno != 0 {
		return errno
	}
	return nil
}

func appendAttr(b []byte, typ uint16, data []byte) []byte {
	l := 4 + len(data)
	attr := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(attr[0:], uint16(l))
	binary.NativeEndian.PutUint16(attr[2:], typ)
	copy(attr[4:], data)
	return append(b, attr...)
}

// Read blocks until packets arrive and returns them (a message may hold
// several). It fails once the reader is closed.
func (r *Reader) Read() ([]Packet, error) {
	buf := make([]byte, 65536)
	for {
		var n int
		var err error
		if rerr := r.conn.Read(func(fd uintptr) bool {
			n, _, err = unix.Recvfrom(int(fd), buf, 0)
			return !errors.Is(err, unix.EAGAIN)
		}); rerr != nil {
			return nil, rerr // closed
		}
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
			continue // ENOBUFS: the kernel dropped some; read on
		}
		if err != nil {
			return nil, err
		}
		if out := parseMessages(buf[:n]); len(out) > 0 {
			return out, nil
		}
	}
}

// parseMessages reads the packet messages of a netlink datagram.
func parseMessages(b []byte) []Packet {
	var out []Packet
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(binary.NativeEndian.Uint32(b[0:]))
		if l < unix.SizeofNlMsghdr || l > len(b) {
			break
		}
		typ := binary.NativeEndian.Uint16(b[4:])
		if typ == subsysULOG<<8|msgPacket && l >= unix.SizeofNlMsghdr+nfnlHeaderSize {
			out = append(out, parseAttrs(b[unix.SizeofNlMsghdr+nfnlHeaderSize:l]))
		}
		b = b[(l+3)&^3:]
	}
	return out
}

func parseAttrs(b []byte) Packet {
	var p Packet
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:]))
		typ := binary.NativeEndian.Uint16(b[2:]) & 0x3fff
		if l < 4 || l > len(b) {
			break
		}
		data := b[4:l]
		switch typ {
		case attrPrefix:
			p.Prefix = strings.TrimRight(string(data), "\x00")
		case attrPayload:
			p.Payload = append([]byte(nil), data...)
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return p
}

// Close stops the reader; a Read in progress fails.
func (r *Reader) Close() error {
	if r.file != nil {
		return r.file.Close()
	}
	return unix.Close(r.fd)
}

// Flow is what a logged packet says of its connection.
type Flow struct {
	Src, Dst netip.Addr
	// Protocol is the IP protocol number; Port the destination port (TCP,
	// UDP, SCTP; 0 for others).
	Protocol uint8
	Port     uint16
}

// ParseFlow reads an IPv4 or IPv6 packet's addresses, protocol and
// destination port (IPv6 extension headers are not followed).
func ParseFlow(b []byte) (Flow, bool) {
	var f Flow
	var l4 []byte
	switch {
	case len(b) >= 20 && b[0]>>4 == 4:
		ihl := int(b[0]&0xf) * 4
		if ihl < 20 || len(b) < ihl {
			return f, false
		}
		f.Src, f.Dst, f.Protocol, l4 = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20])), b[9], b[ihl:]
		if binary.BigEndian.Uint16(b[6:])&0x1fff != 0 {
			l4 = nil // a later fragment: no transport header
		}
	case len(b) >= 40 && b[0]>>4 == 6:
		f.Src, f.Dst, f.Protocol, l4 = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40])), b[6], b[40:]
	default:
		return f, false
	}
	switch f.Protocol {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		if len(l4) >= 4 {
			f.Port = binary.BigEndian.Uint16(l4[2:])
		}
	}
	return f, true
}
