package workload

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weftnet/weft/internal/pmtu"
)

// Listener kinds, as passed to Options.Bound.
const (
	KindHTTP    = "http"
	KindTCPEcho = "tcp-echo"
	KindUDPEcho = "udp-echo"
)

// Options configures a workload.
type Options struct {
	// Name is the pod name the workload reports in its replies.
	Name string
	// HTTPAddrs, TCPEchoAddrs and UDPEchoAddrs are the listen addresses
	// (host:port, e.g. ":80", "10.0.0.5:8080", "[::1]:0") for each protocol.
	// Any of them may be empty.
	HTTPAddrs    []string
	TCPEchoAddrs []string
	UDPEchoAddrs []string
	// Bound, if set, is called once per listener with its kind (KindHTTP,
	// KindTCPEcho or KindUDPEcho) and the address it actually bound (port 0
	// resolved), in the order above, after every listener is bound and
	// before ready. It is not called at all if any bind fails.
	Bound func(kind, addr string)
}

// Reply is the JSON document GET / answers with.
type Reply struct {
	Pod        string `json:"pod"`
	Client     string `json:"client"`
	ClientPort int    `json:"clientPort"`
	Host       string `json:"host"`
}

// Run binds every listener in opts, calls ready (if not nil) once they are
// all bound, and serves until ctx is done. It then closes the listeners and
// every open connection, waits for its goroutines, and returns nil.
//
// A bind error is returned at once, naming the address, after closing the
// listeners already bound; ready is not called. An unexpected error while
// serving (a listener failing) stops the workload and is returned.
func Run(ctx context.Context, opts Options, ready func()) error {
	s := &server{
		name:  opts.Name,
		done:  make(chan struct{}),
		errc:  make(chan error, 1),
		conns: make(map[net.Conn]struct{}),
	}
	if err := s.bind(opts); err != nil {
		s.closeListeners()
		return err
	}
	if opts.Bound != nil {
		for _, b := range s.bound {
			opts.Bound(b.kind, b.addr)
		}
	}
	if ready != nil {
		ready()
	}
	s.serve()

	var err error
	select {
	case <-ctx.Done():
	case err = <-s.errc:
	}
	s.shutdown()
	return err
}

type boundAddr struct{ kind, addr string }

type udpListener struct {
	conn    *net.UDPConn
	pktinfo bool // reply from the datagram's destination address
}

type server struct {
	name   string
	httpLn []net.Listener
	tcpLn  []net.Listener
	udp    []udpListener
	bound  []boundAddr
	http   *http.Server

	wg   sync.WaitGroup
	done chan struct{} // closed on shutdown
	errc chan error    // first fatal serving error

	unready atomic.Bool // GET /ready answers 503

	mu      sync.Mutex
	closing bool
	conns   map[net.Conn]struct{} // open TCP echo connections
}

func (s *server) bind(opts Options) error {
	for _, a := range opts.HTTPAddrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("workload: %s listener on %q: %w", KindHTTP, a, err)
		}
		s.httpLn = append(s.httpLn, ln)
		s.bound = append(s.bound, boundAddr{KindHTTP, ln.Addr().String()})
	}
	for _, a := range opts.TCPEchoAddrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("workload: %s listener on %q: %w", KindTCPEcho, a, err)
		}
		s.tcpLn = append(s.tcpLn, ln)
		s.bound = append(s.bound, boundAddr{KindTCPEcho, ln.Addr().String()})
	}
	for _, a := range opts.UDPEchoAddrs {
		pc, err := net.ListenPacket("udp", a)
		if err != nil {
			return fmt.Errorf("workload: %s listener on %q: %w", KindUDPEcho, a, err)
		}
		c := pc.(*net.UDPConn)
		u := udpListener{conn: c}
		if la, ok := c.LocalAddr().(*net.UDPAddr); ok && la.IP.IsUnspecified() {
			u.pktinfo = enablePktinfo(c)
		}
		s.udp = append(s.udp, u)
		s.bound = append(s.bound, boundAddr{KindUDPEcho, c.LocalAddr().String()})
	}
	return nil
}

func (s *server) closeListeners() {
	for _, ln := range s.httpLn {
		ln.Close()
	}
	for _, ln := range s.tcpLn {
		ln.Close()
	}
	for _, u := range s.udp {
		u.conn.Close()
	}
}

