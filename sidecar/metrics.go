package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/sidecar/sequence"
)

// metrics are the sidecar's series (kvroute_sidecar_*). Per-engine series
// carry the rank's engine URL under the label engine: not endpoint, which
// the Prometheus Operator sets on every scraped series to the port's name
// (a scraped label of the same name would be renamed exported_endpoint).
type metrics struct {
	events, replays                                 *prometheus.CounterVec
	malformed, gaps, restarts                       *prometheus.CounterVec
	unresolved, invalid, scrapeErrors               *prometheus.CounterVec
	deltas, deltaFlips, deltaBytes                  *prometheus.CounterVec
	updates, streamBytes                            *prometheus.CounterVec
	watchers, draining                              prometheus.Gauge
	watchersCut                                     prometheus.Counter
	blocks, partial, epoch, requests, kvUsage, fill *prometheus.GaugeVec
	streamState, engineDown                         *prometheus.GaugeVec
	lag                                             *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "sidecar", Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	gv := func(name, help string, labels ...string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "sidecar", Name: name, Help: help}, labels)
		reg.MustRegister(g)
		return g
	}
	m := &metrics{
		events:       cv("events_total", "KV events applied, by type.", "engine", "type"),
		replays:      cv("replays_total", "Replay exchanges, by outcome (ok, incomplete, failed).", "engine", "outcome"),
		malformed:    cv("malformed_payloads_total", "Event messages or payloads that failed to decode (skipped).", "engine"),
		gaps:         cv("seq_gaps_total", "Gaps in the event sequence numbers.", "engine"),
		restarts:     cv("engine_restarts_total", "Engine restarts detected (seq backwards or a new start time).", "engine"),
		unresolved:   cv("unresolved_parents_total", "BlockStored runs dropped because their parent was unknown.", "engine"),
		invalid:      cv("invalid_runs_total", "BlockStored runs that could not be keyed (bad sizes, unknown extra keys).", "engine"),
		scrapeErrors: cv("scrape_errors_total", "Failed reads of the engine's /metrics.", "engine"),
		deltas:       cv("summary_deltas_total", "Summary deltas taken.", "engine", "tier"),
		deltaFlips:   cv("summary_delta_flips_total", "Bit flips carried by summary deltas.", "engine", "tier"),
		deltaBytes:   cv("summary_delta_bytes_total", "Encoded size of summary deltas.", "engine", "tier"),
		updates:      cv("stream_updates_total", "Updates sent to watching pickers, by kind (snapshot, delta, load).", "kind"),
		streamBytes:  cv("stream_bytes_total", "Bytes of updates sent to watching pickers (message and gRPC prefix), by kind.", "kind"),
		blocks:       gv("blocks", "Engine blocks indexed, by tier.", "engine", "tier"),
		partial:      gv("partial", "1 when the endpoint's state may miss blocks (lost events that replay could not recover).", "engine"),
		epoch:        gv("epoch", "The endpoint's epoch: bumped on every clear and engine restart.", "engine"),
		requests:     gv("engine_requests", "The engine's requests as last scraped, by state (waiting, running).", "engine", "state"),
		kvUsage:      gv("engine_kv_cache_usage_ratio", "The share (0..1) of the engine's KV cache its live requests hold, as last scraped.", "engine"),
		fill:         gv("summary_fill", "Fraction of summary bits set.", "engine", "tier"),
		streamState: gv("stream_state", "The live KV event stream's state: 1 for the current one (unknown, live, replay_only, silent, partial), 0 for the others.",
			"engine", "state"),
		engineDown: gv("engine_down", "1 when the last scrape of the engine failed (reported to pickers as engine_down), or while the sidecar starts and the engine has not answered yet (a model loading).", "engine"),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "sidecar", Name: "event_to_summary_lag_seconds",
			Help:    "Time from the engine stamping a batch to its blocks being in the summary.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5}}, []string{"engine"}),
	}
	m.watchers = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "sidecar", Name: "watchers", Help: "Pickers watching summaries."})
	m.watchersCut = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "sidecar", Name: "watchers_cut_total", Help: "Watchers cut for falling too far behind."})
	m.draining = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "sidecar", Name: "draining",
		Help: "1 once the sidecar announced a drain to its pickers (its engines are going away)."})
	reg.MustRegister(m.lag, m.watchers, m.watchersCut, m.draining)
	return m
}

// initEndpoint creates an endpoint's counters at 0, so the alerts and the
// dashboard see a rate (and the first failure's increase) from the start.
func (m *metrics) initEndpoint(label string) {
	for _, t := range []kvevents.EventType{kvevents.TypeBlockStored, kvevents.TypeBlockRemoved, kvevents.TypeAllBlocksCleared} {
		m.events.WithLabelValues(label, t.String())
	}
	for _, o := range []sequence.Outcome{sequence.OK, sequence.Incomplete, sequence.Failed} {
		m.replays.WithLabelValues(label, o.String())
	}
	for _, c := range []*prometheus.CounterVec{m.malformed, m.gaps, m.restarts, m.unresolved, m.invalid, m.scrapeErrors} {
		c.WithLabelValues(label)
	}
	m.partial.WithLabelValues(label)
	m.lag.WithLabelValues(label) // the histogram, empty until the first batch
}
