package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	mdns "github.com/miekg/dns"
)

var errNoUpstream = errors.New("no upstream configured")

// Forwarder sends queries for non-cluster names to upstream servers in
// order, failing over to the next one on a timeout, a network error,
// SERVFAIL or REFUSED. An upstream that failed is marked down and tried only
// after the healthy ones until a health probe (Run) or a later answer
// brings it back.
type Forwarder struct {
	ups []*upstream
	// AttemptTimeout bounds one try against one upstream (default 1s).
	AttemptTimeout time.Duration
	// HealthInterval is how often down upstreams are probed (default 2s).
	HealthInterval time.Duration
	Metrics        *Metrics
}

type upstream struct {
	addr string
	down atomic.Bool
}

// NewForwarder returns a forwarder to addrs ("host" or "host:port").
func NewForwarder(addrs []string) (*Forwarder, error) {
	if len(addrs) == 0 {
		return nil, errNoUpstream
	}
	f := &Forwarder{}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			a = net.JoinHostPort(a, "53")
		}
		host, _, _ := net.SplitHostPort(a)
		if net.ParseIP(host) == nil {
			return nil, fmt.Errorf("upstream %q: not an IP address", a)
		}
		f.ups = append(f.ups, &upstream{addr: a})
	}
	return f, nil
}

// Upstreams returns the upstream addresses and whether each is up.
func (f *Forwarder) Upstreams() map[string]bool {
	out := map[string]bool{}
	for _, u := range f.ups {
		out[u.addr] = !u.down.Load()
	}
	return out
}

func (f *Forwarder) order() []*upstream {
	out := make([]*upstream, 0, len(f.ups))
	for _, u := range f.ups {
		if !u.down.Load() {
			out = append(out, u)
		}
	}
	for _, u := range f.ups {
		if u.down.Load() {
			out = append(out, u)
		}
	}
	return out
}

// Exchange asks the upstreams for q until one gives a usable answer. A
// SERVFAIL or REFUSED is returned only when every upstream said so.
func (f *Forwarder) Exchange(ctx context.Context, q mdns.Question, do bool) (*mdns.Msg, error) {
	var last *mdns.Msg
	var lastErr error
	for _, u := range f.order() {
		if ctx.Err() != nil {
			break
		}
		r, err := f.try(ctx, u.addr, q, do)
		f.Metrics.forwarded(u.addr, err)
		if err != nil {
			u.down.Store(true)
			lastErr = err
			continue
		}
		if r.Rcode == mdns.RcodeServerFailure || r.Rcode == mdns.RcodeRefused {
			u.down.Store(true)
			last = r
			continue
		}
		u.down.Store(false)
		return r, nil
	}
	if last != nil {
		return last, nil
	}
	if lastErr == nil {
		lastErr = ctx.Err()
	}
	return nil, fmt.Errorf("forwarding %s: %w", q.Name, lastErr)
}

func (f *Forwarder) try(ctx context.Context, addr string, q mdns.Question, do bool) (*mdns.Msg, error) {
	to := f.AttemptTimeout
	if to == 0 {
		to = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	m := new(mdns.Msg)
	m.Id = mdns.Id()
	m.RecursionDesired = true
	m.Question = []mdns.Question{q}
	m.SetEdns0(ServerUDPSize, do)
	c := &mdns.Client{Net: "udp", UDPSize: ServerUDPSize, Timeout: to}
	r, _, err := c.ExchangeContext(ctx, m, addr)
	if err == nil && r.Truncated {
		c = &mdns.Client{Net: "tcp", Timeout: to}
		r, _, err = c.ExchangeContext(ctx, m, addr)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Run probes down upstreams every HealthInterval until ctx ends: any answer
// to ". NS" marks one up again.
func (f *Forwarder) Run(ctx context.Context) {
	iv := f.HealthInterval
	if iv == 0 {
		iv = 2 * time.Second
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, u := range f.ups {
			if !u.down.Load() {
				continue
			}
			r, err := f.try(ctx, u.addr, mdns.Question{Name: ".", Qtype: mdns.TypeNS, Qclass: mdns.ClassINET}, false)
			if err == nil && r.Rcode != mdns.RcodeServerFailure {
				u.down.Store(false)
			}
		}
	}
}
