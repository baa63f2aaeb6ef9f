package agent

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type metrics struct {
	registry *prometheus.Registry
	syncs    *prometheus.CounterVec
	duration prometheus.Histogram
	routes   prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_agent_syncs_total", Help: "Node syncs by result.",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "weft_agent_sync_duration_seconds", Help: "Duration of a node sync.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "weft_agent_routes", Help: "Cross-node routes the agent wants programmed.",
		}),
	}
	m.registry.MustRegister(m.syncs, m.duration, m.routes,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(d time.Duration, err error) {
	m.duration.Observe(d.Seconds())
	if err != nil {
		m.syncs.WithLabelValues("error").Inc()
		return
	}
	m.syncs.WithLabelValues("ok").Inc()
}

// Handler serves /healthz (200 once a sync succeeded recently) and /metrics,
// with the metrics of extra registries (the proxy's) alongside the agent's.
func (a *Agent) Handler(extra ...*prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.Healthy() {
			http.Error(w, "no successful sync recently", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	gatherers := prometheus.Gatherers{a.metrics.registry}
	for _, r := range extra {
		gatherers = append(gatherers, r)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(gatherers, promhttp.HandlerOpts{}))
	return mux
}
