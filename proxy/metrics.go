package proxy

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics carry kube-proxy's names and meanings, so existing dashboards
// and SLO queries work:
//
//   - kubeproxy_sync_proxy_rules_duration_seconds: one round of syncing
//     the rules (reading the model's changes, rendering, writing them to
//     the kernel, health-check ports, conntrack cleanup), whether it
//     succeeded or not; _full_ and _partial_ variants split full resyncs
//     from incremental ones. No round runs before the initial state is
//     complete, so the first one observed programs the whole cluster.
//   - kubeproxy_network_programming_duration_seconds: for every
//     EndpointSlice change that carries endpoints.kubernetes.io/
//     last-change-trigger-time (set by the EndpointSlice controller when it
//     saw the Pod or Service change), from that time until the sync that
//     programmed it ended successfully. Changes made before the proxy
//     started are not observed. The time comes from the control plane's
//     clock: clock skew between it and the node skews this metric.
//
// Unlike kube-proxy's, the series carry no ip_family label: one sync
// programs every family.
type Metrics struct {
	Registry     *prometheus.Registry
	syncDuration prometheus.Histogram
	syncFull     prometheus.Histogram
	syncPartial  prometheus.Histogram
	programming  prometheus.Histogram
	lastSync     prometheus.Gauge
	syncErrors   prometheus.Counter
	servicePorts prometheus.Gauge
	resets       *prometheus.CounterVec
}

// NewMetrics registers the proxy's metrics in a registry of their own.
func NewMetrics() *Metrics {
	syncHist := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help,
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)})
	}
	m := &Metrics{
		Registry:     prometheus.NewRegistry(),
		syncDuration: syncHist("kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds"),
		syncFull:     syncHist("kubeproxy_sync_full_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for full resyncs"),
		syncPartial:  syncHist("kubeproxy_sync_partial_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds for partial resyncs"),
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeproxy_network_programming_duration_seconds", Help: "In Cluster Network Programming Latency in seconds",
			Buckets: programmingBuckets(),
		}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds", Help: "The last time proxy rules were successfully synced",
		}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeproxy_sync_proxy_rules_iptables_restore_failures_total", Help: "Cumulative proxy rules restore failures",
		}),
		servicePorts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weft_proxy_service_ports", Help: "Service ports in the last synced state",
		}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_proxy_connections_reset_total",
			Help: "TCP connections to endpoints that left their Service, by result: reset at the client, aborted (a client on the node itself: its socket destroyed), unanswered (the client did not answer), unreachable (the node cannot reach the client)",
		}, []string{"result"}),
	}
	m.Registry.MustRegister(m.syncDuration, m.syncFull, m.syncPartial, m.programming, m.lastSync, m.syncErrors, m.servicePorts, m.resets)
	return m
}

// programmingBuckets are kube-proxy's: 0.25 s and 0.5 s, every second to
// 59 s, every 5 s to 115 s, every 30 s from 2 to 5 minutes.
func programmingBuckets() []float64 {
	b := []float64{0.25, 0.5}
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
}

// observeSync records one sync round that began at start.
func (m *Metrics) observeSync(start time.Time, full bool) {
	d := time.Since(start).Seconds()
	m.syncDuration.Observe(d)
	if full {
		m.syncFull.Observe(d)
	} else {
		m.syncPartial.Observe(d)
	}
}

// observeReset counts one reset's connections by result.
func (m *Metrics) observeReset(r ResetResult) {
	m.resets.WithLabelValues("reset").Add(float64(r.Reset))
	m.resets.WithLabelValues("aborted").Add(float64(r.Aborted))
	m.resets.WithLabelValues("unanswered").Add(float64(r.Unanswered))
	m.resets.WithLabelValues("unreachable").Add(float64(r.Unreachable))
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}
