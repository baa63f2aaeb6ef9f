package userspace_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	itestutil "github.com/weftnet/weft/internal/testutil"
	"github.com/weftnet/weft/proxy/model"
	"github.com/weftnet/weft/proxy/userspace"
)

// These tests run the data path in rootless mode on the loopback (in the
// test's private network namespace when root, else the machine's
// loopback): endpoints are servers of the test on 127.0.0.1.

var loopback = netip.MustParseAddr("127.0.0.1")

// server is one endpoint: a TCP server that says its name, then echoes
// lines, and a UDP server on the same port answering each datagram with
// its name.
type server struct {
	name string
	addr netip.AddrPort
	tcp  net.Listener
	udp  net.PacketConn
}

func startServer(t *testing.T, name string) *server {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{name: name, tcp: ln, addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	if s.udp, err = net.ListenPacket("udp4", s.addr.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintln(c, name)
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintln(c, sc.Text())
				}
			}()
		}
	}()
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := s.udp.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = s.udp.WriteTo([]byte(name), from)
		}
	}()
	return s
}

func (s *server) stop() { s.tcp.Close(); s.udp.Close() }

// refusing is an address where nothing listens (a port the test held and
// let go): connections to it are refused.
func refusing(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func portName(svc string, proto model.Protocol) model.ServicePortName {
	return model.ServicePortName{Namespace: "default", Name: svc, Port: "p", Protocol: proto}
}

// svc is one service port with ready endpoints, on port 80 (privileged:
// rootless mode falls back to the range when it may not bind it).
type svc struct {
	name     string
	proto    model.Protocol
	port     uint16
	affinity int
	eps      []netip.AddrPort
}

func state(svcs ...svc) model.State {
	st := model.State{Ports: map[model.ServicePortName]*model.ServicePort{}, Endpoints: map[model.ServicePortName][]model.Endpoint{}}
	for i, s := range svcs {
		if s.proto == "" {
			s.proto = model.TCP
		}
		if s.port == 0 {
			s.port = 80
		}
		n := portName(s.name, s.proto)
		st.Ports[n] = &model.ServicePort{Name: n, Protocol: s.proto, Port: s.port, AffinitySeconds: s.affinity,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + i)})}}
		for _, ep := range s.eps {
			st.Endpoints[n] = append(st.Endpoints[n], model.Endpoint{IP: ep.Addr(), Port: ep.Port(), Ready: true, Serving: true})
		}
	}
	return st
}

func newBackend(t *testing.T, cfg userspace.Config) *userspace.Backend {
	t.Helper()
	cfg.Listen = loopback
	b, err := userspace.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Cleanup() })
	return b
}

func syncState(t *testing.T, b *userspace.Backend, st model.State) {
	t.Helper()
	if err := b.Sync(st, false); err != nil {
		t.Fatal(err)
	}
}

// addr is the listener address of a Service in b's map.
func addr(t *testing.T, b *userspace.Backend, name string) string {
	t.Helper()
	for _, e := range b.Services() {
		if e.Service == "default/"+name {
			if e.Address == "" {
				t.Fatalf("%s has no listener: %s", name, e.Error)
			}
			return e.Address
		}
	}
	t.Fatalf("%s is not in the map %+v", name, b.Services())
	return ""
}

// conn is a TCP connection through the proxy.
type conn struct {
	t    *testing.T
	c    net.Conn
	r    *bufio.Reader
	name string // who answered
}

