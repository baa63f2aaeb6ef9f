package userspace

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the userspace proxy's own (weft_userspace_*), registered by
// proxy.Build next to the proxier's through the Backend's Collector.
type metrics struct {
	listeners, failures             prometheus.Gauge
	connections, sessions           prometheus.Gauge
	connectionsTotal, sessionsTotal prometheus.Counter
	connectionsLimit, sessionsLimit prometheus.Gauge
	rejectedTotal, endpointFailures *prometheus.CounterVec
	collectors                      []prometheus.Collector
}

func newMetrics(cfg Config) *metrics {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_userspace_" + name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "weft_userspace_" + name, Help: help})
	}
	m := &metrics{
		listeners:        gauge("listeners", "Listening service ports (one per service port and scope)"),
		failures:         gauge("listen_failures", "Service ports without a listener (no port could be bound, or SCTP)"),
		connections:      gauge("tcp_connections", "Proxied TCP connections open now"),
		sessions:         gauge("udp_sessions", "UDP sessions open now"),
		connectionsTotal: counter("tcp_connections_total", "TCP connections proxied"),
		sessionsTotal:    counter("udp_sessions_total", "UDP sessions started"),
		connectionsLimit: gauge("tcp_connections_limit", "The bound on concurrent proxied TCP connections"),
		sessionsLimit:    gauge("udp_sessions_limit", "The bound on concurrent UDP sessions"),
		rejectedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "weft_userspace_rejected_total",
			Help: "Clients not proxied: TCP connections reset, UDP datagrams of new sessions dropped; reason limit (over the bound), " +
				"no_endpoint (none for this client), unreachable (every endpoint refused or timed out)"}, []string{"protocol", "reason"}),
		endpointFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "weft_userspace_endpoint_failures_total",
			Help: "Endpoints that refused or did not answer a new connection or UDP session, which went to the next endpoint"}, []string{"protocol"}),
	}
	m.connectionsLimit.Set(float64(cfg.MaxConnections))
	m.sessionsLimit.Set(float64(cfg.MaxUDPSessions))
	m.collectors = []prometheus.Collector{m.listeners, m.failures, m.connections, m.sessions, m.connectionsTotal, m.sessionsTotal,
		m.connectionsLimit, m.sessionsLimit, m.rejectedTotal, m.endpointFailures}
	return m
}

func (m *metrics) rejected(protocol, reason string) {
	m.rejectedTotal.WithLabelValues(protocol, reason).Inc()
}

// Describe implements prometheus.Collector.
func (b *Backend) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range b.metrics.collectors {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (b *Backend) Collect(ch chan<- prometheus.Metric) {
	for _, c := range b.metrics.collectors {
		c.Collect(ch)
	}
}
