package workload

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weftnet/weft/internal/pmtu"
)

const testName = "pod-a"

// running is a workload started by start.
type running struct {
	addrs  map[string][]string // kind → bound addresses, in order
	ready  *atomic.Int32       // calls of ready
	cancel context.CancelFunc
	done   chan error
}

// start runs a workload and waits for it to be ready; it is stopped (and
// must return nil) at the end of the test unless stopped before.
func start(t *testing.T, opts Options) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{addrs: map[string][]string{}, ready: new(atomic.Int32), cancel: cancel, done: make(chan error, 1)}
	if opts.Name == "" {
		opts.Name = testName
	}
	opts.Bound = func(kind, addr string) { r.addrs[kind] = append(r.addrs[kind], addr) }
	readyc := make(chan struct{})
	go func() {
		r.done <- Run(ctx, opts, func() {
			if r.ready.Add(1) == 1 {
				close(readyc)
			}
		})
	}()
	select {
	case <-readyc:
	case err := <-r.done:
		cancel()
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("workload not ready after 10s")
	}
	t.Cleanup(func() {
		if err := r.stop(); err != nil {
			t.Errorf("stopping workload: %v", err)
		}
	})
	return r
}

// stop cancels the workload and returns Run's result; later calls return nil.
func (r *running) stop() error {
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(10 * time.Second):
		return errors.New("Run did not return within 10s of cancel")
	}
}

func (r *running) addr(t *testing.T, kind string, i int) string {
	t.Helper()
	if len(r.addrs[kind]) <= i {
		t.Fatalf("no %s listener #%d bound; have %v", kind, i, r.addrs)
	}
	return r.addrs[kind][i]
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// loopbacks are the listen addresses and the client IP the server sees.
var loopbacks = []struct{ family, listen, client string }{
	{"ipv4", "127.0.0.1:0", "127.0.0.1"},
	{"ipv6", "[::1]:0", "::1"},
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestHTTP(t *testing.T) {
	w := start(t, Options{HTTPAddrs: []string{loopbacks[0].listen, loopbacks[1].listen}})
	if got := w.ready.Load(); got != 1 {
		t.Errorf("ready called %d times, want 1", got)
	}
	for i, lb := range loopbacks {
		t.Run(lb.family, func(t *testing.T) {
			addr := w.addr(t, KindHTTP, i)
			base := "http://" + addr

			r, err := HTTPGet(testCtx(t), base+"/")
			if err != nil {
				t.Fatal(err)
			}
			if r.Pod != testName || r.Client != lb.client || r.Host != addr || r.ClientPort <= 0 || r.ClientPort > 65535 {
				t.Errorf("GET / = %+v, want pod %q, client %q, host %q, a client port", r, testName, lb.client, addr)
			}

			for _, c := range []struct {
				path       string
				code       int
				body       string
				substrOnly bool
			}{
				{"/hostname", 200, testName, false},
				{"/healthz", 200, "ok", false},
				{"/echo?msg=hi%20there", 200, "hi there", false},
				{"/echo", 200, "", false},
				{"/nope", 404, "not found", true},
			} {
				code, body := get(t, base+c.path)
				if code != c.code || (c.substrOnly && !strings.Contains(body, c.body)) || (!c.substrOnly && body != c.body) {
					t.Errorf("GET %s = %d %q, want %d %q", c.path, code, body, c.code, c.body)
				}
			}

			resp, err := httpClient.Post(base+"/", "text/plain", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("POST / = %d, want 405", resp.StatusCode)
			}
		})
	}
}

// TestHTTPClientPortAndHost checks the reply against the client's own end
// of the connection, and that the Host header is reported as sent.
func TestHTTPClientPortAndHost(t *testing.T) {
	w := start(t, Options{HTTPAddrs: []string{"127.0.0.1:0"}})
	var local atomic.Value
	client := &http.Client{Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				local.Store(c.LocalAddr().(*net.TCPAddr))
			}
			return c, err
		},
	}}
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodGet, "http://"+w.addr(t, KindHTTP, 0)+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "svc.ns.svc.cluster.local:8080"
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	want := fmt.Sprintf(`{"pod":%q,"client":"127.0.0.1","clientPort":%d,"host":%q}`+"\n",
		testName, local.Load().(*net.TCPAddr).Port, req.Host)
	if string(body) != want {
		t.Errorf("GET / body\n got %s\nwant %s", body, want)
	}
}

