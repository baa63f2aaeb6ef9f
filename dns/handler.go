package dns

import (
	"context"
	"strings"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
)

// ServerUDPSize is the EDNS0 UDP payload size weft-dns advertises (the
// DNS flag day 2020 value: no IP fragmentation on common paths).
const ServerUDPSize = 1232

// Handler answers queries: cluster names from the Index, every other name
// through the Cache and the Forwarder.
type Handler struct {
	Index   *Index
	Forward *Forwarder // nil: no upstream (SERVFAIL for other names)
	Cache   *Cache     // nil: no cache
	Metrics *Metrics   // nil: no metrics
	// ForwardTimeout bounds one forwarded query (default 5s).
	ForwardTimeout time.Duration

	mu      sync.Mutex
	flights map[cacheKey]*flight // forwarded questions in progress
}

// flight is one upstream exchange that concurrent askers of the same
// question wait for, instead of each sending their own.
type flight struct {
	done chan struct{}
	msg  *mdns.Msg
	err  error
}

// Resolve answers req. For UDP the reply is truncated (TC) to what the
// client can take; for TCP it is sent whole. It never returns nil.
func (h *Handler) Resolve(ctx context.Context, req *mdns.Msg, tcp bool) *mdns.Msg {
	resp := h.resolve(ctx, req)
	if opt := req.IsEdns0(); opt != nil && resp.IsEdns0() == nil {
		resp.SetEdns0(ServerUDPSize, false)
		if resp.Rcode > 0xF {
			resp.IsEdns0().SetExtendedRcode(uint16(resp.Rcode))
		}
	}
	if !tcp {
		size := 512
		if opt := req.IsEdns0(); opt != nil && int(opt.UDPSize()) > size {
			size = min(int(opt.UDPSize()), ServerUDPSize)
		}
		resp.Truncate(size)
	}
	h.Metrics.rcode(resp.Rcode)
	return resp
}

func reply(req *mdns.Msg, rcode int) *mdns.Msg {
	m := new(mdns.Msg)
	m.Id = req.Id
	m.Response = true
	m.Opcode = req.Opcode
	m.RecursionDesired = req.RecursionDesired
	m.CheckingDisabled = req.CheckingDisabled
	m.RecursionAvailable = true
	m.Rcode = rcode
	if len(req.Question) == 1 {
		m.Question = []mdns.Question{req.Question[0]}
	}
	return m
}

func (h *Handler) resolve(ctx context.Context, req *mdns.Msg) *mdns.Msg {
	switch {
	case req.Response:
		return reply(req, mdns.RcodeFormatError)
	case req.Opcode != mdns.OpcodeQuery:
		return reply(req, mdns.RcodeNotImplemented)
	case len(req.Question) != 1 || len(req.Answer) != 0 || len(req.Ns) != 0:
		return reply(req, mdns.RcodeFormatError)
	}
	if opt := req.IsEdns0(); opt != nil {
		if opt.Version() != 0 {
			m := reply(req, mdns.RcodeBadVers)
			m.SetEdns0(ServerUDPSize, false)
			m.IsEdns0().SetExtendedRcode(mdns.RcodeBadVers)
			m.Rcode = mdns.RcodeBadVers
			return m
		}
	}
	q := req.Question[0]
	switch {
	case q.Qclass != mdns.ClassINET && q.Qclass != mdns.ClassANY:
		return reply(req, mdns.RcodeNotImplemented)
	case q.Qtype == mdns.TypeAXFR || q.Qtype == mdns.TypeIXFR:
		return reply(req, mdns.RcodeRefused)
	case q.Qtype == mdns.TypeOPT || q.Qtype == mdns.TypeTSIG || q.Qtype == mdns.TypeTKEY || q.Qtype == 0:
		return reply(req, mdns.RcodeFormatError)
	}
	name := strings.ToLower(q.Name)
	node, exists := h.Index.Lookup(name)
	inZone := h.Index.InZone(name)
	if inZone && !h.Index.Synced() {
		return reply(req, mdns.RcodeServerFailure)
	}
	if node != nil || exists || inZone {
		m := reply(req, mdns.RcodeSuccess)
		h.authoritative(ctx, m, node, name, q.Qtype)
		return m
	}
	return h.forward(ctx, req, q, name)
}

