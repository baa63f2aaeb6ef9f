package dns

import (
	"testing"

	mdns "github.com/miekg/dns"
)

// BenchmarkFastPath is one cached cluster answer from bytes to bytes.
func BenchmarkFastPath(b *testing.B) {
	s, _ := newTestServer(b, false, nil)
	q := query("web.default.svc."+zone, mdns.TypeA, true)
	s.Answer(q, false)
	out := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		if s.fastReply(q, out) == nil {
			b.Fatal("not answered by the fast path")
		}
	}
}

// BenchmarkGeneralPath is the same query through miekg/dns (as over TCP).
func BenchmarkGeneralPath(b *testing.B) {
	s, _ := newTestServer(b, false, nil)
	q := query("web.default.svc."+zone, mdns.TypeA, true)
	b.ReportAllocs()
	for b.Loop() {
		if s.Answer(q, true) == nil {
			b.Fatal("no answer")
		}
	}
}
