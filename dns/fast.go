package dns

// The fast path answers the common query (one question, class IN, no
// compression, optional EDNS0 version 0, a name of [a-z0-9-_] labels) for
// cluster names straight from bytes: the name is lower-cased into a stack
// buffer, looked up without allocating, and the reply is a copy of a packed
// reply cached on the index node, with the query's ID, RD bit and question
// (the client's case) patched in and an OPT record appended for EDNS0.
// Everything else goes to the general path (Handler), which also fills the
// node caches.

import (
	"context"
	"encoding/binary"

	mdns "github.com/miekg/dns"
)

// Answer slots cached per node.
const (
	slotA = iota
	slotAAAA
	slotSRV
	slotPTR
	slotTXT
	slotSOA
	numSlots
)

func slotOf(t uint16) int {
	switch t {
	case mdns.TypeA:
		return slotA
	case mdns.TypeAAAA:
		return slotAAAA
	case mdns.TypeSRV:
		return slotSRV
	case mdns.TypePTR:
		return slotPTR
	case mdns.TypeTXT:
		return slotTXT
	case mdns.TypeSOA:
		return slotSOA
	}
	return -1
}

type packedReply struct {
	msg   []byte // ID 0, RD 0, no OPT, lower-case question
	rcode int
}

// optRR is an OPT record advertising ServerUDPSize, version 0, no flags.
var optRR = []byte{0, 0, 41, ServerUDPSize >> 8, ServerUDPSize & 0xff, 0, 0, 0, 0, 0, 0}

// fastQuery is what the fast path parsed from a query.
type fastQuery struct {
	nameEnd int    // offset after the question's name
	qtype   uint16 // question type
	edns    bool   // the query has an OPT record
	udpSize int    // what the client accepts
}

// parseFast parses q into name (presentation form, lower case, with the
// final dot); ok is false for anything the fast path does not handle.
func parseFast(q []byte, name []byte) (fq fastQuery, n int, ok bool) {
	if len(q) < 17 || q[2]&0xF8 != 0 || q[2]&0x02 != 0 || // QR, opcode, TC
		binary.BigEndian.Uint16(q[4:]) != 1 || q[6]|q[7]|q[8]|q[9] != 0 || q[10] != 0 || q[11] > 1 {
		return fq, 0, false
	}
	off := 12
	for {
		if off >= len(q) {
			return fq, 0, false
		}
		l := int(q[off])
		off++
		if l == 0 {
			break
		}
		if l > 63 || off+l > len(q) || n+l+1 > len(name) {
			return fq, 0, false
		}
		for _, c := range q[off : off+l] {
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c >= 'A' && c <= 'Z':
				c += 'a' - 'A'
			default:
				return fq, 0, false
			}
			name[n] = c
			n++
		}
		name[n] = '.'
		n++
		off += l
	}
	if n == 0 || off-12 > 255 || off+4 > len(q) {
		return fq, 0, false
	}
	fq.nameEnd = off
	fq.qtype = binary.BigEndian.Uint16(q[off:])
	if binary.BigEndian.Uint16(q[off+2:]) != mdns.ClassINET {
		return fq, 0, false
	}
	off += 4
	fq.udpSize = 512
	if q[11] == 1 { // one additional record: it must be OPT, version 0
		if off+11 > len(q) || q[off] != 0 || binary.BigEndian.Uint16(q[off+1:]) != mdns.TypeOPT || q[off+6] != 0 {
			return fq, 0, false
		}
		fq.edns = true
		if s := int(binary.BigEndian.Uint16(q[off+3:])); s > fq.udpSize {
			fq.udpSize = min(s, ServerUDPSize)
		}
		off += 11 + int(binary.BigEndian.Uint16(q[off+9:]))
	}
	if off != len(q) {
		return fq, 0, false
	}
	return fq, n, true
}

// fastReply writes the reply to q into out and returns it, or nil when the
// general path must answer.
func (s *Server) fastReply(q, out []byte) []byte {
	var nameBuf [256]byte
	fq, n, ok := parseFast(q, nameBuf[:])
	if !ok {
		return nil
	}
	x := s.h.Index
	node, exists := x.lookupBytes(nameBuf[:n])
	if !x.Synced() {
		return nil
	}
	qlen := fq.nameEnd + 4 - 12
	if node == nil {
		if exists || !x.inZoneBytes(nameBuf[:n]) {
			return nil
		}
		// NXDOMAIN with the zone's SOA.
		soa := s.soaWire
		need := 12 + qlen + len(soa) + len(optRR)
		if need > fq.udpSize || need > cap(out) {
			return nil
		}
		out = out[:12]
		out[0], out[1] = q[0], q[1]
		out[2] = 0x84 | q[2]&0x01           // QR AA RD
		out[3] = 0x80 | mdns.RcodeNameError // RA
		out[3] |= q[3] & 0x10               // CD
		binary.BigEndian.PutUint16(out[4:], 1)
		binary.BigEndian.PutUint16(out[6:], 0)
		binary.BigEndian.PutUint16(out[8:], 1)
		binary.BigEndian.PutUint16(out[10:], 0)
		out = append(out, q[12:12+qlen]...)
		out = append(out, soa...)
		if fq.edns {
			out = append(out, optRR...)
			out[11] = 1
		}
		s.h.Metrics.fastPath(mdns.RcodeNameError)
		return out
	}
	slot := slotOf(fq.qtype)
	if node.CNAME != nil || slot < 0 {
		return nil
	}
	p := node.packed[slot].Load()
	if p == nil {
		p = s.pack(node, fq.qtype)
		if p == nil {
			return nil
		}
		node.packed[slot].Store(p)
	}
	need := len(p.msg)
	if fq.edns {
		need += len(optRR)
	}
	if need > fq.udpSize || need > cap(out) || len(p.msg) < 12+qlen {
		return nil
	}
	out = append(out[:0], p.msg...)
	out[0], out[1] = q[0], q[1]
	out[2] |= q[2] & 0x01
	out[3] |= q[3] & 0x10
	copy(out[12:12+qlen], q[12:12+qlen])
	if fq.edns {
		out = append(out, optRR...)
		binary.BigEndian.PutUint16(out[10:], binary.BigEndian.Uint16(out[10:])+1)
	}
	s.h.Metrics.fastPath(p.rcode)
	return out
}

// pack builds the cached reply of node for qtype with the general path.
func (s *Server) pack(node *Node, qtype uint16) *packedReply {
	req := new(mdns.Msg)
	req.Question = []mdns.Question{{Name: node.Name, Qtype: qtype, Qclass: mdns.ClassINET}}
	m := reply(req, mdns.RcodeSuccess)
	s.h.authoritative(context.Background(), m, node, node.Name, qtype)
	m.Compress = true
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return &packedReply{msg: b, rcode: m.Rcode}
}

func (x *Index) lookupBytes(name []byte) (*Node, bool) {
	x.mu.RLock()
	n := x.node[string(name)]
	exists := n != nil || x.ent[string(name)] > 0
	x.mu.RUnlock()
	return n, exists
}

func (x *Index) inZoneBytes(name []byte) bool {
	z := x.cfg.Zone
	if len(name) < len(z) || string(name[len(name)-len(z):]) != z {
		return false
	}
	return len(name) == len(z) || name[len(name)-len(z)-1] == '.'
}
