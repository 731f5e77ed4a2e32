package p2p

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the side channel's own series. vLLM exports nothing for its
// control connections, so every one is ours (kvroute_engine_ prefix).
type metrics struct {
	connections    *prometheus.CounterVec
	sessions       prometheus.Gauge
	framesRejected *prometheus.CounterVec
	served         *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, labels prometheus.Labels) *metrics {
	m := &metrics{
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_p2p_connections_total",
			Help:        "P2P side-channel connections, by direction (inbound, outbound) and outcome (ready; rejected: a fingerprint mismatch, an identity that is not the address dialled, a duplicate, too many in all or from one address; failed: unreachable, handshake timeout or a bad handshake; crossed: two nodes dialled each other at once and this connection gave way to the one dialled by the lower identity).",
			ConstLabels: labels}, []string{"direction", "outcome"}),
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvroute_engine_p2p_sessions",
			Help: "P2P side-channel connections open and ready.", ConstLabels: labels}),
		framesRejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_p2p_frames_rejected_total",
			Help:        "P2P side-channel frames rejected, by reason: oversized, malformed, unexpected (the connection is closed); busy (a lookup or fetch past the node's bound on requests being answered at once, answered as a miss).",
			ConstLabels: labels}, []string{"reason"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_p2p_served_total",
			Help:        "Peers' lookup and fetch messages answered from this engine's CPU tier, by op.",
			ConstLabels: labels}, []string{"op"}),
	}
	for _, c := range []prometheus.Collector{m.connections, m.sessions, m.framesRejected, m.served} {
		reg.MustRegister(c)
	}
	for _, d := range []string{"inbound", "outbound"} {
		for _, o := range []string{"ready", "rejected", "failed", "crossed"} {
			m.connections.WithLabelValues(d, o)
		}
	}
	for _, r := range []string{"oversized", "malformed", "unexpected", "busy"} {
		m.framesRejected.WithLabelValues(r)
	}
	m.served.WithLabelValues(typeLookup)
	m.served.WithLabelValues(typeFetch)
	return m
}
