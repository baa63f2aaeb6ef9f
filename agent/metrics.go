package agent

import (
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/weftnet/weft/routing/wireguard"
)

type metrics struct {
	registry *prometheus.Registry
	syncs    *prometheus.CounterVec
	duration prometheus.Histogram
	routes   prometheus.Gauge
	wg       *prometheus.GaugeVec
	wgPeers  *prometheus.GaugeVec
	// pathMTU is the measured path MTU to each other node (pathmtu.go),
	// pathMTUNeeded what pod packets need on the underlay.
	pathMTU       *prometheus.GaugeVec
	pathMTUNeeded prometheus.Gauge
	pathMTUNodes  map[string]bool
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
		wg: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "weft_wireguard_info", Help: "1 for the WireGuard implementation in use (kernel or userspace), with --encryption wireguard.",
		}, []string{"implementation"}),
		wgPeers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "weft_wireguard_peers", Help: "Other nodes by WireGuard state: tunnel (a peer), or skipped (no or bad annotations: strict mode drops their pod traffic, otherwise it goes in clear).",
		}, []string{"state"}),
	}
	m.pathMTU = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "weft_path_mtu_bytes", Help: "The largest DF packet that crosses the underlay to each other node's agent and is answered, up to the underlay link's MTU (measured every 2 minutes).",
	}, []string{"node"})
	m.pathMTUNeeded = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "weft_path_mtu_needed_bytes", Help: "What a pod packet of the pod MTU takes on the underlay: the pod MTU plus the routing mode's and encryption's overhead. A node's weft_path_mtu_bytes below it drops large pod packets.",
	})
	m.pathMTUNodes = map[string]bool{}
	m.registry.MustRegister(m.syncs, m.duration, m.routes, m.wg, m.wgPeers, m.pathMTU, m.pathMTUNeeded,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) setEncryption(impl wireguard.Implementation, peers, skipped int) {
	m.wg.Reset()
	m.wg.WithLabelValues(string(impl)).Set(1)
	m.wgPeers.WithLabelValues("tunnel").Set(float64(peers))
	m.wgPeers.WithLabelValues("skipped").Set(float64(skipped))
}

// dropPathMTU removes the series of nodes not measured in the last round.
func (m *metrics) dropPathMTU(measured map[string]bool) {
	for n := range m.pathMTUNodes {
		if !measured[n] {
			m.pathMTU.DeleteLabelValues(n)
		}
	}
	m.pathMTUNodes = measured
}

func (m *metrics) observe(d time.Duration, err error) {
	m.duration.Observe(d.Seconds())
	if err != nil {
		m.syncs.WithLabelValues("error").Inc()
		return
	}
	m.syncs.WithLabelValues("ok").Inc()
}

// ReadyCheck is one more condition of /readyz: a component (the service
// proxy) and whether its last sync succeeded.
type ReadyCheck struct {
	Name string
	OK   func() bool
}

// Handler serves /healthz (200 once a node sync succeeded recently: the
// liveness probe's), /readyz (that, and every check: the readiness
// probe's, so a proxy whose syncs fail holds a rollout back) and /metrics,
// with the metrics of extra registries (the proxy's) alongside the agent's.
func (a *Agent) Handler(checks []ReadyCheck, extra ...*prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.Healthy() {
			http.Error(w, "no successful sync recently", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		var failing []string
		if !a.Healthy() {
			failing = append(failing, "node sync")
		}
		for _, c := range checks {
			if !c.OK() {
				failing = append(failing, c.Name)
			}
		}
		if len(failing) > 0 {
			http.Error(w, "last sync failed: "+strings.Join(failing, ", "), http.StatusServiceUnavailable)
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