func TestTCPEcho(t *testing.T) {
	w := start(t, Options{TCPEchoAddrs: []string{loopbacks[0].listen, loopbacks[1].listen}})
	for i, lb := range loopbacks {
		t.Run(lb.family, func(t *testing.T) {
			addr := w.addr(t, KindTCPEcho, i)
			greeting := fmt.Sprintf("%s saw %s", testName, lb.client)

			got, err := TCPExchange(testCtx(t), addr)
			if err != nil || got != greeting {
				t.Fatalf("TCPExchange = %q, %v; want %q", got, err, greeting)
			}

			// A long first line, then 1 MiB that must come back byte for byte.
			rest := make([]byte, 1<<20)
			rand.Read(rest)
			want := append([]byte(greeting+"\n"), rest...)
			got2 := exchange(t, addr, append(append(bytes.Repeat([]byte("x"), 10000), '\n'), rest...))
			if !bytes.Equal(got2, want) {
				t.Errorf("echo: got %d bytes, want %d (greeting + the bytes after the first line)", len(got2), len(want))
			}

			// A first line cut short by EOF is still greeted.
			if got := string(exchange(t, addr, []byte("no newline"))); got != greeting+"\n" {
				t.Errorf("unterminated first line: got %q, want %q", got, greeting+"\n")
			}
		})
	}
}

// exchange sends data on a new connection, half-closes it and returns
// everything the server sent before closing its side.
func exchange(t *testing.T, addr string, data []byte) []byte {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading echo: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("writing: %v", err)
	}
	return got
}

func TestUDPEcho(t *testing.T) {
	w := start(t, Options{UDPEchoAddrs: []string{loopbacks[0].listen, loopbacks[1].listen}})
	for i, lb := range loopbacks {
		t.Run(lb.family, func(t *testing.T) {
			addr := w.addr(t, KindUDPEcho, i)
			for _, payload := range []string{"ping", "", "two\nlines", pmtu.Prefix + "7\n" + strings.Repeat("x", 1000)} {
				answer, _, _ := strings.Cut(payload, "\n")
				if !strings.HasPrefix(payload, pmtu.Prefix) {
					answer = payload // echoed whole
				}
				want := fmt.Sprintf("%s saw %s: %s", testName, lb.client, answer)
				if got, err := UDPExchange(testCtx(t), addr, payload); err != nil || got != want {
					t.Errorf("UDPExchange(%q) = %q, %v; want %q", payload, got, err, want)
				}
			}
		})
	}
}

// TestUDPEchoWildcardRepliesFromDestination sends to 127.0.0.2, which the
// kernel would not pick as the source of a reply to 127.0.0.1: the
// connected client only accepts the reply if it comes from the address it
// sent to.
func TestUDPEchoWildcardRepliesFromDestination(t *testing.T) {
	w := start(t, Options{UDPEchoAddrs: []string{"0.0.0.0:0", ":0"}})
	for i, name := range []string{"ipv4-socket", "dual-stack-socket"} {
		t.Run(name, func(t *testing.T) {
			_, port, err := net.SplitHostPort(w.addr(t, KindUDPEcho, i))
			if err != nil {
				t.Fatal(err)
			}
			targets := []struct{ dst, client string }{{"127.0.0.1", "127.0.0.1"}, {"127.0.0.2", "127.0.0.1"}}
			if i == 1 {
				targets = append(targets, struct{ dst, client string }{"::1", "::1"})
			}
			for _, tg := range targets {
				want := fmt.Sprintf("%s saw %s: x", testName, tg.client)
				if got, err := UDPExchange(testCtx(t), net.JoinHostPort(tg.dst, port), "x"); err != nil || got != want {
					t.Errorf("to %s: got %q, %v; want %q", tg.dst, got, err, want)
				}
			}
		})
	}
}

// freePort returns a loopback address whose port was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestBindError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenUDP, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer takenUDP.Close()

	for _, c := range []struct {
		name string
		opts func(good string) Options
		bad  string
	}{
		{"http-in-use", func(g string) Options { return Options{HTTPAddrs: []string{g, taken.Addr().String()}} }, taken.Addr().String()},
		{"tcp-in-use", func(g string) Options {
			return Options{HTTPAddrs: []string{g}, TCPEchoAddrs: []string{taken.Addr().String()}}
		}, taken.Addr().String()},
		{"udp-in-use", func(g string) Options {
			return Options{TCPEchoAddrs: []string{g}, UDPEchoAddrs: []string{takenUDP.LocalAddr().String()}}
		}, takenUDP.LocalAddr().String()},
		{"http-malformed", func(g string) Options { return Options{HTTPAddrs: []string{g, "no-port"}} }, "no-port"},
		{"udp-malformed", func(g string) Options { return Options{HTTPAddrs: []string{g}, UDPEchoAddrs: []string{"[::1"}} }, "[::1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			good := freePort(t)
			var calls atomic.Int32
			opts := c.opts(good)
			opts.Bound = func(string, string) { calls.Add(1) }
			errc := make(chan error, 1)
			go func() { errc <- Run(context.Background(), opts, func() { calls.Add(1) }) }()
			select {
			case err = <-errc:
			case <-time.After(5 * time.Second):
				t.Fatal("Run did not fail at once")
			}
			if err == nil || !strings.Contains(err.Error(), c.bad) {
				t.Fatalf("Run = %v, want an error naming %s", err, c.bad)
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("Bound/ready called %d times after a bind error", n)
			}
			// The listener bound before the failure was closed.
			ln, err := net.Listen("tcp", good)
			if err != nil {
				t.Fatalf("%s still bound after the bind error: %v", good, err)
			}
			ln.Close()
		})
	}
}

