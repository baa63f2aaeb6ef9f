package dns

import (
	"sync"
	"time"

	mdns "github.com/miekg/dns"
)

// Cache keeps forwarded answers: positive ones for their smallest TTL,
// negative ones (NXDOMAIN, NODATA) for their SOA's negative TTL (RFC 2308),
// both capped. Cluster names never reach it: the index answers them first.
type Cache struct {
	mu     sync.Mutex
	m      map[cacheKey]*cacheEntry
	max    int
	maxTTL time.Duration
	maxNeg time.Duration
}

type cacheKey struct {
	name          string
	qtype, qclass uint16
	do            bool
}

type cacheEntry struct {
	msg     *mdns.Msg
	stored  time.Time
	expires time.Time
}

// NewCache holds at most size answers, keeping positive answers at most
// maxTTL and negative ones at most maxNeg.
func NewCache(size int, maxTTL, maxNeg time.Duration) *Cache {
	return &Cache{m: map[cacheKey]*cacheEntry{}, max: size, maxTTL: maxTTL, maxNeg: maxNeg}
}

// Len returns the number of entries.
func (c *Cache) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Get returns a copy of a live entry with its TTLs decreased by its age.
func (c *Cache) Get(k cacheKey, now time.Time) *mdns.Msg {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	e := c.m[k]
	if e != nil && !now.Before(e.expires) {
		delete(c.m, k)
		e = nil
	}
	c.mu.Unlock()
	if e == nil {
		return nil
	}
	m := e.msg.Copy()
	age := uint32(now.Sub(e.stored) / time.Second)
	for _, sec := range [][]mdns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			h := rr.Header()
			if h.Rrtype == mdns.TypeOPT {
				continue
			}
			if h.Ttl > age {
				h.Ttl -= age
			} else {
				h.Ttl = 0
			}
		}
	}
	return m
}

// Put stores r if it is cacheable: NOERROR or NXDOMAIN, not truncated,
// with a non-zero TTL.
func (c *Cache) Put(k cacheKey, r *mdns.Msg, now time.Time) {
	if c == nil || r.Truncated || (r.Rcode != mdns.RcodeSuccess && r.Rcode != mdns.RcodeNameError) {
		return
	}
	ttl := c.ttl(r)
	if ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		for old := range c.m { // evict one arbitrary entry
			delete(c.m, old)
			break
		}
	}
	c.m[k] = &cacheEntry{msg: r.Copy(), stored: now, expires: now.Add(ttl)}
}

func (c *Cache) ttl(r *mdns.Msg) time.Duration {
	if r.Rcode == mdns.RcodeSuccess && len(r.Answer) > 0 {
		min := uint32(1<<31 - 1)
		for _, rr := range r.Answer {
			if t := rr.Header().Ttl; t < min {
				min = t
			}
		}
		return capTTL(min, c.maxTTL)
	}
	for _, rr := range r.Ns {
		if soa, ok := rr.(*mdns.SOA); ok {
			t := soa.Hdr.Ttl
			if soa.Minttl < t {
				t = soa.Minttl
			}
			return capTTL(t, c.maxNeg)
		}
	}
	return 0 // negative without SOA: not cacheable (RFC 2308)
}

func capTTL(t uint32, max time.Duration) time.Duration {
	d := time.Duration(t) * time.Second
	if d > max {
		return max
	}
	return d
}
