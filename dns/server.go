package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"syscall"

	mdns "github.com/miekg/dns"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// Server serves a Handler over UDP and TCP.
type Server struct {
	h       *Handler
	log     *slog.Logger
	soaWire []byte // the zone's SOA record, packed, for fast NXDOMAIN
	// Sockets is the number of SO_REUSEPORT UDP sockets (default GOMAXPROCS).
	Sockets int
	// MaxInflight bounds concurrent general-path UDP queries (default 1024);
	// beyond it queries are dropped and the client retries.
	MaxInflight int

	mu    sync.Mutex
	udp   []*net.UDPConn
	tcp   *mdns.Server
	tcpLn net.Listener
}

// NewServer returns a server for h.
func NewServer(h *Handler, log *slog.Logger) *Server {
	buf := make([]byte, 512)
	n, err := mdns.PackRR(h.Index.SOA(), buf, 0, nil, false)
	if err != nil {
		panic(fmt.Sprintf("packing the zone SOA: %v", err)) // a constant record
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{h: h, log: log, soaWire: buf[:n]}
}

// Listen opens the UDP sockets and the TCP listener on addr (host:port;
// port 0 picks one port for both).
func (s *Server) Listen(addr string) error {
	n := s.Sockets
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		return errors.Join(err, serr)
	}}
	first, err := lc.ListenPacket(context.Background(), "udp", addr)
	if err != nil {
		return fmt.Errorf("listening on udp %s: %w", addr, err)
	}
	s.udp = append(s.udp, first.(*net.UDPConn))
	addr = first.LocalAddr().String()
	for i := 1; i < n; i++ {
		c, err := lc.ListenPacket(context.Background(), "udp", addr)
		if err != nil {
			s.Close()
			return fmt.Errorf("listening on udp %s: %w", addr, err)
		}
		s.udp = append(s.udp, c.(*net.UDPConn))
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.Close()
		return fmt.Errorf("listening on tcp %s: %w", addr, err)
	}
	s.tcpLn = ln
	return nil
}

// Addr returns the address served (after Listen).
func (s *Server) Addr() string { return s.udp[0].LocalAddr().String() }

// Serve answers until Close; it returns after every socket is closed.
func (s *Server) Serve() {
	var wg sync.WaitGroup
	inflight := s.MaxInflight
	if inflight <= 0 {
		inflight = 1024
	}
	sem := make(chan struct{}, inflight)
	for _, c := range s.udp {
		wg.Go(func() { s.serveUDPBatch(c, sem) })
	}
	s.mu.Lock()
	s.tcp = &mdns.Server{
		Listener:      s.tcpLn,
		Handler:       mdns.HandlerFunc(s.serveTCP),
		MsgAcceptFunc: func(mdns.Header) mdns.MsgAcceptAction { return mdns.MsgAccept },
	}
	srv := s.tcp
	s.mu.Unlock()
	wg.Go(func() {
		if err := srv.ActivateAndServe(); err != nil {
			s.log.Debug("tcp server stopped", "err", err)
		}
	})
	wg.Wait()
}

// Close stops serving.
func (s *Server) Close() {
	for _, c := range s.udp {
		c.Close()
	}
	s.mu.Lock()
	srv := s.tcp
	s.mu.Unlock()
	// Shutdown fails for a server not started yet: then closing the
	// listener makes ActivateAndServe return.
	if srv == nil || srv.Shutdown() != nil {
		if s.tcpLn != nil {
			s.tcpLn.Close()
		}
	}
}

func (s *Server) serveTCP(w mdns.ResponseWriter, req *mdns.Msg) {
	s.h.Metrics.query(true)
	if err := w.WriteMsg(s.h.Resolve(context.Background(), req, true)); err != nil {
		s.log.Debug("writing tcp reply", "err", err)
	}
}

// Answer answers one query packet as the server would (fast path first,
// then the general path). It returns nil when the packet must be dropped
// (too short to have a header, or itself a reply).
func (s *Server) Answer(pkt []byte, tcp bool) []byte {
	if !tcp {
		if r := s.fastReply(pkt, make([]byte, 0, 4096)); r != nil {
			return r
		}
	}
	req := new(mdns.Msg)
	if err := req.Unpack(pkt); err != nil {
		return formErr(pkt)
	}
	if req.Response {
		return nil // never answer a reply: no reflection loops
	}
	b, err := s.h.Resolve(context.Background(), req, tcp).Pack()
	if err != nil {
		s.log.Debug("packing reply", "err", err)
		return formErr(pkt)
	}
	return b
}

// formErr is FORMERR for a packet that does not unpack: the header only,
// with its ID and opcode. Packets shorter than a header, or replies, get
// nothing.
func formErr(pkt []byte) []byte {
	if len(pkt) < 12 || pkt[2]&0x80 != 0 {
		return nil
	}
	out := make([]byte, 12)
	copy(out, pkt[:2])
	out[2] = 0x80 | pkt[2]&0x79 // QR, opcode, RD
	out[3] = mdns.RcodeFormatError
	binary.BigEndian.PutUint16(out[4:], 0)
	return out
}

// batchSize is how many datagrams one recvmmsg/sendmmsg call moves at most.
const batchSize = 32

// serveUDPBatch reads up to batchSize queries per system call (recvmmsg),
// answers the fast-path ones into per-slot buffers and sends those replies
// with one sendmmsg; the others go to the general path (general).
func (s *Server) serveUDPBatch(c *net.UDPConn, sem chan struct{}) {
	pc := ipv6.NewPacketConn(c) // the batch calls are the same for both families
	in := make([]ipv6.Message, batchSize)
	out := make([]ipv6.Message, batchSize)
	bufs := make([][]byte, batchSize)
	replies := make([][]byte, batchSize)
	for i := range in {
		bufs[i] = make([]byte, 65536)
		replies[i] = make([]byte, 0, 4096)
		in[i].Buffers = [][]byte{bufs[i]}
		out[i].Buffers = [][]byte{nil}
	}
	for {
		n, err := pc.ReadBatch(in, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		k := 0
		for i := range n {
			s.h.Metrics.query(false)
			pkt := bufs[i][:in[i].N]
			if r := s.fastReply(pkt, replies[i]); r != nil {
				out[k].Buffers[0], out[k].Addr = r, in[i].Addr
				k++
				continue
			}
			s.general(c, pkt, in[i].Addr, sem)
		}
		for sent := 0; sent < k; {
			m, err := pc.WriteBatch(out[sent:k], 0)
			if err != nil || m == 0 {
				break
			}
			sent += m
		}
	}
}

// general answers pkt from addr on a goroutine of its own, at most
// cap(sem) at once; beyond that the query is dropped and the client retries.
func (s *Server) general(c *net.UDPConn, pkt []byte, addr net.Addr, sem chan struct{}) {
	select {
	case sem <- struct{}{}:
	default:
		return
	}
	pkt = append([]byte(nil), pkt...)
	go func() {
		defer func() { <-sem }()
		if r := s.Answer(pkt, false); r != nil {
			_, _ = c.WriteTo(r, addr)
		}
	}()
}
