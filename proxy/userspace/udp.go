package userspace

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// udpSocket is one listening UDP socket that learns the local address of
// each datagram (IP_PKTINFO) and answers from it: a reply to a redirected
// datagram must leave from the address the REDIRECT chose, or conntrack
// would not translate it back to the frontend.
type udpSocket struct {
	conn *net.UDPConn
	p4   *ipv4.PacketConn
	p6   *ipv6.PacketConn
}

func newUDPSocket(c *net.UDPConn, is6 bool) (*udpSocket, error) {
	s := &udpSocket{conn: c}
	if is6 {
		s.p6 = ipv6.NewPacketConn(c)
		return s, s.p6.SetControlMessage(ipv6.FlagDst, true)
	}
	s.p4 = ipv4.NewPacketConn(c)
	return s, s.p4.SetControlMessage(ipv4.FlagDst, true)
}

// read returns a datagram, the address it was sent to and its sender.
func (s *udpSocket) read(buf []byte) (int, netip.Addr, netip.AddrPort, error) {
	var n int
	var dst net.IP
	var from net.Addr
	var err error
	if s.p6 != nil {
		var cm *ipv6.ControlMessage
		n, cm, from, err = s.p6.ReadFrom(buf)
		if cm != nil {
			dst = cm.Dst
		}
	} else {
		var cm *ipv4.ControlMessage
		n, cm, from, err = s.p4.ReadFrom(buf)
		if cm != nil {
			dst = cm.Dst
		}
	}
	if err != nil {
		return 0, netip.Addr{}, netip.AddrPort{}, err
	}
	local, _ := netip.AddrFromSlice(dst)
	return n, local.Unmap(), addrPort(from), nil
}

// write sends b to to, from local (when valid).
func (s *udpSocket) write(b []byte, local netip.Addr, to netip.AddrPort) error {
	dst := net.UDPAddrFromAddrPort(to)
	var src net.IP
	if local.IsValid() && !local.IsUnspecified() {
		src = local.AsSlice()
	}
	if s.p6 != nil {
		var cm *ipv6.ControlMessage
		if src != nil {
			cm = &ipv6.ControlMessage{Src: src}
		}
		_, err := s.p6.WriteTo(b, cm, dst)
		return err
	}
	var cm *ipv4.ControlMessage
	if src != nil {
		cm = &ipv4.ControlMessage{Src: src}
	}
	_, err := s.p4.WriteTo(b, cm, dst)
	return err
}

// readLoop serves the datagrams of one socket until it is closed.
func (l *listener) readLoop(s *udpSocket) {
	buf := make([]byte, 65535)
	for {
		n, local, from, err := s.read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // e.g. an ICMP error reported on the socket
		}
		if sess := l.session(s, sessionKey{from, local}); sess != nil {
			sess.send(buf[:n])
		}
	}
}

// sessionKey is a client's address and port and the address it sent to.
type sessionKey struct {
	client netip.AddrPort
	local  netip.Addr
}

// session is one client's flow to one endpoint: a connected UDP socket,
// whose replies go back to the client through the listening socket.
type session struct {
	l    *listener
	sock *udpSocket
	key  sessionKey
	last atomic.Int64 // unix nanoseconds of the last datagram either way

	mu      sync.Mutex
	up      *net.UDPConn
	ep      netip.AddrPort
	order   []netip.AddrPort // the endpoints to try, in order; ep is order[next-1]
	next    int
	pending []byte // the client's last datagram while no reply came
	replied bool
	closed  bool
}

