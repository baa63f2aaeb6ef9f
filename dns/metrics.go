package dns

import (
	"strconv"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are weft-dns's Prometheus metrics. A nil *Metrics records nothing.
// Counters on the hot path are bound once, so recording is an atomic add.
type Metrics struct {
	queries     [2]prometheus.Counter // udp, tcp
	fast        prometheus.Counter
	rcodes      [24]prometheus.Counter
	cacheHits   prometheus.Counter
	cacheMisses prometheus.Counter
	fwd         *prometheus.CounterVec
	fwdErr      *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg; size reports index and cache
// sizes when scraped.
func NewMetrics(reg prometheus.Registerer, x *Index, c *Cache, f *Forwarder) *Metrics {
	q := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "weft_dns_requests_total", Help: "Queries received, by transport."}, []string{"proto"})
	r := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "weft_dns_responses_total", Help: "Replies sent, by rcode."}, []string{"rcode"})
	m := &Metrics{
		fast:        prometheus.NewCounter(prometheus.CounterOpts{Name: "weft_dns_fast_path_total", Help: "Queries answered by the allocation-free UDP path."}),
		cacheHits:   prometheus.NewCounter(prometheus.CounterOpts{Name: "weft_dns_cache_hits_total", Help: "Forwarded names answered from the cache."}),
		cacheMisses: prometheus.NewCounter(prometheus.CounterOpts{Name: "weft_dns_cache_misses_total", Help: "Forwarded names not in the cache."}),
		fwd:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "weft_dns_forward_requests_total", Help: "Queries sent upstream, by upstream."}, []string{"to"}),
		fwdErr:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "weft_dns_forward_errors_total", Help: "Upstream tries that failed (timeout, network), by upstream."}, []string{"to"}),
	}
	m.queries[0], m.queries[1] = q.WithLabelValues("udp"), q.WithLabelValues("tcp")
	for i := range m.rcodes {
		name, ok := mdns.RcodeToString[i]
		if !ok {
			name = strconv.Itoa(i)
		}
		m.rcodes[i] = r.WithLabelValues(name)
	}
	names := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "weft_dns_index_names", Help: "Names with records in the cluster index."}, func() float64 { return float64(x.Len()) })
	entries := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "weft_dns_cache_entries", Help: "Forwarded answers in the cache."}, func() float64 { return float64(c.Len()) })
	synced := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "weft_dns_ready", Help: "1 once the first full sync is applied."}, func() float64 {
		if x.Synced() {
			return 1
		}
		return 0
	})
	cs := []prometheus.Collector{q, r, m.fast, m.cacheHits, m.cacheMisses, m.fwd, m.fwdErr, names, entries, synced}
	if f != nil {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "weft_dns_upstreams_healthy", Help: "Upstreams currently marked up."}, func() float64 {
			n := 0
			for _, up := range f.Upstreams() {
				if up {
					n++
				}
			}
			return float64(n)
		}))
	}
	for _, c := range cs {
		reg.MustRegister(c)
	}
	return m
}

func (m *Metrics) query(tcp bool) {
	if m == nil {
		return
	}
	if tcp {
		m.queries[1].Inc()
	} else {
		m.queries[0].Inc()
	}
}

func (m *Metrics) fastPath(rcode int) {
	if m == nil {
		return
	}
	m.fast.Inc()
	m.rcode(rcode)
}

func (m *Metrics) rcode(rc int) {
	if m == nil || rc < 0 || rc >= len(m.rcodes) {
		return
	}
	m.rcodes[rc].Inc()
}

func (m *Metrics) cacheHit() {
	if m != nil {
		m.cacheHits.Inc()
	}
}

func (m *Metrics) cacheMiss() {
	if m != nil {
		m.cacheMisses.Inc()
	}
}

func (m *Metrics) forwarded(to string, err error) {
	if m == nil {
		return
	}
	m.fwd.WithLabelValues(to).Inc()
	if err != nil {
		m.fwdErr.WithLabelValues(to).Inc()
	}
}
