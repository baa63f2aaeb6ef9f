package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type policyMetrics struct {
	registry *prometheus.Registry
	syncs    *prometheus.CounterVec
	duration prometheus.Histogram
	isolated prometheus.Gauge
	sets     prometheus.Gauge
	rejected prometheus.Gauge
	// New pods' default deny: how long attachments waited to be
	// programmed, how many reached the bound, how many wait now.
	pendingSeconds prometheus.Histogram
	pendingExpired prometheus.Counter
	pending        prometheus.Gauge
	// denied counts the deny log's records by what denied.
	denied *prometheus.CounterVec
}

func newPolicyMetrics(drops func() (in, out uint64, err error)) *policyMetrics {
	m := &policyMetrics{
		registry: prometheus.NewRegistry(),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_policy_syncs_total", Help: "NetworkPolicy syncs by result.",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "weft_policy_sync_duration_seconds", Help: "Duration of a NetworkPolicy sync (compile, render, apply).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		isolated: prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_policy_isolated_pods", Help: "Pods of this node with policy rules: isolated by some NetworkPolicy, or selected by some ClusterNetworkPolicy."}),
		sets:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_policy_ipsets", Help: "ipsets the node's policy rules use."}),
		rejected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_policy_rejected_policies", Help: "NetworkPolicies rejected as invalid (their pods fail closed)."}),
		pendingSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "weft_policy_pending_seconds", Help: "Time from the CNI plugin saving a new pod attachment to its addresses being marked programmed (default deny until then).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		pendingExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "weft_policy_pending_expired_total", Help: "New pod attachments released at --policy-pending-timeout without being tied to a Pod.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "weft_policy_pending_attachments", Help: "Pod attachments of this node waiting to be programmed (default deny)."}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "weft_policy_denied_total",
			Help: "Connection attempts the deny log recorded (--policy-log-drops; rate-limited), by direction, deciding tier and policy (\"other\" past the first 500 label sets).",
		}, []string{"direction", "tier", "policy"}),
	}
	m.registry.MustRegister(m.syncs, m.duration, m.isolated, m.sets, m.rejected, m.pendingSeconds, m.pendingExpired, m.pending, m.denied)
	for _, dir := range []string{"ingress", "egress"} {
		m.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "weft_policy_dropped_packets_total", Help: "Packets dropped by NetworkPolicy on this node.",
			ConstLabels: prometheus.Labels{"direction": dir},
		}, func() float64 {
			in, out, err := drops()
			if err != nil {
				return 0
			}
			if dir == "ingress" {
				return float64(in)
			}
			return float64(out)
		}))
	}
	return m
}

func (m *policyMetrics) observe(d time.Duration, err error) {
	m.duration.Observe(d.Seconds())
	if err != nil {
		m.syncs.WithLabelValues("error").Inc()
		return
	}
	m.syncs.WithLabelValues("ok").Inc()
}
