package dns

import (
	"testing"

	mdns "github.com/miekg/dns"
)

// FuzzAnswer feeds arbitrary packets to the query path (fast and general,
// UDP and TCP). A packet gets a reply that unpacks, carries its ID and is
// no bigger than the client allows, or it is dropped; nothing panics, and
// the server still answers a good query afterwards. The seed corpus holds
// the spec cases plus broken packets; go test runs the seeds, and
// `go test -fuzz FuzzAnswer ./dns` explores further.
func FuzzAnswer(f *testing.F) {
	t := &testing.T{}
	for _, c := range specCases(t) {
		f.Add(query(c.q, c.qtype, false), false)
		f.Add(query(c.q, c.qtype, true), false)
	}
	good := query("web.default.svc."+zone, mdns.TypeA, true)
	f.Add(good[:12], false)
	f.Add(good[:len(good)-3], false)
	f.Add(append(append([]byte{}, good[:12]...), 0xc0, 12, 0, 1, 0, 1), false)
	f.Add(append(append([]byte{}, good...), 0xff), true)
	f.Add([]byte{}, false)
	badOpt := append([]byte{}, good...)
	badOpt[len(badOpt)-2] = 0xff // OPT rdata length past the end
	f.Add(badOpt, false)
	s, _ := newTestServer(f, true, nil)
	f.Fuzz(func(t *testing.T, pkt []byte, tcp bool) {
		r := s.Answer(pkt, tcp)
		if r == nil {
			return
		}
		if len(pkt) < 12 {
			t.Fatalf("answered a packet shorter than a header: %x", pkt)
		}
		if r[0] != pkt[0] || r[1] != pkt[1] || r[2]&0x80 == 0 {
			t.Fatalf("reply %x does not carry the query's ID or QR", r)
		}
		m := new(mdns.Msg)
		if err := m.Unpack(r); err != nil && len(r) > 12 {
			t.Fatalf("reply does not unpack: %v\nquery %x\nreply %x", err, pkt, r)
		}
		if !tcp && len(r) > ServerUDPSize {
			t.Fatalf("UDP reply of %d bytes", len(r))
		}
		if ok := s.Answer(good, false); ok == nil {
			t.Fatal("good query unanswered")
		}
	})
}
