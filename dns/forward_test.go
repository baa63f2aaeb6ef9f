package dns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/internal/testutil"
)

// TestMain isolates the tests in a private network namespace, except when
// fuzzing: the fuzzing engine talks to its workers over inherited pipes
// that a re-executed process would not have. The fuzz target opens no
// sockets, and the socket tests skip when not isolated.
func TestMain(m *testing.M) {
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "-test.fuzz") {
			os.Exit(m.Run())
		}
	}
	os.Exit(netnsutil.RunTests(m))
}

func needNetns(t *testing.T) {
	t.Helper()
	if !netnsutil.Isolated() {
		t.Skip("socket test: needs root to run in a private network namespace")
	}
}

// fakeUpstream is a DNS server on the private loopback. mode: "answer"
// (an A record per name, TTL 600, and NXDOMAIN with an SOA for names under
// nx.test.), "servfail", or "silent" (reads and never answers).
type fakeUpstream struct {
	addr    string
	mode    atomic.Value
	queries atomic.Int32
	hold    chan struct{} // when not nil, answers wait for it to close
}

func startUpstream(t *testing.T, mode string, hold ...chan struct{}) *fakeUpstream {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &fakeUpstream{addr: pc.LocalAddr().String()}
	if len(hold) > 0 {
		u.hold = hold[0]
	}
	u.mode.Store(mode)
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		u.queries.Add(1)
		if u.hold != nil {
			<-u.hold
		}
		m := new(mdns.Msg)
		m.SetReply(r)
		switch u.mode.Load().(string) {
		case "silent":
			return
		case "servfail":
			m.Rcode = mdns.RcodeServerFailure
		default:
			qn := r.Question[0].Name
			if mdns.IsSubDomain("nx.test.", qn) || mdns.IsSubDomain("in-addr.arpa.", qn) {
				m.Rcode = mdns.RcodeNameError
				m.Ns = []mdns.RR{&mdns.SOA{Hdr: hdr("test.", mdns.TypeSOA, 3600), Ns: "ns.test.", Mbox: "h.test.", Minttl: 30}}
			} else if r.Question[0].Qtype == mdns.TypeA {
				m.Answer = []mdns.RR{&mdns.A{Hdr: hdr(qn, mdns.TypeA, 600), A: net.IPv4(192, 0, 2, 1)}}
			}
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u
}

func exchange(t *testing.T, addr, name string, qtype uint16, proto string) *mdns.Msg {
	t.Helper()
	c := &mdns.Client{Net: proto, Timeout: 10 * time.Second}
	r, _, err := c.Exchange(q(name, qtype), addr)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, mdns.TypeToString[qtype], proto, err)
	}
	return r
}

// serve starts a Server with the fixture on the private loopback.
func serve(t *testing.T, fwd *Forwarder) (*Server, *Index) {
	t.Helper()
	s, x := newTestServer(t, false, fwd)
	s.Sockets = 2
	if err := s.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(s.Close)
	return s, x
}

func TestForwardFailoverAndHealth(t *testing.T) {
	needNetns(t)
	silent, bad, good := startUpstream(t, "silent"), startUpstream(t, "servfail"), startUpstream(t, "answer")
	fwd, err := NewForwarder([]string{silent.addr, bad.addr, good.addr})
	if err != nil {
		t.Fatal(err)
	}
	fwd.AttemptTimeout, fwd.HealthInterval = 300*time.Millisecond, 50*time.Millisecond
	s, _ := serve(t, fwd)
	r := exchange(t, s.Addr(), "one.example.", mdns.TypeA, "udp")
	if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 1 || good.queries.Load() != 1 {
		t.Fatalf("failover: %v (good upstream asked %d times)", r, good.queries.Load())
	}
	ups := fwd.Upstreams()
	if ups[silent.addr] || ups[bad.addr] || !ups[good.addr] {
		t.Fatalf("health after failover: %v", ups)
	}
	// Down upstreams are tried last: the next name goes straight to good.
	before := silent.queries.Load()
	exchange(t, s.Addr(), "two.example.", mdns.TypeA, "udp")
	if silent.queries.Load() != before {
		t.Errorf("a down upstream was tried before a healthy one")
	}
	// The health probe brings a recovered upstream back.
	silent.mode.Store("answer")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go fwd.Run(ctx)
	testutil.Eventually(t, 10*time.Second, "the recovered upstream marked up", func() bool { return fwd.Upstreams()[silent.addr] })
	exchange(t, s.Addr(), "three.example.", mdns.TypeA, "udp")
	if silent.queries.Load() <= before {
		t.Errorf("recovered first upstream not used again")
	}
}

