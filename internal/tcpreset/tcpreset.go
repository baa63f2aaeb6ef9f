// Package tcpreset ends established TCP connections at their clients,
// from the node a connection passes through, when the server behind it is
// gone: a client waiting for a reply from a backend that vanished would
// otherwise hang until its own timeout.
//
// A client accepts a reset only at exactly the sequence number it expects
// next (RFC 5961), which the node does not know. So the node asks: it
// sends a SYN on the connection's 4-tuple as if from the server, to which
// the client's TCP answers with an ACK carrying that number (RFC 5961's
// challenge ACK, 4.2); the node captures the answer (or any segment of the
// connection the client sends meanwhile) and sends a reset at its
// acknowledgment number. The client's socket fails with ECONNRESET.
//
// Both packets are sent with packet sockets on the device the route to
// the client leaves by, to the neighbour the route names: they bypass the
// node's netfilter, so they create no conntrack entry of their own and the
// client's answer meets the connection's existing one (which still leads
// to the gone server).
//
// A client on the node itself (a host-network pod, the node's own
// processes) is not behind a device: its socket is aborted in place
// (destroy.go), and fails with ECONNABORTED.
package tcpreset

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Flow is one TCP connection as its client sees it: the client's address
// and port, and the server's (the Service address or node port it
// connected to, not the backend behind it).
type Flow struct {
	Client, Server netip.AddrPort
}

func (f Flow) String() string { return f.Client.String() + " -> " + f.Server.String() }

// Result is what Reset did.
type Result struct {
	// Reset are the flows whose client got a reset at the sequence number
	// it expected.
	Reset []Flow
	// Unanswered are the flows whose client sent nothing within the wait
	// (the client itself is gone, or the connection already closed).
	Unanswered []Flow
	// Aborted are the flows whose client is on the node itself: its socket
	// was destroyed (ECONNABORTED at the client).
	Aborted []Flow
	// Unreachable are the flows whose client this node has no way to
	// reach: no route or neighbour entry for the next hop, or a client on
	// the node whose socket the kernel cannot destroy. Each is named with
	// the reason in Err.
	Unreachable []Flow
	Err         error
}

// challengeRetry is when a flow unanswered so far is asked again: Linux
// sends at most one challenge ACK per socket per 500 ms
// (net.ipv4.tcp_invalid_ratelimit), and the socket may have just sent one.
const challengeRetry = 600 * time.Millisecond

// Reset resets flows at their clients, waiting at most wait for their
// answers. Flows of both families may be mixed.
func Reset(flows []Flow, wait time.Duration) Result {
	var res Result
	if len(flows) == 0 {
		return res
	}
	var ports []uint16
	for _, f := range flows {
		if p := f.Server.Port(); !slices.Contains(ports, p) {
			ports = append(ports, p)
		}
	}
	capture, err := openCapture(ports)
	if err != nil {
		res.Err = err
		res.Unreachable = flows
		return res
	}
	defer unix.Close(capture)
	send, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		res.Err = fmt.Errorf("opening a packet socket to send: %w", err)
		res.Unreachable = flows
		return res
	}
	defer unix.Close(send)

	pending := map[Flow]nextHop{}
	var errs []error
	for _, f := range flows {
		hop, err := route(f.Client.Addr())
		if errors.Is(err, errLocal) {
			switch err := abort(f); {
			case err == nil:
				res.Aborted = append(res.Aborted, f)
			case errors.Is(err, errNoSocket):
				res.Unanswered = append(res.Unanswered, f)
			default:
				res.Unreachable = append(res.Unreachable, f)
				errs = append(errs, fmt.Errorf("%s: %w", f, err))
			}
			continue
		}
		if err == nil {
			err = hop.send(send, segment(f.Server, f.Client, rand.Uint32(), 0, flagSYN))
		}
		if err != nil {
			res.Unreachable = append(res.Unreachable, f)
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
			continue
		}
		pending[f] = hop
	}
	start := time.Now()
	deadline, retried := start.Add(wait), false
	buf := make([]byte, 256)
	for len(pending) > 0 {
		now := time.Now()
		if !now.Before(deadline) {
			break
		}
		if !retried && now.Sub(start) >= challengeRetry {
			retried = true
			for f, hop := range pending {
				_ = hop.send(send, segment(f.Server, f.Client, rand.Uint32(), 0, flagSYN))
			}
		}
		until := deadline
		if r := start.Add(challengeRetry); !retried && r.Before(deadline) {
			until = r
		}
		tv := unix.NsecToTimeval(max(until.Sub(now), time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(capture, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			errs = append(errs, fmt.Errorf("capture timeout: %w", err))
			break
		}
		n, _, err := unix.Recvfrom(capture, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			errs = append(errs, fmt.Errorf("capturing the clients' answers: %w", err))
			break
		}
		seg, ok := parse(buf[:n])
		if !ok || seg.flags&(flagSYN|flagRST) != 0 || seg.flags&flagACK == 0 {
			continue
		}
		f := Flow{Client: seg.src, Server: seg.dst}
		hop, ok := pending[f]
		if !ok {
			continue
		}
		// The acknowledgment number is the next sequence number the client
		// expects: a reset there is in its window, exactly.
		if err := hop.send(send, segment(f.Server, f.Client, seg.ack, seg.seq, flagRST|flagACK)); err != nil {
			errs = append(errs, fmt.Errorf("%s: sending the reset: %w", f, err))
			continue
		}
		delete(pending, f)
		res.Reset = append(res.Reset, f)
	}
	for f := range pending {
		res.Unanswered = append(res.Unanswered, f)
	}
	res.Err = errors.Join(errs...)
	return res
}

// openCapture opens a packet socket receiving, as IP packets, the TCP
// segments that reach any device of the node from elsewhere (not those it
// sends) addressed to one of ports (any port when there are more than
// maxFilterPorts). The filter is in place before the socket is bound to a
// protocol, so nothing else is ever queued on it.
func openCapture(ports []uint16) (int, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening a packet socket to capture: %w", err)
	}
	prog, err := bpf.Assemble(captureFilter(ports))
	if err == nil {
		filter := make([]unix.SockFilter, len(prog))
		for i, in := range prog {
			filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
		}
		err = unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]})
	}
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL)})
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("setting up the capture socket: %w", err)
	}
	return fd, nil
}