// authoritative fills m from the index: records, NODATA or NXDOMAIN (with
// the zone's SOA), a CNAME and what its target holds.
func (h *Handler) authoritative(ctx context.Context, m *mdns.Msg, node *Node, name string, qtype uint16) {
	m.Authoritative = true
	if node == nil {
		_, exists := h.Index.Lookup(name)
		if !exists {
			m.Rcode = mdns.RcodeNameError
		}
		m.Ns = []mdns.RR{h.Index.SOA()}
		return
	}
	if node.CNAME != nil && qtype != mdns.TypeCNAME {
		m.Answer = append(m.Answer, node.CNAME)
		if qtype != mdns.TypeANY {
			h.chase(ctx, m, node.CNAME.Target, qtype)
		}
		return
	}
	if qtype == mdns.TypeANY {
		m.Answer = append(m.Answer, node.RRs...)
		return
	}
	rrs := node.Get(qtype)
	if len(rrs) == 0 {
		m.Ns = []mdns.RR{h.Index.SOA()}
		return
	}
	m.Answer = rrs
	if qtype == mdns.TypeSRV {
		done := map[string]bool{}
		for _, rr := range rrs {
			t := rr.(*mdns.SRV).Target
			if done[t] {
				continue
			}
			done[t] = true
			if tn, _ := h.Index.Lookup(t); tn != nil {
				m.Extra = append(m.Extra, tn.Get(mdns.TypeA)...)
				m.Extra = append(m.Extra, tn.Get(mdns.TypeAAAA)...)
			}
		}
	}
}

// chase adds what an ExternalName's target holds: from the index when the
// target is a cluster name, else from upstream (nothing when that fails:
// the client still has the CNAME).
func (h *Handler) chase(ctx context.Context, m *mdns.Msg, target string, qtype uint16) {
	if tn, _ := h.Index.Lookup(target); tn != nil {
		m.Answer = append(m.Answer, tn.Get(qtype)...)
		return
	}
	if h.Index.InZone(target) {
		return
	}
	r, err := h.lookupUpstream(ctx, mdns.Question{Name: target, Qtype: qtype, Qclass: mdns.ClassINET}, target, false)
	if err == nil && r.Rcode == mdns.RcodeSuccess {
		m.Answer = append(m.Answer, r.Answer...)
	}
}

func (h *Handler) forward(ctx context.Context, req *mdns.Msg, q mdns.Question, name string) *mdns.Msg {
	do := false
	if opt := req.IsEdns0(); opt != nil {
		do = opt.Do()
	}
	r, err := h.lookupUpstream(ctx, q, name, do)
	if err != nil {
		return reply(req, mdns.RcodeServerFailure)
	}
	m := reply(req, r.Rcode)
	m.RecursionAvailable = r.RecursionAvailable
	m.AuthenticatedData = r.AuthenticatedData
	m.Answer, m.Ns = r.Answer, r.Ns
	for _, rr := range r.Extra {
		if rr.Header().Rrtype != mdns.TypeOPT {
			m.Extra = append(m.Extra, rr)
		}
	}
	return m
}

// lookupUpstream answers from the cache or the forwarder, caching answers.
func (h *Handler) lookupUpstream(ctx context.Context, q mdns.Question, name string, do bool) (*mdns.Msg, error) {
	key := cacheKey{name: name, qtype: q.Qtype, qclass: q.Qclass, do: do}
	if r := h.Cache.Get(key, time.Now()); r != nil {
		h.Metrics.cacheHit()
		return r, nil
	}
	h.Metrics.cacheMiss()
	if h.Forward == nil {
		return nil, errNoUpstream
	}
	h.mu.Lock()
	if f := h.flights[key]; f != nil {
		h.mu.Unlock()
		select {
		case <-f.done:
			if f.err != nil {
				return nil, f.err
			}
			return f.msg.Copy(), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f := &flight{done: make(chan struct{})}
	if h.flights == nil {
		h.flights = map[cacheKey]*flight{}
	}
	h.flights[key] = f
	h.mu.Unlock()
	f.msg, f.err = h.exchange(ctx, q, key, do)
	h.mu.Lock()
	delete(h.flights, key)
	h.mu.Unlock()
	close(f.done)
	if f.err != nil {
		return nil, f.err
	}
	return f.msg.Copy(), nil
}

func (h *Handler) exchange(ctx context.Context, q mdns.Question, key cacheKey, do bool) (*mdns.Msg, error) {
	to := h.ForwardTimeout
	if to == 0 {
		to = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	r, err := h.Forward.Exchange(ctx, q, do)
	if err != nil {
		return nil, err
	}
	h.Cache.Put(key, r, time.Now())
	return r, nil
}