func TestForwardCache(t *testing.T) {
	needNetns(t)
	up := startUpstream(t, "answer")
	fwd, _ := NewForwarder([]string{up.addr})
	s, x := serve(t, fwd)
	for i := range 3 {
		r := exchange(t, s.Addr(), "cached.example.", mdns.TypeA, "udp")
		if len(r.Answer) != 1 {
			t.Fatalf("query %d: %v", i, r)
		}
	}
	for i := range 3 {
		if r := exchange(t, s.Addr(), "gone.nx.test.", mdns.TypeA, "tcp"); r.Rcode != mdns.RcodeNameError || len(r.Ns) != 1 {
			t.Fatalf("negative %d: %v", i, r)
		}
	}
	if n := up.queries.Load(); n != 2 {
		t.Errorf("upstream asked %d times, want 2 (one positive, one negative; the rest cached)", n)
	}
	// A reverse name the upstream denied, then a Service takes the address:
	// the index answers, not the cached NXDOMAIN.
	ip := nth(svcNet, 555)
	if r := exchange(t, s.Addr(), rev(ip), mdns.TypePTR, "udp"); r.Rcode != mdns.RcodeNameError {
		t.Fatalf("reverse before: %v", r)
	}
	x.OnService(nil, service("default", "late", []netip.Addr{ip}))
	r := exchange(t, s.Addr(), rev(ip), mdns.TypePTR, "udp")
	if len(r.Answer) != 1 || r.Answer[0].(*mdns.PTR).Ptr != "late.default.svc."+zone {
		t.Errorf("reverse after the Service appeared: %v", r)
	}
	// ExternalName to an outside name: the CNAME and what upstream says.
	ext := service("default", "out", nil)
	ext.Spec.Type, ext.Spec.ExternalName = "ExternalName", "target.example"
	x.OnService(nil, ext)
	r = exchange(t, s.Addr(), "out.default.svc."+zone, mdns.TypeA, "udp")
	if len(r.Answer) != 2 || r.Answer[0].Header().Rrtype != mdns.TypeCNAME || r.Answer[1].Header().Rrtype != mdns.TypeA {
		t.Errorf("ExternalName chase: %v", r)
	}
}

// TestNoUpstream: when no upstream answers, other names get SERVFAIL and
// cluster names keep being answered meanwhile.
func TestNoUpstream(t *testing.T) {
	needNetns(t)
	dead := startUpstream(t, "silent")
	fwd, _ := NewForwarder([]string{dead.addr})
	fwd.AttemptTimeout = 2 * time.Second
	s, _ := serve(t, fwd)
	done := make(chan *mdns.Msg, 1)
	go func() {
		c := &mdns.Client{Net: "udp", Timeout: 20 * time.Second}
		r, _, _ := c.Exchange(q("slow.example.", mdns.TypeA), s.Addr())
		done <- r
	}()
	// Wait until the forwarded query is pending upstream.
	testutil.Eventually(t, 10*time.Second, "the query forwarded", func() bool { return dead.queries.Load() > 0 })
	for _, proto := range []string{"udp", "tcp"} {
		if r := exchange(t, s.Addr(), "web.default.svc."+zone, mdns.TypeA, proto); len(r.Answer) != 1 {
			t.Errorf("cluster name over %s while upstream hangs: %v", proto, r)
		}
	}
	if r := <-done; r == nil || r.Rcode != mdns.RcodeServerFailure {
		t.Errorf("dead upstream: %v, want SERVFAIL", r)
	}
}

// TestTCPRetry: a UDP answer with TC is retried over TCP, as resolvers do,
// and comes whole.
func TestTCPRetry(t *testing.T) {
	needNetns(t)
	s, x := serve(t, nil)
	x.OnService(nil, headless("default", "big"))
	var eps []endpoint
	for i := range 80 {
		eps = append(eps, endpoint{nth(podNet, 7*256+i+1), "", true})
	}
	x.OnEndpointSlice(nil, slice("default", "big", "big-a", nil, eps...))
	name := "big.default.svc." + zone
	r := exchange(t, s.Addr(), name, mdns.TypeA, "udp")
	if !r.Truncated {
		t.Fatalf("UDP answer of 80 addresses not truncated: %d answers", len(r.Answer))
	}
	r = exchange(t, s.Addr(), name, mdns.TypeA, "tcp")
	if r.Truncated || len(r.Answer) != 80 {
		t.Errorf("TCP: TC %v, %d answers", r.Truncated, len(r.Answer))
	}
}