// maxFilterPorts bounds the destination ports the capture filter checks.
const maxFilterPorts = 64

// captureFilter is the capture socket's classic BPF program (the packet
// starts at its IP header): incoming, IPv4 (unfragmented) or IPv6, TCP,
// to one of ports.
func captureFilter(ports []uint16) []bpf.Instruction {
	if len(ports) > maxFilterPorts {
		ports = nil
	}
	// The fixed part is 15 instructions; then, without ports, accept and
	// drop; with ports, a check of each (to accept), drop and accept.
	const fixed = 15
	drop, accept := fixed+1, fixed
	if len(ports) > 0 {
		drop, accept = fixed+len(ports), fixed+len(ports)+1
	}
	toDrop := func(at int) uint8 { return uint8(drop - at - 1) }
	prog := []bpf.Instruction{
		bpf.LoadExtension{Num: bpf.ExtType},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.PACKET_OUTGOING, SkipTrue: toDrop(1)},
		bpf.LoadExtension{Num: bpf.ExtProto},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.ETH_P_IP, SkipFalse: 7}, // to 11
		// IPv4: TCP, not a fragment, the port after the header's length.
		bpf.LoadAbsolute{Off: 9, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_TCP, SkipTrue: toDrop(5)},
		bpf.LoadAbsolute{Off: 6, Size: 2},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x1fff, SkipTrue: toDrop(7)},
		bpf.LoadMemShift{Off: 0},
		bpf.LoadIndirect{Off: 2, Size: 2},
		bpf.Jump{Skip: 4}, // to 15
		// IPv6: TCP right after the fixed header.
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.ETH_P_IPV6, SkipFalse: toDrop(11)},
		bpf.LoadAbsolute{Off: 6, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.IPPROTO_TCP, SkipTrue: toDrop(13)},
		bpf.LoadAbsolute{Off: 42, Size: 2},
	}
	if len(ports) == 0 {
		return append(prog, bpf.RetConstant{Val: 256}, bpf.RetConstant{Val: 0})
	}
	for i, p := range ports {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(p), SkipTrue: uint8(accept - (fixed + i) - 1)})
	}
	return append(prog, bpf.RetConstant{Val: 0}, bpf.RetConstant{Val: 256})
}

// nextHop is where a packet to a client leaves: a device, and the link
// address of the neighbour the route names (none on a device without
// link addresses).
type nextHop struct {
	ifindex int
	mac     net.HardwareAddr
	v6      bool
}

// errLocal: the client's address is the node's own.
var errLocal = errors.New("the client is on this node")