func TestShutdown(t *testing.T) {
	w := start(t, Options{
		HTTPAddrs:    []string{"127.0.0.1:0", "[::1]:0"},
		TCPEchoAddrs: []string{"127.0.0.1:0", "[::1]:0"},
		UDPEchoAddrs: []string{"127.0.0.1:0", "[::1]:0"},
	})

	// An idle keep-alive HTTP connection and an echo connection in the
	// middle of its stream must not hold shutdown up.
	keepAlive := &http.Client{Transport: &http.Transport{Proxy: nil}}
	defer keepAlive.CloseIdleConnections()
	resp, err := keepAlive.Get("http://" + w.addr(t, KindHTTP, 0) + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	echo, err := net.Dial("tcp", w.addr(t, KindTCPEcho, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	echo.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(echo, "hi\nabc")
	buf := make([]byte, 64)
	want := testName + " saw ::1\nabc"
	if n, err := io.ReadAtLeast(echo, buf, len(want)); err != nil || string(buf[:n]) != want {
		t.Fatalf("echo before shutdown: %q, %v", buf[:n], err)
	}

	if err := w.stop(); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	// The workload closed the connection itself: the read ends at once, not
	// at the client's own deadline.
	if n, err := echo.Read(buf); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("echo connection still open after shutdown (read %q, %v)", buf[:n], err)
	}

	// Every port is free again.
	for _, a := range append(w.addrs[KindHTTP], w.addrs[KindTCPEcho]...) {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Errorf("after shutdown: %v", err)
			continue
		}
		ln.Close()
	}
	for _, a := range w.addrs[KindUDPEcho] {
		pc, err := net.ListenPacket("udp", a)
		if err != nil {
			t.Errorf("after shutdown: %v", err)
			continue
		}
		pc.Close()
	}
	if got := w.ready.Load(); got != 1 {
		t.Errorf("ready called %d times, want 1", got)
	}
}

func TestNoListeners(t *testing.T) {
	w := start(t, Options{})
	if len(w.addrs) != 0 {
		t.Errorf("bound %v with no addresses given", w.addrs)
	}
	if err := w.stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
}

func TestNilReady(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	bound := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- Run(ctx, Options{Name: testName, HTTPAddrs: []string{"127.0.0.1:0"},
			Bound: func(_, addr string) { bound <- addr }}, nil)
	}()
	var addr string
	select {
	case addr = <-bound:
	case err := <-errc:
		t.Fatal(err)
	}
	if _, body := get(t, "http://"+addr+"/hostname"); body != testName {
		t.Errorf("/hostname = %q", body)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run = %v", err)
	}
}

func TestClientErrors(t *testing.T) {
	// Nothing listens on a port that was just freed: TCP and UDP fail fast
	// (RST, ICMP port unreachable on the connected UDP socket).
	addr := freePort(t)
	if _, err := TCPExchange(testCtx(t), addr); err == nil {
		t.Error("TCPExchange to a closed port succeeded")
	}
	if _, err := HTTPGet(testCtx(t), "http://"+addr+"/"); err == nil {
		t.Error("HTTPGet to a closed port succeeded")
	}

	// A UDP peer that never answers: the context's deadline ends the wait.
	silent, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := UDPExchange(ctx, silent.LocalAddr().String(), "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("UDPExchange to a silent peer = %v, want DeadlineExceeded", err)
	}

	// A non-200 answer is an error.
	w := start(t, Options{HTTPAddrs: []string{"127.0.0.1:0"}})
	if _, err := HTTPGet(testCtx(t), "http://"+w.addr(t, KindHTTP, 0)+"/nope"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("HTTPGet of a 404 = %v", err)
	}
}

// TestReadiness: GET /ready answers 200 until SetReadyVia turns it to 503,
// and back; a body other than true or false is refused and changes nothing.
func TestReadiness(t *testing.T) {
	w := start(t, Options{HTTPAddrs: []string{loopbacks[0].listen}})
	base := "http://" + w.addr(t, KindHTTP, 0)
	var d net.Dialer
	check := func(want int) {
		t.Helper()
		if code, body := get(t, base+"/ready"); code != want {
			t.Fatalf("GET /ready = %d %q, want %d", code, body, want)
		}
	}
	check(200)
	if err := SetReadyVia(testCtx(t), d.DialContext, base, false); err != nil {
		t.Fatal(err)
	}
	check(503)
	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPut, base+"/ready", strings.NewReader("maybe"))
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("PUT /ready maybe = %d, want 400", resp.StatusCode)
	}
	check(503)
	if err := SetReadyVia(testCtx(t), d.DialContext, base, true); err != nil {
		t.Fatal(err)
	}
	check(200)
}
