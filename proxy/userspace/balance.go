package userspace

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// picker chooses a listener's endpoints: round robin over the list, or,
// with ClientIP affinity, the endpoint a client last got while it is listed
// and its timeout (counted from the client's last new connection or
// session) has not passed.
type picker struct {
	rr  atomic.Uint64
	now func() time.Time

	mu      sync.Mutex
	timeout time.Duration
	clients map[netip.Addr]sticky
}

type sticky struct {
	ep    netip.AddrPort
	until time.Time
}

// rotate returns eps starting at index start, wrapping: the order in which
// a new connection tries them.
func rotate(eps []netip.AddrPort, start int) []netip.AddrPort {
	start %= len(eps)
	return slices.Concat(eps[start:], eps[:start])
}

// order returns the order in which client's new connection tries eps
// (not empty): its remembered endpoint first, if any, then the round robin.
func (p *picker) order(client netip.Addr, eps []netip.AddrPort, affinity time.Duration) []netip.AddrPort {
	if affinity > 0 {
		p.mu.Lock()
		s, ok := p.clients[client]
		p.mu.Unlock()
		if ok && p.now().Before(s.until) {
			if i := slices.Index(eps, s.ep); i >= 0 {
				return rotate(eps, i)
			}
		}
	}
	return rotate(eps, int(p.rr.Add(1)-1))
}

// chose records that client's new connection went to ep.
func (p *picker) chose(client netip.Addr, ep netip.AddrPort, affinity time.Duration) {
	if affinity <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clients == nil {
		p.clients = map[netip.Addr]sticky{}
	}
	p.clients[client] = sticky{ep, p.now().Add(affinity)}
}

// setAffinity takes a listener's affinity timeout from a sync: a changed
// timeout (or none) forgets every client, as a Service whose affinity
// changed starts afresh; expired entries go.
func (p *picker) setAffinity(timeout time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if timeout != p.timeout {
		p.timeout, p.clients = timeout, nil
		return
	}
	now := p.now()
	for c, s := range p.clients {
		if !now.Before(s.until) {
			delete(p.clients, c)
		}
	}
}