// TestCacheTTL: TTLs are capped and count down; negative answers live for
// the SOA's negative TTL; failures are not cached.
func TestCacheTTL(t *testing.T) {
	c := NewCache(10, time.Minute, 20*time.Second)
	now := time.Unix(1e9, 0)
	pos := new(mdns.Msg)
	pos.Answer = []mdns.RR{&mdns.A{Hdr: hdr("a.example.", mdns.TypeA, 600), A: net.IPv4(192, 0, 2, 1)}}
	k := cacheKey{name: "a.example.", qtype: mdns.TypeA, qclass: 1}
	c.Put(k, pos, now)
	if r := c.Get(k, now.Add(10*time.Second)); r == nil || r.Answer[0].Header().Ttl != 590 {
		t.Errorf("after 10s: %v", r)
	}
	if r := c.Get(k, now.Add(time.Minute)); r != nil {
		t.Errorf("kept past the 1m cap: %v", r)
	}
	neg := new(mdns.Msg)
	neg.Rcode = mdns.RcodeNameError
	neg.Ns = []mdns.RR{&mdns.SOA{Hdr: hdr("example.", mdns.TypeSOA, 3600), Minttl: 15}}
	kn := cacheKey{name: "n.example.", qtype: mdns.TypeA, qclass: 1}
	c.Put(kn, neg, now)
	if c.Get(kn, now.Add(14*time.Second)) == nil || c.Get(kn, now.Add(15*time.Second)) != nil {
		t.Errorf("negative entry should live 15s (SOA minimum)")
	}
	neg.Ns[0].(*mdns.SOA).Minttl = 3600
	c.Put(kn, neg, now)
	if c.Get(kn, now.Add(19*time.Second)) == nil || c.Get(kn, now.Add(20*time.Second)) != nil {
		t.Errorf("negative entry should be capped at 20s")
	}
	fail := new(mdns.Msg)
	fail.Rcode = mdns.RcodeServerFailure
	kf := cacheKey{name: "f.example.", qtype: mdns.TypeA, qclass: 1}
	c.Put(kf, fail, now)
	if c.Get(kf, now) != nil {
		t.Errorf("SERVFAIL cached")
	}
	for i := range 30 {
		c.Put(cacheKey{name: string(rune('a'+i)) + ".x.", qtype: 1, qclass: 1}, pos, now)
	}
	if c.Len() > 10 {
		t.Errorf("cache holds %d entries, limit 10", c.Len())
	}
}

// TestSocketsBadInput: garbage over UDP and TCP does not stop the server.
func TestSocketsBadInput(t *testing.T) {
	needNetns(t)
	s, _ := serve(t, nil)
	u, err := net.Dial("udp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	for _, pkt := range [][]byte{{}, {1, 2, 3}, make([]byte, 12), append(query("web.default.svc."+zone, mdns.TypeA, false)[:20:20], 0xff, 0xff)} {
		if _, err := u.Write(pkt); err != nil {
			t.Fatal(err)
		}
	}
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte{0, 5, 1, 2, 3, 4, 5, 0, 200}) // a bad message, then a frame that never completes
	c.Close()
	for _, proto := range []string{"udp", "tcp"} {
		if r := exchange(t, s.Addr(), "web.default.svc."+zone, mdns.TypeA, proto); len(r.Answer) != 1 {
			t.Errorf("after garbage, over %s: %v", proto, r)
		}
	}
}

// TestForwardCoalesced: concurrent askers of one forwarded question share
// one upstream exchange.
func TestForwardCoalesced(t *testing.T) {
	needNetns(t)
	hold := make(chan struct{})
	up := startUpstream(t, "answer", hold)
	fwd, _ := NewForwarder([]string{up.addr})
	fwd.AttemptTimeout = 10 * time.Second
	s, x := newTestServer(t, false, fwd)
	reg := prometheus.NewRegistry()
	s.h.Metrics = NewMetrics(reg, x, nil, nil)
	misses := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "weft_dns_cache_misses_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	if err := s.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(s.Close)
	const n = 8
	replies := make(chan *mdns.Msg, n)
	for range n {
		go func() {
			c := &mdns.Client{Net: "tcp", Timeout: 20 * time.Second}
			r, _, _ := c.Exchange(q("same.example.", mdns.TypeA), s.Addr())
			replies <- r
		}()
	}
	// Wait until every asker missed the cache (so none can be answered
	// from it) while the upstream holds its answer back.
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("all %d askers to reach the forwarder", n), func() bool { return misses() >= n })
	close(hold)
	for range n {
		if r := <-replies; r == nil || len(r.Answer) != 1 {
			t.Fatalf("reply: %v", r)
		}
	}
	if got := up.queries.Load(); got != 1 {
		t.Errorf("upstream asked %d times for one question, want 1", got)
	}
}