// session returns the client's session, starting one if it has none; nil
// when the datagram is to be dropped (over the session limit, no endpoint,
// the listener closing).
func (l *listener) session(s *udpSocket, k sessionKey) *session {
	l.smu.Lock()
	defer l.smu.Unlock()
	if sess, ok := l.sessions[k]; ok {
		return sess
	}
	b := l.b
	if l.closed {
		return nil
	}
	spec := l.spec.Load()
	local := k.local
	if !local.IsValid() {
		local = l.b.addrs[0]
	}
	eps := l.endpointsFor(spec, local, k.client.Addr())
	if len(eps) == 0 {
		b.metrics.rejected("UDP", "no_endpoint")
		return nil
	}
	if !b.udpLimit.acquire() {
		b.metrics.rejected("UDP", "limit")
		return nil
	}
	sess := &session{l: l, sock: s, key: k, order: l.pick.order(k.client.Addr(), eps, spec.Affinity)}
	sess.last.Store(time.Now().UnixNano())
	if !sess.connectNext() {
		b.udpLimit.release()
		b.metrics.rejected("UDP", "unreachable")
		return nil
	}
	l.pick.chose(k.client.Addr(), sess.ep, spec.Affinity)
	l.sessions[k] = sess
	b.metrics.sessions.Inc()
	b.metrics.sessionsTotal.Inc()
	go sess.replies()
	return sess
}

// connectNext connects the session to the next endpoint of its order that
// takes a socket; s.mu is held or s is not shared yet.
func (s *session) connectNext() bool {
	for s.next < len(s.order) {
		ep := s.order[s.next]
		s.next++
		up, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ep))
		if err != nil {
			s.l.b.metrics.endpointFailures.WithLabelValues("UDP").Inc()
			continue
		}
		if s.up != nil {
			_ = s.up.Close()
		}
		s.up, s.ep = up, ep
		return true
	}
	return false
}

func (s *session) endpoint() netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ep
}

// send forwards one datagram of the client to the endpoint.
func (s *session) send(b []byte) {
	s.last.Store(time.Now().UnixNano())
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	if !s.replied {
		s.pending = append(s.pending[:0], b...)
	}
	up := s.up
	_, err := up.Write(b)
	s.mu.Unlock()
	if refused(err) && !s.failover(up) {
		s.close()
	}
}

// failover moves a session that got no reply yet from an endpoint that
// refused (ICMP port unreachable on the connected socket) to the next
// endpoint, and sends it the client's last datagram again. It reports
// whether the session goes on; up is the socket that failed.
func (s *session) failover(up *net.UDPConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if up != s.up {
		return true // already moved
	}
	s.l.b.metrics.endpointFailures.WithLabelValues("UDP").Inc()
	if s.replied || !s.connectNext() {
		return false
	}
	if s.pending != nil {
		_, _ = s.up.Write(s.pending)
	}
	return true
}

// replies copies the endpoint's datagrams to the client until the session
// ends: idle for the timeout, closed, or its endpoint refusing with no
// other to go to.
func (s *session) replies() {
	defer s.close()
	timeout := s.l.b.cfg.UDPIdleTimeout
	buf := make([]byte, 65535)
	for {
		s.mu.Lock()
		up, closed := s.up, s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		_ = up.SetReadDeadline(time.Unix(0, s.last.Load()).Add(timeout))
		n, err := up.Read(buf)
		switch {
		case err == nil:
			s.last.Store(time.Now().UnixNano())
			s.mu.Lock()
			s.replied, s.pending = true, nil
			s.mu.Unlock()
			_ = s.sock.write(buf[:n], s.key.local, s.key.client)
		case errors.Is(err, os.ErrDeadlineExceeded):
			if time.Since(time.Unix(0, s.last.Load())) >= timeout {
				return
			}
		case refused(err):
			if !s.failover(up) {
				return
			}
		case errors.Is(err, net.ErrClosed):
			// closed, or replaced by failover: the loop looks again
		default:
			return
		}
	}
}

// close ends the session and frees its place; it may be called again.
func (s *session) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	_ = s.up.Close()
	s.mu.Unlock()
	l := s.l
	l.smu.Lock()
	if l.sessions[s.key] == s {
		delete(l.sessions, s.key)
	}
	l.smu.Unlock()
	l.b.udpLimit.release()
	l.b.metrics.sessions.Dec()
}

func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
