package proxy

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics carry kube-proxy's names, so existing dashboards work.
type Metrics struct {
	Registry     *prometheus.Registry
	syncDuration prometheus.Histogram
	programming  prometheus.Histogram
	lastSync     prometheus.Gauge
	syncErrors   prometheus.Counter
	servicePorts prometheus.Gauge
}

// NewMetrics registers the proxy's metrics in a registry of their own.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeproxy_sync_proxy_rules_duration_seconds", Help: "SyncProxyRules latency in seconds",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		programming: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kubeproxy_network_programming_duration_seconds", Help: "In Cluster Network Programming Latency in seconds",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
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
	}
	m.Registry.MustRegister(m.syncDuration, m.programming, m.lastSync, m.syncErrors, m.servicePorts)
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}
