package dns

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
)

// ask sends one query through Answer and unpacks the reply.
func ask(t *testing.T, s *Server, m *mdns.Msg, tcp bool) *mdns.Msg {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	raw := s.Answer(b, tcp)
	if raw == nil {
		t.Fatalf("no reply to %v", m.Question)
	}
	r := new(mdns.Msg)
	if err := r.Unpack(raw); err != nil {
		t.Fatalf("reply does not unpack: %v", err)
	}
	return r
}

func q(name string, qtype uint16) *mdns.Msg {
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

func answers(r *mdns.Msg) []string { return normAll(r.Answer) }

// TestIncremental: every change is visible to the next query, including to
// names whose packed reply the fast path had cached.
func TestIncremental(t *testing.T) {
	s, x := newTestServer(t, false, nil)
	api := "api.prod.svc." + zone
	if r := ask(t, s, q(api, mdns.TypeA), false); len(r.Answer) != 1 {
		t.Fatalf("api: %v", r)
	}
	old := service("prod", "api", []netip.Addr{nth(svcNet, 20)})
	moved := service("prod", "api", []netip.Addr{nth(svcNet, 21)})
	x.OnService(old, moved)
	if got, want := answers(ask(t, s, q(api, mdns.TypeA), false)), rrs(t, api+" A "+nth(svcNet, 21).String()); !slices.Equal(got, want) {
		t.Errorf("after update: %q, want %q", got, want)
	}
	if r := ask(t, s, q(rev(nth(svcNet, 20)), mdns.TypePTR), false); r.Rcode != mdns.RcodeServerFailure {
		t.Errorf("old PTR still served: %v", r)
	}
	x.OnService(moved, nil)
	for _, name := range []string{api, "prod.svc." + zone} {
		if r := ask(t, s, q(name, mdns.TypeA), false); r.Rcode != mdns.RcodeNameError {
			t.Errorf("%s after delete: %s", name, mdns.RcodeToString[r.Rcode])
		}
	}
	if r := ask(t, s, q("default.svc."+zone, mdns.TypeA), false); r.Rcode != mdns.RcodeSuccess {
		t.Errorf("default.svc still has services: %s", mdns.RcodeToString[r.Rcode])
	}
	// Endpoint turns not ready: the hostname disappears, the service keeps the rest.
	db := "db.default.svc." + zone
	before := slice("default", "db", "db-a", []port{{"pg", 5432, ""}},
		endpoint{nth(podNet, 1*256+5), "db-0", true}, endpoint{nth(podNet, 2*256+6), "", true}, endpoint{nth(podNet, 2*256+7), "db-2", false})
	after := slice("default", "db", "db-a", []port{{"pg", 5432, ""}},
		endpoint{nth(podNet, 1*256+5), "db-0", false}, endpoint{nth(podNet, 2*256+6), "", true}, endpoint{nth(podNet, 2*256+7), "db-2", true})
	ask(t, s, q("db-2."+db, mdns.TypeA), false)
	x.OnEndpointSlice(before, after)
	if r := ask(t, s, q("db-2."+db, mdns.TypeA), false); len(r.Answer) != 1 {
		t.Errorf("db-2 ready but not served: %v", r)
	}
	// db-0 keeps its IPv6 address from the other slice.
	if got, want := answers(ask(t, s, q("db-0."+db, mdns.TypeA), false)), []string(nil); !slices.Equal(got, want) {
		t.Errorf("db-0 A after not ready: %q", got)
	}
	if r := ask(t, s, q("db-0."+db, mdns.TypeAAAA), false); len(r.Answer) != 1 {
		t.Errorf("db-0 AAAA: %v", r)
	}
}

// TestBadObjects: a bad object is reported with its key and field and
// contributes nothing; the rest is served.
func TestBadObjects(t *testing.T) {
	var errs []error
	x := NewIndex(Config{Zone: "cluster.local", TTL: 5})
	x.OnError = func(err error) { errs = append(errs, err) }
	fixture(x)
	bad := service("default", "broken", nil)
	bad.Spec.ClusterIP, bad.Spec.ClusterIPs = "10.96.0.300", []string{"10.96.0.300"}
	x.OnService(nil, bad)
	ext := service("default", "badext", nil)
	ext.Spec.Type, ext.Spec.ExternalName = corev1.ServiceTypeExternalName, "bad name..example"
	x.OnService(nil, ext)
	long := service("default", strings.Repeat("x", 64), []netip.Addr{nth(svcNet, 99)})
	x.OnService(nil, long)
	want := []string{"Service default/broken: spec.clusterIPs[0]", "Service default/badext: spec.externalName", "Service default/" + strings.Repeat("x", 64) + ": metadata.name"}
	if len(errs) != len(want) {
		t.Fatalf("errors %v, want %d", errs, len(want))
	}
	for i, err := range errs {
		var oe *ObjectError
		if !errors.As(err, &oe) || !strings.HasPrefix(err.Error(), want[i]) {
			t.Errorf("error %q, want prefix %q", err, want[i])
		}
	}
	s := NewServer(&Handler{Index: x}, nil)
	for _, name := range []string{"broken", "badext"} {
		if r := ask(t, s, q(name+".default.svc."+zone, mdns.TypeA), false); r.Rcode != mdns.RcodeNameError {
			t.Errorf("%s: %s", name, mdns.RcodeToString[r.Rcode])
		}
	}
	if r := ask(t, s, q("web.default.svc."+zone, mdns.TypeA), false); len(r.Answer) != 1 {
		t.Errorf("web not served next to bad objects: %v", r)
	}
}

// TestNotSynced: before the first full sync, cluster names get SERVFAIL.
func TestNotSynced(t *testing.T) {
	x := NewIndex(Config{Zone: "cluster.local", TTL: 5})
	x.OnService(nil, service("default", "web", []netip.Addr{nth(svcNet, 10)}))
	s := NewServer(&Handler{Index: x}, nil)
	for _, name := range []string{"web.default.svc." + zone, "nope.default.svc." + zone} {
		for _, tcp := range []bool{false, true} {
			if r := ask(t, s, q(name, mdns.TypeA), tcp); r.Rcode != mdns.RcodeServerFailure {
				t.Errorf("%s before sync (tcp %v): %s", name, tcp, mdns.RcodeToString[r.Rcode])
			}
		}
	}
	x.SetSynced()
	if r := ask(t, s, q("web.default.svc."+zone, mdns.TypeA), false); len(r.Answer) != 1 {
		t.Errorf("after sync: %v", r)
	}
}

// TestBadQueries: malformed or unsupported queries get the right rcode, or
// are dropped, and the server keeps answering.
func TestBadQueries(t *testing.T) {
	s, _ := newTestServer(t, false, nil)
	web := "web.default.svc." + zone
	good := query(web, mdns.TypeA, false)
	chaos := q("version.bind.", mdns.TypeTXT)
	chaos.Question[0].Qclass = mdns.ClassCHAOS
	badvers := q(web, mdns.TypeA)
	badvers.SetEdns0(1232, false)
	badvers.IsEdns0().SetVersion(1)
	two := q(web, mdns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	notify := q(web, mdns.TypeSOA)
	notify.Opcode = mdns.OpcodeNotify
	update := q(zone, mdns.TypeSOA)
	update.Opcode = mdns.OpcodeUpdate
	none := new(mdns.Msg)
	none.Id = 7
	optq := q(web, mdns.TypeOPT)
	for _, c := range []struct {
		name  string
		m     *mdns.Msg
		rcode int
	}{
		{"class CHAOS", chaos, mdns.RcodeNotImplemented},
		{"EDNS version 1", badvers, mdns.RcodeBadVers},
		{"two questions", two, mdns.RcodeFormatError},
		{"no question", none, mdns.RcodeFormatError},
		{"NOTIFY", notify, mdns.RcodeNotImplemented},
		{"UPDATE", update, mdns.RcodeNotImplemented},
		{"qtype OPT", optq, mdns.RcodeFormatError},
	} {
		for _, tcp := range []bool{false, true} {
			if r := ask(t, s, c.m, tcp); r.Rcode != c.rcode {
				t.Errorf("%s (tcp %v): %s, want %s", c.name, tcp, mdns.RcodeToString[r.Rcode], mdns.RcodeToString[c.rcode])
			}
		}
	}
	long := make([]byte, 0, 600)
	long = append(long, good[:12]...)
	for range 5 { // 5 × 64 bytes: over the 255-byte name limit
		long = append(long, 63)
		long = append(long, strings.Repeat("a", 63)...)
	}
	long = append(long, 0, 0, 1, 0, 1)
	for _, c := range []struct {
		name    string
		pkt     []byte
		formerr bool
	}{
		{"empty", nil, false},
		{"short header", good[:5], false},
		{"header only, question missing", good[:12], true},
		{"cut question", good[:20], true},
		{"name over 255 bytes", long, true},
		{"compression loop", append(append([]byte{}, good[:12]...), 0xc0, 12, 0, 1, 0, 1), true},
		{"a reply", func() []byte { b := append([]byte{}, good...); b[2] |= 0x80; return b }(), false},
	} {
		r := s.Answer(c.pkt, false)
		switch {
		case !c.formerr && r != nil:
			t.Errorf("%s: answered %x, want dropped", c.name, r)
		case c.formerr && (len(r) < 12 || r[3]&0xf != mdns.RcodeFormatError || r[0] != c.pkt[0] || r[1] != c.pkt[1]):
			t.Errorf("%s: reply %x, want FORMERR with the query's ID", c.name, r)
		}
	}
	if r := ask(t, s, q(web, mdns.TypeA), false); len(r.Answer) != 1 {
		t.Errorf("not serving after bad queries: %v", r)
	}
}

// TestTruncation: an answer too large for UDP sets TC and fits; over TCP,
// or with a large enough EDNS0 buffer, it comes whole.
func TestTruncation(t *testing.T) {
	x := NewIndex(Config{Zone: "cluster.local", TTL: 5})
	x.OnService(nil, headless("default", "big"))
	var eps []endpoint
	const n = 100
	for i := range n {
		eps = append(eps, endpoint{nth(podNet, 256+i+1), "", true})
	}
	x.OnEndpointSlice(nil, slice("default", "big", "big-a", nil, eps...))
	x.SetSynced()
	s := NewServer(&Handler{Index: x}, nil)
	name := "big.default.svc." + zone
	for _, c := range []struct {
		name    string
		edns    uint16
		tcp, tc bool
		max     int
	}{
		{"udp 512", 0, false, true, 512},
		{"udp edns 1232", 1232, false, true, 1232},
		{"tcp", 0, true, false, 65535},
	} {
		m := q(name, mdns.TypeA)
		if c.edns > 0 {
			m.SetEdns0(c.edns, false)
		}
		b, _ := m.Pack()
		raw := s.Answer(b, c.tcp)
		r := new(mdns.Msg)
		if err := r.Unpack(raw); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r.Truncated != c.tc || len(raw) > c.max {
			t.Errorf("%s: TC %v (want %v), %d bytes (max %d)", c.name, r.Truncated, c.tc, len(raw), c.max)
		}
		if !c.tc && len(r.Answer) != n {
			t.Errorf("%s: %d answers, want %d", c.name, len(r.Answer), n)
		}
	}
}

// TestSharedNames: two owners contributing to one name (a pod address behind
// two headless Services has two PTRs); removing one owner keeps the other's.
func TestSharedNames(t *testing.T) {
	s, x := newTestServer(t, false, nil)
	ip := nth(podNet, 9*256+9)
	for _, name := range []string{"one", "two"} {
		x.OnService(nil, headless("default", name))
		x.OnEndpointSlice(nil, slice("default", name, name+"-a", nil, endpoint{ip, "", true}))
	}
	host := func(svc string) string { return DashedLabel(ip) + "." + svc + ".default.svc." + zone }
	got := answers(ask(t, s, q(rev(ip), mdns.TypePTR), false))
	if want := rrs(t, rev(ip)+" PTR "+host("one"), rev(ip)+" PTR "+host("two")); !slices.Equal(got, want) {
		t.Fatalf("shared PTR: %q, want %q", got, want)
	}
	x.OnService(headless("default", "one"), nil)
	got = answers(ask(t, s, q(rev(ip), mdns.TypePTR), false))
	if want := rrs(t, rev(ip)+" PTR "+host("two")); !slices.Equal(got, want) {
		t.Fatalf("after deleting one owner: %q, want %q", got, want)
	}
	if r := ask(t, s, q(host("one"), mdns.TypeA), false); r.Rcode != mdns.RcodeNameError {
		t.Errorf("deleted Service's endpoint name: %s", mdns.RcodeToString[r.Rcode])
	}
}
