package dns

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	mdns "github.com/miekg/dns"
)

const zone = "cluster.local."

// rrs parses expected records, written as zone-file lines without TTL and
// class.
func rrs(t *testing.T, lines ...string) []string {
	t.Helper()
	var out []string
	for _, l := range lines {
		rr, err := mdns.NewRR(l)
		if err != nil {
			t.Fatalf("bad expected record %q: %v", l, err)
		}
		out = append(out, norm(rr))
	}
	slices.Sort(out)
	return out
}

// norm is a record without its TTL, in lower case.
func norm(rr mdns.RR) string {
	rr = mdns.Copy(rr)
	rr.Header().Ttl = 0
	return strings.ToLower(rr.String())
}

func normAll(rs []mdns.RR) []string {
	var out []string
	for _, rr := range rs {
		if rr.Header().Rrtype != mdns.TypeOPT {
			out = append(out, norm(rr))
		}
	}
	slices.Sort(out)
	return out
}

type specCase struct {
	name   string
	q      string
	qtype  uint16
	rcode  int
	answer []string
	extra  []string // checked when not nil
	soa    bool     // the zone's SOA is in the authority section
	pods   bool     // ask the index with pod records on
}

func specCases(t *testing.T) []specCase {
	web4, web6 := nth(svcNet, 10), nth(svcNet6, 10)
	db0, db1, db2 := nth(podNet, 1*256+5), nth(podNet, 2*256+6), nth(podNet, 2*256+7)
	db0v6 := nth(podNet6, 5)
	worker := nth(podNet, 5*256+3)
	peer := nth(podNet, 3*256+9)
	client := nth(podNet, 1*256+20)
	v6pod4, v6pod6 := nth(podNet, 2*256+30), nth(podNet6, 30)
	web := "web.default.svc." + zone
	db := "db.default.svc." + zone
	return []specCase{
		{name: "dns-version", q: "dns-version." + zone, qtype: mdns.TypeTXT, answer: rrs(t, `dns-version.cluster.local. TXT "1.1.0"`)},
		{name: "zone SOA", q: zone, qtype: mdns.TypeSOA, answer: rrs(t, SOA(Config{Zone: zone, TTL: 5}).String())},
		{name: "ClusterIP A", q: web, qtype: mdns.TypeA, answer: rrs(t, web+" A "+web4.String())},
		{name: "ClusterIP AAAA (dual-stack)", q: web, qtype: mdns.TypeAAAA, answer: rrs(t, web+" AAAA "+web6.String())},
		{name: "case-insensitive", q: "WeB.DEFAULT.svc.Cluster.LOCAL.", qtype: mdns.TypeA, answer: rrs(t, web+" A "+web4.String())},
		{name: "ClusterIP SRV tcp", q: "_http._tcp." + web, qtype: mdns.TypeSRV,
			answer: rrs(t, "_http._tcp."+web+" SRV 0 100 80 "+web), extra: rrs(t, web+" A "+web4.String(), web+" AAAA "+web6.String())},
		{name: "ClusterIP SRV udp", q: "_dns._udp." + web, qtype: mdns.TypeSRV, answer: rrs(t, "_dns._udp."+web+" SRV 0 100 53 "+web)},
		{name: "SRV wrong protocol", q: "_http._udp." + web, qtype: mdns.TypeSRV, rcode: mdns.RcodeNameError, soa: true},
		{name: "unnamed port has no SRV", q: "_._tcp." + web, qtype: mdns.TypeSRV, rcode: mdns.RcodeNameError, soa: true},
		{name: "NODATA other type", q: web, qtype: mdns.TypeTXT, soa: true},
		{name: "NODATA unknown type", q: web, qtype: 65280, soa: true},
		{name: "NODATA empty non-terminal", q: "default.svc." + zone, qtype: mdns.TypeA, soa: true},
		{name: "NODATA SRV parent", q: "_tcp." + web, qtype: mdns.TypeSRV, soa: true},
		{name: "PTR ClusterIP", q: rev(web4), qtype: mdns.TypePTR, answer: rrs(t, rev(web4)+" PTR "+web)},
		{name: "PTR ClusterIP v6", q: rev(web6), qtype: mdns.TypePTR, answer: rrs(t, rev(web6)+" PTR "+web)},
		{name: "headless A: ready endpoints only", q: db, qtype: mdns.TypeA,
			answer: rrs(t, db+" A "+db0.String(), db+" A "+db1.String(), db+" A "+worker.String())},
		{name: "headless AAAA", q: db, qtype: mdns.TypeAAAA, answer: rrs(t, db+" AAAA "+db0v6.String())},
		{name: "headless hostname A", q: "db-0." + db, qtype: mdns.TypeA, answer: rrs(t, "db-0."+db+" A "+db0.String())},
		{name: "headless hostname AAAA", q: "db-0." + db, qtype: mdns.TypeAAAA, answer: rrs(t, "db-0."+db+" AAAA "+db0v6.String())},
		{name: "headless endpoint without hostname", q: DashedLabel(db1) + "." + db, qtype: mdns.TypeA, answer: rrs(t, DashedLabel(db1)+"."+db+" A "+db1.String())},
		{name: "headless not-ready hostname", q: "db-2." + db, qtype: mdns.TypeNS, rcode: mdns.RcodeNameError, soa: true},
		{name: "headless not-ready address", q: rev(db2), qtype: mdns.TypePTR, rcode: mdns.RcodeServerFailure}, // not ours: forwarded, no upstream
		{name: "headless SRV per endpoint", q: "_pg._tcp." + db, qtype: mdns.TypeSRV,
			answer: rrs(t, "_pg._tcp."+db+" SRV 0 50 5432 db-0."+db, "_pg._tcp."+db+" SRV 0 50 5432 "+DashedLabel(db1)+"."+db),
			extra:  rrs(t, "db-0."+db+" A "+db0.String(), "db-0."+db+" AAAA "+db0v6.String(), DashedLabel(db1)+"."+db+" A "+db1.String())},
		{name: "headless PTR", q: rev(db0), qtype: mdns.TypePTR, answer: rrs(t, rev(db0)+" PTR db-0."+db)},
		{name: "pod hostname.subdomain", q: "worker-1." + db, qtype: mdns.TypeA, answer: rrs(t, "worker-1."+db+" A "+worker.String())},
		{name: "publishNotReadyAddresses", q: "peers.default.svc." + zone, qtype: mdns.TypeA, answer: rrs(t, "peers.default.svc."+zone+" A "+peer.String())},
		{name: "publishNotReadyAddresses SRV", q: "_gossip._udp.peers.default.svc." + zone, qtype: mdns.TypeSRV,
			answer: rrs(t, "_gossip._udp.peers.default.svc."+zone+" SRV 0 100 7000 p-0.peers.default.svc."+zone)},
		{name: "headless without ready endpoints", q: "empty.default.svc." + zone, qtype: mdns.TypeA, rcode: mdns.RcodeNameError, soa: true},
		{name: "ExternalName CNAME", q: "search.default.svc." + zone, qtype: mdns.TypeCNAME, answer: rrs(t, "search.default.svc."+zone+" CNAME "+web)},
		{name: "ExternalName A follows the CNAME", q: "search.default.svc." + zone, qtype: mdns.TypeA,
			answer: rrs(t, "search.default.svc."+zone+" CNAME "+web, web+" A "+web4.String())},
		{name: "NXDOMAIN with SOA", q: "nope.default.svc." + zone, qtype: mdns.TypeA, rcode: mdns.RcodeNameError, soa: true},
		{name: "NXDOMAIN other namespace", q: "web.prod.svc." + zone, qtype: mdns.TypeA, rcode: mdns.RcodeNameError, soa: true},
		{name: "other namespace", q: "api.prod.svc." + zone, qtype: mdns.TypeA, answer: rrs(t, "api.prod.svc."+zone+" A "+nth(svcNet, 20).String())},
		{name: "pod records off by default", q: DashedLabel(client) + ".default.pod." + zone, qtype: mdns.TypeA, rcode: mdns.RcodeNameError, soa: true},
		{name: "pod A (verified)", pods: true, q: DashedLabel(client) + ".default.pod." + zone, qtype: mdns.TypeA,
			answer: rrs(t, DashedLabel(client)+".default.pod."+zone+" A "+client.String())},
		{name: "pod A wrong namespace", pods: true, q: DashedLabel(client) + ".prod.pod." + zone, qtype: mdns.TypeA, rcode: mdns.RcodeNameError, soa: true},
		{name: "pod A no such pod", pods: true, q: DashedLabel(nth(podNet, 9*256+9)) + ".default.pod." + zone, qtype: mdns.TypeA, rcode: mdns.RcodeNameError, soa: true},
		{name: "pod AAAA", pods: true, q: DashedLabel(v6pod6) + ".prod.pod." + zone, qtype: mdns.TypeAAAA,
			answer: rrs(t, DashedLabel(v6pod6)+".prod.pod."+zone+" AAAA "+v6pod6.String())},
		{name: "pod A of a dual-stack pod", pods: true, q: DashedLabel(v6pod4) + ".prod.pod." + zone, qtype: mdns.TypeA,
			answer: rrs(t, DashedLabel(v6pod4)+".prod.pod."+zone+" A "+v6pod4.String())},
		{name: "other zone, no upstream", q: "example.com.", qtype: mdns.TypeA, rcode: mdns.RcodeServerFailure},
		{name: "zone transfer refused", q: zone, qtype: mdns.TypeAXFR, rcode: mdns.RcodeRefused},
	}
}