// route finds the next hop toward client as the node's routing does.
func route(client netip.Addr) (nextHop, error) {
	routes, err := netlink.RouteGet(client.AsSlice())
	if err != nil || len(routes) == 0 {
		return nextHop{}, fmt.Errorf("no route to the client: %v", err)
	}
	r := routes[0]
	if r.Type == unix.RTN_LOCAL {
		return nextHop{}, errLocal
	}
	l, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return nextHop{}, fmt.Errorf("the route's device: %w", err)
	}
	hop := nextHop{ifindex: r.LinkIndex, v6: client.Is6()}
	if len(l.Attrs().HardwareAddr) == 0 {
		return hop, nil // a layer 3 device (a tunnel): no neighbour
	}
	via := client
	if gw, ok := netip.AddrFromSlice(r.Gw); ok {
		via = gw.Unmap()
	}
	family := unix.AF_INET
	if via.Is6() {
		family = unix.AF_INET6
	}
	neighs, err := netlink.NeighList(r.LinkIndex, family)
	if err != nil {
		return nextHop{}, fmt.Errorf("neighbours of %s: %w", l.Attrs().Name, err)
	}
	for _, n := range neighs {
		ip, ok := netip.AddrFromSlice(n.IP)
		if ok && ip.Unmap() == via && len(n.HardwareAddr) > 0 && n.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) == 0 {
			hop.mac = n.HardwareAddr
			return hop, nil
		}
	}
	return nextHop{}, fmt.Errorf("no neighbour entry for %s on %s", via, l.Attrs().Name)
}

// send sends the IP packet pkt to the next hop.
func (h nextHop) send(fd int, pkt []byte) error {
	proto := uint16(unix.ETH_P_IP)
	if h.v6 {
		proto = unix.ETH_P_IPV6
	}
	sa := &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: h.ifindex, Halen: uint8(len(h.mac))}
	copy(sa.Addr[:], h.mac)
	return unix.Sendto(fd, pkt, 0, sa)
}

// TCP flags.
const (
	flagFIN = 1 << iota
	flagSYN
	flagRST
	flagPSH
	flagACK
)

// tcpSegment is what Reset reads of a captured segment.
type tcpSegment struct {
	src, dst netip.AddrPort
	seq, ack uint32
	flags    uint8
}

// parse reads an IPv4 or IPv6 (no extension headers) TCP segment.
func parse(b []byte) (tcpSegment, bool) {
	var s tcpSegment
	var l4 []byte
	var src, dst netip.Addr
	switch {
	case len(b) >= 20 && b[0]>>4 == 4:
		ihl := int(b[0]&0xf) * 4
		if ihl < 20 || len(b) < ihl+20 || b[9] != unix.IPPROTO_TCP || binary.BigEndian.Uint16(b[6:])&0x1fff != 0 {
			return s, false
		}
		src, dst, l4 = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20])), b[ihl:]
	case len(b) >= 60 && b[0]>>4 == 6:
		if b[6] != unix.IPPROTO_TCP {
			return s, false
		}
		src, dst, l4 = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40])), b[40:]
	default:
		return s, false
	}
	s.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:]))
	s.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:]))
	s.seq, s.ack, s.flags = binary.BigEndian.Uint32(l4[4:]), binary.BigEndian.Uint32(l4[8:]), l4[13]
	return s, true
}

// segment builds an IP packet holding a TCP segment without payload or
// options, with valid checksums.
func segment(src, dst netip.AddrPort, seq, ack uint32, flags uint8) []byte {
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = 5 << 4
	tcp[13] = flags
	if flags&flagRST == 0 {
		binary.BigEndian.PutUint16(tcp[14:], 64240)
	}
	s, d := src.Addr().Unmap(), dst.Addr().Unmap()
	pseudo := append(append([]byte{}, s.AsSlice()...), d.AsSlice()...)
	pseudo = append(pseudo, 0, unix.IPPROTO_TCP, 0, byte(len(tcp)))
	binary.BigEndian.PutUint16(tcp[16:], ^checksum(checksum(0, pseudo), tcp))
	if s.Is4() {
		ip := make([]byte, 20, 20+len(tcp))
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		ip[8], ip[9] = 64, unix.IPPROTO_TCP
		copy(ip[12:], s.AsSlice())
		copy(ip[16:], d.AsSlice())
		binary.BigEndian.PutUint16(ip[10:], ^checksum(0, ip))
		return append(ip, tcp...)
	}
	ip := make([]byte, 40, 40+len(tcp))
	ip[0] = 6 << 4
	binary.BigEndian.PutUint16(ip[4:], uint16(len(tcp)))
	ip[6], ip[7] = unix.IPPROTO_TCP, 64
	copy(ip[8:], s.AsSlice())
	copy(ip[24:], d.AsSlice())
	return append(ip, tcp...)
}

// checksum adds b to the ones' complement sum s, folded.
func checksum(s uint16, b []byte) uint16 {
	sum := uint32(s)
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