// serve starts one goroutine per listener.
func (s *server) serve() {
	s.http = &http.Server{
		Handler:           s.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	for _, ln := range s.httpLn {
		s.goServe(func() error {
			err := s.http.Serve(ln)
			if errors.Is(err, http.ErrServerClosed) {
				return nil
			}
			return fmt.Errorf("workload: serving %s on %s: %w", KindHTTP, ln.Addr(), err)
		})
	}
	for _, ln := range s.tcpLn {
		s.goServe(func() error { return s.serveTCPEcho(ln) })
	}
	for _, u := range s.udp {
		s.goServe(func() error { return s.serveUDPEcho(u) })
	}
}

func (s *server) goServe(f func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := f(); err != nil && !s.isClosing() {
			select {
			case s.errc <- err:
			default:
			}
		}
	}()
}

func (s *server) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

func (s *server) shutdown() {
	s.mu.Lock()
	s.closing = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	close(s.done)

	s.closeListeners()
	// Our handlers answer at once, so this only waits for requests already
	// being read; idle keep-alive connections are closed immediately.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if s.http.Shutdown(ctx) != nil {
		s.http.Close()
	}
	s.wg.Wait()
}

// track registers an echo connection so shutdown can close it; it reports
// false if shutdown has begun.
func (s *server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *server) untrack(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
}

// --- HTTP ---

func (s *server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		ap, _ := netip.ParseAddrPort(r.RemoteAddr)
		ap = clean(ap)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(Reply{
			Pod:        s.name,
			Client:     ap.Addr().String(),
			ClientPort: int(ap.Port()),
			Host:       r.Host,
		})
	})
	mux.HandleFunc("GET /hostname", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, s.name)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok")
	})
	// Readiness as an application has it: a readiness probe asks GET
	// /ready; PUT /ready with "false" or "true" turns it (lab tests take
	// a pod out of its Services' endpoints this way).
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		if s.unready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ready")
	})
	mux.HandleFunc("PUT /ready", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 16))
		switch strings.TrimSpace(string(b)) {
		case "true":
			s.unready.Store(false)
		case "false":
			s.unready.Store(true)
		default:
			http.Error(w, `want "true" or "false"`, http.StatusBadRequest)
		}
	})
	mux.HandleFunc("GET /echo", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, r.URL.Query().Get("msg"))
	})
	return mux
}

// clean shows a peer address as the lab compares it: IPv4 in IPv4 form even
// when it arrived on a dual-stack socket, and without an IPv6 zone.
func clean(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
}

// --- TCP echo ---

func (s *server) serveTCPEcho(ln net.Listener) error {
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.isClosing() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// Transient (EMFILE, ECONNABORTED, ...): back off as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(delay):
				continue
			case <-s.done:
				return nil
			}
		}
		delay = 0
		if !s.track(c) {
			c.Close()
			return nil
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.untrack(c)
			defer c.Close()
			s.echo(c)
		}()
	}
}

func (s *server) echo(c net.Conn) {
	r := bufio.NewReader(c)
	n, err := skipLine(r)
	if n == 0 {
		return // the client left without a word
	}
	ap := clean(c.RemoteAddr().(*net.TCPAddr).AddrPort())
	if _, werr := fmt.Fprintf(c, "%s saw %s\n", s.name, ap.Addr()); werr != nil {
		return
	}
	if err == nil {
		if _, err := io.Copy(c, r); err != nil {
			return
		}
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// skipLine consumes the first line, however long, and reports its length.
// The error is nil if the line ended with '\n'.
func skipLine(r *bufio.Reader) (int, error) {
	n := 0
	for {
		b, err := r.ReadSlice('\n')
		n += len(b)
		if err != bufio.ErrBufferFull {
			return n, err
		}
	}
}

// --- UDP echo ---

func (s *server) serveUDPEcho(u udpListener) error {
	buf := make([]byte, 64<<10)
	var oob []byte
	if u.pktinfo {
		oob = make([]byte, oobSize)
	}
	out := make([]byte, 0, 1024)
	for {
		n, oobn, _, from, err := u.conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if s.isClosing() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("workload: serving %s on %s: %w", KindUDPEcho, u.conn.LocalAddr(), err)
		}
		out = fmt.Appendf(out[:0], "%s saw %s: ", s.name, clean(from).Addr())
		payload := buf[:n]
		if a := pmtu.Answer(payload); a != nil {
			payload = a // a size probe: its first line only
		}
		out = append(out, payload...)
		if u.pktinfo {
			if src := replyPktinfo(oob[:oobn]); src != nil {
				if _, _, err := u.conn.WriteMsgUDPAddrPort(out, src, from); err == nil {
					continue
				}
				// The destination cannot be a source (a broadcast, say):
				// let the kernel pick one.
			}
		}
		// Best effort, like UDP: a reply that cannot be sent is dropped.
		u.conn.WriteToUDPAddrPort(out, from)
	}
}