// newTestServer is a server over the fixture, without sockets.
func newTestServer(t testing.TB, podRecords bool, fwd *Forwarder) (*Server, *Index) {
	x := NewIndex(Config{Zone: "cluster.local", TTL: 5, PodRecords: podRecords})
	x.OnError = func(err error) { t.Errorf("unexpected object error: %v", err) }
	fixture(x)
	return NewServer(&Handler{Index: x, Forward: fwd, Cache: NewCache(100, 3600e9, 300e9)}, nil), x
}

func query(name string, qtype uint16, edns bool) []byte {
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 4242
	if edns {
		m.SetEdns0(4096, false)
	}
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

// TestSpec asks every case over each path a query can take: UDP without
// and with EDNS0 (the fast path where it applies, twice so that the cached
// packed reply is used), and TCP (the general path).
func TestSpec(t *testing.T) {
	servers := map[bool]*Server{}
	servers[false], _ = newTestServer(t, false, nil)
	servers[true], _ = newTestServer(t, true, nil)
	for _, c := range specCases(t) {
		t.Run(c.name, func(t *testing.T) {
			s := servers[c.pods]
			for _, path := range []struct {
				name      string
				edns, tcp bool
			}{{"udp", false, false}, {"udp again", false, false}, {"udp+edns", true, false}, {"udp+edns again", true, false}, {"tcp", false, true}} {
				raw := s.Answer(query(c.q, c.qtype, path.edns), path.tcp)
				if raw == nil {
					t.Fatalf("%s: no reply", path.name)
				}
				m := new(mdns.Msg)
				if err := m.Unpack(raw); err != nil {
					t.Fatalf("%s: reply does not unpack: %v", path.name, err)
				}
				checkReply(t, path.name, c, m, path.edns)
			}
		})
	}
}

func checkReply(t *testing.T, path string, c specCase, m *mdns.Msg, edns bool) {
	t.Helper()
	where := fmt.Sprintf("%s %s %s", path, c.q, mdns.TypeToString[c.qtype])
	if m.Id != 4242 || !m.Response {
		t.Errorf("%s: id %d response %v", where, m.Id, m.Response)
	}
	if m.Rcode != c.rcode {
		t.Errorf("%s: rcode %s, want %s", where, mdns.RcodeToString[m.Rcode], mdns.RcodeToString[c.rcode])
	}
	if len(m.Question) != 1 || m.Question[0].Name != c.q {
		t.Errorf("%s: question %v, want the query's own name %q", where, m.Question, c.q)
	}
	if got := normAll(m.Answer); !slices.Equal(got, c.answer) {
		t.Errorf("%s: answer\n got %q\nwant %q", where, got, c.answer)
	}
	if c.extra != nil {
		if got := normAll(m.Extra); !slices.Equal(got, c.extra) {
			t.Errorf("%s: additional\n got %q\nwant %q", where, got, c.extra)
		}
	}
	hasSOA := len(m.Ns) == 1 && m.Ns[0].Header().Rrtype == mdns.TypeSOA && m.Ns[0].Header().Name == zone
	if hasSOA != c.soa {
		t.Errorf("%s: authority %v, want SOA: %v", where, m.Ns, c.soa)
	}
	if c.rcode == mdns.RcodeSuccess || c.rcode == mdns.RcodeNameError {
		if !m.Authoritative {
			t.Errorf("%s: not authoritative", where)
		}
	}
	if (m.IsEdns0() != nil) != edns {
		t.Errorf("%s: EDNS0 in reply %v, in query %v", where, m.IsEdns0() != nil, edns)
	}
	for _, rr := range m.Answer {
		if rr.Header().Ttl != 5 {
			t.Errorf("%s: TTL %d, want --ttl 5: %v", where, rr.Header().Ttl, rr)
		}
	}
}

// TestFastPath checks that plain queries for cluster names are answered by
// the fast path, without allocating, and that it hands what it does not
// handle to the general path.
func TestFastPath(t *testing.T) {
	s, _ := newTestServer(t, false, nil)
	out := make([]byte, 0, 4096)
	web := "web.default.svc." + zone
	for _, q := range [][]byte{
		query(web, mdns.TypeA, false),
		query("WEB.default.svc."+zone, mdns.TypeA, true),
		query("_http._tcp."+web, mdns.TypeSRV, true),
		query("nope.default.svc."+zone, mdns.TypeA, true), // NXDOMAIN
		query(rev(nth(svcNet, 10)), mdns.TypePTR, false),
	} {
		s.Answer(q, false) // fills the node's packed reply
		if s.fastReply(q, out) == nil {
			t.Errorf("fast path did not answer %x", q)
		}
		if n := testing.AllocsPerRun(100, func() { s.fastReply(q, out) }); n != 0 {
			t.Errorf("fast path allocates %.0f times per query", n)
		}
	}
	for _, q := range [][]byte{
		query("example.com.", mdns.TypeA, false),               // forwarded
		query("search.default.svc."+zone, mdns.TypeA, false),   // CNAME chase
		query("default.svc."+zone, mdns.TypeA, false),          // empty non-terminal
		query(web, mdns.TypeNS, false),                         // no slot
		append(query(web, mdns.TypeA, false), 0),               // trailing byte
		query(strings.Repeat("a", 63)+".\\.x."+zone, 1, false), // escaped dot
	} {
		if s.fastReply(q, out) != nil {
			t.Errorf("fast path answered %x", q)
		}
	}
}