func dial(t *testing.T, a string) *conn {
	t.Helper()
	c, err := net.Dial("tcp", a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cn := &conn{t: t, c: c, r: bufio.NewReader(c)}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := cn.r.ReadString('\n')
	if err != nil {
		t.Fatalf("%s: no greeting: %v", a, err)
	}
	cn.name = strings.TrimSpace(line)
	return cn
}

// who is the endpoint answering a new connection to a.
func who(t *testing.T, a string) string {
	t.Helper()
	c := dial(t, a)
	c.c.Close()
	return c.name
}

// talk checks that the connection still carries bytes both ways.
func (c *conn) talk(msg string) {
	c.t.Helper()
	_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintln(c.c, msg)
	if got, err := c.r.ReadString('\n'); err != nil || strings.TrimSpace(got) != msg {
		c.t.Fatalf("echo of %q: %q %v", msg, got, err)
	}
}

// udpAsk sends one datagram on c and returns the answer.
func udpAsk(c net.Conn) (string, error) {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return "", err
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

func TestRoundRobin(t *testing.T) {
	a, bb, c := startServer(t, "a"), startServer(t, "b"), startServer(t, "c")
	b := newBackend(t, userspace.Config{})
	syncState(t, b, state(svc{name: "web", eps: []netip.AddrPort{a.addr, bb.addr, c.addr}}))
	web := addr(t, b, "web")
	var got []string
	for range 6 {
		got = append(got, who(t, web))
	}
	// Round robin: each endpoint once per round, in a fixed order.
	if got[0] == got[1] || got[1] == got[2] || got[0] == got[2] || got[3] != got[0] || got[4] != got[1] || got[5] != got[2] {
		t.Fatalf("6 connections went to %v, want two rounds over a, b, c", got)
	}
}

// TestAffinity: a client keeps its endpoint while the timeout has not
// passed since its last new connection; after it, round robin again; an
// endpoint leaving the Service is left at once.
func TestAffinity(t *testing.T) {
	a, bb := startServer(t, "a"), startServer(t, "b")
	b := newBackend(t, userspace.Config{})
	now := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	userspace.SetClock(b, clock)
	both := svc{name: "sticky", affinity: 60, eps: []netip.AddrPort{a.addr, bb.addr}}
	syncState(t, b, state(both))
	sticky := addr(t, b, "sticky")
	first := who(t, sticky)
	for i := range 5 {
		advance(59 * time.Second) // each new connection renews the timeout
		if got := who(t, sticky); got != first {
			t.Fatalf("connection %d went to %s, the first to %s", i, got, first)
		}
	}
	advance(61 * time.Second)
	seen := map[string]bool{}
	for range 4 {
		seen[who(t, sticky)] = true
		advance(61 * time.Second)
	}
	if len(seen) != 2 {
		t.Fatalf("after the timeout, connections went to %v, want both endpoints", seen)
	}
	// The remembered endpoint leaves the Service: its clients move.
	remembered := who(t, sticky)
	rest := a
	if remembered == "a" {
		rest = bb
	}
	syncState(t, b, state(svc{name: "sticky", affinity: 60, eps: []netip.AddrPort{rest.addr}}))
	if got := who(t, sticky); got != rest.name {
		t.Fatalf("after %s left the Service: %s", remembered, got)
	}
}

// TestRefusedEndpointRetried: an endpoint that refuses is skipped for the
// next, for TCP and UDP, before the client sees a failure; with none
// reachable the client is reset.
func TestRefusedEndpointRetried(t *testing.T) {
	live := startServer(t, "live")
	dead := refusing(t)
	b := newBackend(t, userspace.Config{})
	reg := metrics(t, b)
	syncState(t, b, state(svc{name: "web", eps: []netip.AddrPort{dead, live.addr}}, svc{name: "dns", proto: model.UDP, eps: []netip.AddrPort{dead, live.addr}},
		svc{name: "down", eps: []netip.AddrPort{dead}}))
	web := addr(t, b, "web")
	for i := range 4 {
		if got := who(t, web); got != "live" {
			t.Fatalf("connection %d answered by %s", i, got)
		}
	}
	if n := reg("weft_userspace_endpoint_failures_total", "TCP"); n < 2 {
		t.Fatalf("%v endpoint failures counted, want one per connection the round robin sent to the refusing endpoint", n)
	}
	// UDP: four sessions (four sockets), each answered by the live one.
	for i := range 4 {
		c, err := net.Dial("udp", addr(t, b, "dns"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := udpAsk(c)
		c.Close()
		if err != nil || got != "live" {
			t.Fatalf("UDP session %d: %q %v", i, got, err)
		}
	}
	if n := reg("weft_userspace_endpoint_failures_total", "UDP"); n < 2 {
		t.Fatalf("%v UDP endpoint failures counted", n)
	}
	if err := resetAtOnce(addr(t, b, "down")); err != nil {
		t.Fatalf("no endpoint reachable: %v", err)
	}
}

// TestEndpointsChange: a sync that changes the endpoints keeps the
// listener's port and established connections, to endpoints still listed
// and to removed ones (they drain, as under conntrack); new connections go
// to the new list.
func TestEndpointsChange(t *testing.T) {
	a, bb, c := startServer(t, "a"), startServer(t, "b"), startServer(t, "c")
	b := newBackend(t, userspace.Config{})
	syncState(t, b, state(svc{name: "web", eps: []netip.AddrPort{a.addr}}))
	web := addr(t, b, "web")
	toA := dial(t, web)
	toA.talk("before")
	syncState(t, b, state(svc{name: "web", eps: []netip.AddrPort{a.addr, bb.addr}}))
	toA.talk("endpoint added")
	if got := addr(t, b, "web"); got != web {
		t.Fatalf("the listener moved from %s to %s", web, got)
	}
	toB := dial(t, web) // the round robin's next
	if toB.name != "b" {
		toB = dial(t, web)
	}
	syncState(t, b, state(svc{name: "web", eps: []netip.AddrPort{bb.addr, c.addr}}))
	toA.talk("a removed: draining")
	toB.talk("b still listed")
	for range 4 {
		if got := who(t, web); got == "a" {
			t.Fatal("a new connection went to the removed endpoint")
		}
	}
}

// TestLimits: over MaxConnections a new connection is reset, over
// MaxUDPSessions a new client's datagrams are dropped, both counted; a
// place freed is used again.
func TestLimits(t *testing.T) {
	a := startServer(t, "a")
	b := newBackend(t, userspace.Config{MaxConnections: 1, MaxUDPSessions: 1})
	reg := metrics(t, b)
	syncState(t, b, state(svc{name: "web", eps: []netip.AddrPort{a.addr}}, svc{name: "dns", proto: model.UDP, eps: []netip.AddrPort{a.addr}}))
	web := addr(t, b, "web")
	first := dial(t, web)
	if reg("weft_userspace_tcp_connections", "") != 1 {
		t.Fatalf("tcp_connections = %v", reg("weft_userspace_tcp_connections", ""))
	}
	if err := resetAtOnce(web); err != nil {
		t.Fatalf("a second connection over the limit of 1: %v", err)
	}
	if n := reg("weft_userspace_rejected_total", "TCP", "limit"); n != 1 {
		t.Fatalf("rejected{TCP,limit} = %v", n)
	}
	first.talk("still served")
	first.c.Close()
	itestutil.Eventually(t, 10*time.Second, "the first connection's place freed", func() bool {
		return reg("weft_userspace_tcp_connections", "") == 0
	})
	dial(t, web).talk("after the first ended")

	dns := addr(t, b, "dns")
	u1, err := net.Dial("udp", dns)
	if err != nil {
		t.Fatal(err)
	}
	defer u1.Close()
	if got, err := udpAsk(u1); err != nil || got != "a" {
		t.Fatalf("first UDP client: %q %v", got, err)
	}
	u2, err := net.Dial("udp", dns)
	if err != nil {
		t.Fatal(err)
	}
	defer u2.Close()
	_, _ = u2.Write([]byte("ping"))
	itestutil.Eventually(t, 10*time.Second, "the second UDP client's datagram dropped over the limit", func() bool {
		return reg("weft_userspace_rejected_total", "UDP", "limit") >= 1
	})
	if got, err := udpAsk(u1); err != nil || got != "a" {
		t.Fatalf("first UDP client after the second was refused: %q %v", got, err)
	}
}

// TestUDPSessions: a session ends after the idle timeout (and the client's
// next datagram starts another); a session whose endpoint leaves the list
// ends, and the same client socket reaches the new endpoint.
func TestUDPSessions(t *testing.T) {
	a, bb := startServer(t, "a"), startServer(t, "b")
	b := newBackend(t, userspace.Config{UDPIdleTimeout: 300 * time.Millisecond})
	reg := metrics(t, b)
	syncState(t, b, state(svc{name: "dns", proto: model.UDP, eps: []netip.AddrPort{a.addr}}))
	c, err := net.Dial("udp", addr(t, b, "dns"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := udpAsk(c); err != nil || got != "a" {
		t.Fatalf("%q %v", got, err)
	}
	itestutil.Eventually(t, 10*time.Second, "the idle session ended", func() bool { return reg("weft_userspace_udp_sessions", "") == 0 })
	if got, err := udpAsk(c); err != nil || got != "a" {
		t.Fatalf("after the idle timeout: %q %v", got, err)
	}
	if n := reg("weft_userspace_udp_sessions_total", ""); n != 2 {
		t.Fatalf("%v sessions started, want 2", n)
	}
	syncState(t, b, state(svc{name: "dns", proto: model.UDP, eps: []netip.AddrPort{bb.addr}}))
	itestutil.Eventually(t, 10*time.Second, "the same socket answered by b", func() bool { got, _ := udpAsk(c); return got == "b" })
}

// TestPortCannotBeBound: a service port that gets no port is reported
// naming the Service and port, with an error from Sync and in the map,
// while the others work; once a port is free, the next sync binds it.
func TestPortCannotBeBound(t *testing.T) {
	a := startServer(t, "a")
	// Both Services' own port is held, and the range is one port: the
	// first Service (by name) takes it, the second gets nothing.
	held, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	own := uint16(held.Addr().(*net.TCPAddr).Port)
	free := refusing(t).Port()
	b := newBackend(t, userspace.Config{PortRange: userspace.PortRange{First: free, Last: free}})
	st := state(svc{name: "alpha", port: own, eps: []netip.AddrPort{a.addr}}, svc{name: "beta", port: own, eps: []netip.AddrPort{a.addr}})
	err = b.Sync(st, true)
	if err == nil || !strings.Contains(err.Error(), "service default/beta port p ("+fmt.Sprint(own)+"/TCP)") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("sync: %v, want an error naming default/beta, its port and why", err)
	}
	if got := who(t, addr(t, b, "alpha")); got != "a" {
		t.Fatalf("alpha: %s", got)
	}
	var beta userspace.MapEntry
	for _, e := range b.Services() {
		if e.Service == "default/beta" {
			beta = e
		}
	}
	if beta.Address != "" || !strings.Contains(beta.Error, "default/beta") {
		t.Fatalf("beta in the map: %+v", beta)
	}
	// alpha goes: its port is free for beta at the next sync.
	syncState(t, b, state(svc{name: "beta", port: own, eps: []netip.AddrPort{a.addr}}))
	if got := who(t, addr(t, b, "beta")); got != "a" {
		t.Fatalf("beta after alpha left: %s", got)
	}
}

// TestOwnPort: rootless mode listens on the Service's own port when free,
// and follows the Service to a new port.
func TestOwnPort(t *testing.T) {
	a := startServer(t, "a")
	port, next := refusing(t).Port(), refusing(t).Port()
	b := newBackend(t, userspace.Config{})
	for _, p := range []uint16{port, next} {
		syncState(t, b, state(svc{name: "web", port: p, eps: []netip.AddrPort{a.addr}}))
		if got, want := addr(t, b, "web"), netip.AddrPortFrom(loopback, p).String(); got != want {
			t.Fatalf("listening on %s, want the Service's own %s", got, want)
		}
		if got := who(t, addr(t, b, "web")); got != "a" {
			t.Fatalf("answered by %s", got)
		}
	}
}

// TestServiceMap: the JSON map names each Service port, its protocol,
// local address and live endpoints; SCTP is listed with why it has no
// listener, and is no sync error.
func TestServiceMap(t *testing.T) {
	a := startServer(t, "a")
	b := newBackend(t, userspace.Config{})
	syncState(t, b, state(svc{name: "web", eps: []netip.AddrPort{a.addr}}, svc{name: "stream", proto: model.SCTP, eps: []netip.AddrPort{a.addr}}))
	rec := httptest.NewRecorder()
	b.ServicesHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/services", nil))
	var got []userspace.MapEntry
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("%v:\n%s", err, rec.Body)
	}
	if len(got) != 2 {
		t.Fatalf("%d entries:\n%s", len(got), rec.Body)
	}
	sctp, web := got[0], got[1]
	if web.Service != "default/web" || web.Port != "p" || web.Protocol != "TCP" || web.ServicePort != 80 || web.Address == "" ||
		len(web.Endpoints) != 1 || web.Endpoints[0] != a.addr.String() {
		t.Fatalf("web: %+v", web)
	}
	if sctp.Service != "default/stream" || sctp.Address != "" || !strings.Contains(sctp.Error, "SCTP") {
		t.Fatalf("stream: %+v", sctp)
	}
	if err := b.Sync(state(svc{name: "web", eps: []netip.AddrPort{a.addr}}, svc{name: "stream", proto: model.SCTP}), false); err != nil {
		t.Fatalf("a sync with an SCTP port: %v", err)
	}
}

// resetAtOnce checks that a connection to a is reset, on connect or on
// the first read (the proxy accepts, then resets).
func resetAtOnce(a string) error {
	c, err := net.Dial("tcp", a)
	if err == nil {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if err == nil || !strings.Contains(err.Error(), "reset") {
		return fmt.Errorf("got %v, want a reset", err)
	}
	return nil
}

// metrics returns a reader of b's metrics by name and label values.
func metrics(t *testing.T, b *userspace.Backend) func(name string, labels ...string) float64 {
	t.Helper()
	return func(name string, labels ...string) float64 {
		mfs, err := gather(b)
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				match := true
				for i, l := range m.GetLabel() {
					if i >= len(labels) || l.GetValue() != labels[i] {
						match = false
					}
				}
				if !match {
					continue
				}
				switch {
				case m.Counter != nil:
					return m.Counter.GetValue()
				case m.Gauge != nil:
					return m.Gauge.GetValue()
				}
			}
		}
		return 0
	}
}

func gather(b *userspace.Backend) ([]*dto.MetricFamily, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(b); err != nil {
		return nil, err
	}
	return reg.Gather()
}
