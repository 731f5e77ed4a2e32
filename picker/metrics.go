package picker

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/picker/decide"
)

// metrics are the picker's series (kvroute_picker_*); the fleet view adds
// staleness, lag, resyncs and refusals of its own. Per endpoint (label
// engine) only selected_total is kept by default; in-flight requests,
// stream aborts and KV sources carry the engine label, and the TTFT speed
// factors are exported, only with Config.PerEndpointMetrics (byEngine).
type metrics struct {
	decisions      *prometheus.CounterVec
	refused        *prometheus.CounterVec
	unresolved     *prometheus.CounterVec
	fallbacks      *prometheus.CounterVec
	selected       *prometheus.CounterVec
	tokenize       *prometheus.HistogramVec
	tokenizeErrors *prometheus.CounterVec
	coalesced      prometheus.Counter // render calls that joined an identical one in flight
	matchedBlocks  prometheus.Histogram
	overhead       prometheus.Histogram
	overrides      prometheus.Counter
	overrideTokens prometheus.Counter
	outcomes       *prometheus.CounterVec
	promptTokens   prometheus.Counter
	predicted      prometheus.Counter
	reported       prometheus.Counter
	requests       *prometheus.CounterVec       // by route, model, code
	duration       *prometheus.HistogramVec     // by route, model
	ttfb           *prometheus.HistogramVec     // by route, model
	inFlight       byEngine[prometheus.Gauge]   // proxied requests at engines (by engine: PerEndpointMetrics)
	retries        *prometheus.CounterVec       // by cause
	streamAborts   byEngine[prometheus.Counter] // by cause (and engine: PerEndpointMetrics)
	eppRequests    *prometheus.CounterVec       // endpoint picker (ext_proc) requests, by result
	eppServed      *prometheus.CounterVec       // endpoint picker answers, by the endpoint that served them
	chosen         sync.Map                     // endpoints picked at least once: their per-endpoint series exist
	ttftError      prometheus.Histogram         // |predicted − observed| ÷ observed
	ttftObserved   prometheus.Histogram
	ttftPredicted  prometheus.Histogram
	// KV sources: named (per source endpoint, label engine, with
	// PerEndpointMetrics), dropped by reason, the prompt tokens expected
	// pulled, the decisions' prompt tokens by where they are expected to
	// come from, and the clients' kv_transfer_params removed.
	kvSources       byEngine[prometheus.Counter]
	kvSourceDrops   *prometheus.CounterVec
	kvPullTokens    prometheus.Counter
	plannedTokens   *prometheus.CounterVec
	clientKVDropped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, r *Router) *metrics {
	opts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "picker", Name: name, Help: help}
	}
	perEndpoint := r.cfg.PerEndpointMetrics
	m := &metrics{
		decisions:      prometheus.NewCounterVec(opts("decisions_total", "Routing decisions, by policy and reason."), []string{"policy", "reason"}),
		refused:        prometheus.NewCounterVec(opts("refused_total", "Requests refused before a decision, by reason."), []string{"reason"}),
		unresolved:     prometheus.NewCounterVec(opts("unresolved_total", "Requests whose cache identity could not be resolved exactly, by reason."), []string{"reason"}),
		fallbacks:      prometheus.NewCounterVec(opts("fallbacks_total", "Decisions that fell back from precise routing, by reason."), []string{"reason"}),
		selected:       prometheus.NewCounterVec(opts("selected_total", "Decisions per chosen endpoint, by engine (its URL)."), []string{"engine"}),
		tokenizeErrors: prometheus.NewCounterVec(opts("tokenize_errors_total", "Failed render or tokenize calls, by kind (timeout, refused, error)."), []string{"kind"}),
		coalesced:      prometheus.NewCounter(opts("render_coalesced_total", "Render calls that joined an identical render of the same identity group in flight (same kind and body) instead of calling an engine.")),
		overrides:      prometheus.NewCounter(opts("load_overrides_total", "Decisions that skipped the best-cached endpoint because it was at the load cap.")),
		overrideTokens: prometheus.NewCounter(opts("load_override_tokens_total", "Cached tokens given up by load overrides.")),
		outcomes: prometheus.NewCounterVec(opts("outcomes_total", "Proxied requests by outcome, engine-reported cached tokens against the prediction at block granularity: as_predicted (exactly), "+
			"fewer_cached_than_predicted and another_endpoint_held_more (wrong-pod outcomes), more_cached_than_predicted (the signature of a stale summary), "+
			"load_only (the endpoint's cache was unknown: nothing predicted), no_usage (the engine reported none), no_cached_details (a hit was predicted and the engine gave no details)."), []string{"outcome"}),
		promptTokens: prometheus.NewCounter(opts("prompt_tokens_total", "Prompt tokens of proxied requests, as the engines reported them.")),
		predicted:    prometheus.NewCounter(opts("predicted_cached_tokens_total", "Cached prompt tokens the picker predicted for proxied requests.")),
		reported:     prometheus.NewCounter(opts("reported_cached_tokens_total", "Cached prompt tokens the engines reported (usage.prompt_tokens_details.cached_tokens).")),
		tokenize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "picker", Name: "tokenize_seconds",
			Help:    "Render or tokenize call latency, by via: the engine endpoint used (chat_render, completions_render, responses_render, responses_as_chat, tokenize).",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}}, []string{"via"}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "picker", Name: "proxy_overhead_seconds",
			Help:    "From a proxied request's arrival to its dispatch to the chosen engine (body read, tokens, decision), per attempt.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}}),
		requests: prometheus.NewCounterVec(opts("requests_total", "Requests answered, by route (the API path; ext_proc for the endpoint picker's), model (none before one is resolved) and status code "+
			"(unreported: an endpoint picker request whose answer's status the gateway did not send back)."),
			[]string{"route", "model", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "picker", Name: "request_duration_seconds",
			Help: "From a request's arrival to the end of its answer, by route and model.", Buckets: latencyBuckets()}, []string{"route", "model"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "picker", Name: "time_to_first_byte_seconds",
			Help:    "From a request's arrival to the first byte of its answer's body sent to the client (for a stream: the time to first token as the client sees it), by route and model.",
			Buckets: latencyBuckets()}, []string{"route", "model"}),
		inFlight: newByEngine[prometheus.Gauge](perEndpoint, prometheus.NewGaugeVec, prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "picker", Name: "endpoint_requests_in_flight",
			Help: "Proxied requests sent to engines and not yet answered in full: all engines together, or by engine (its URL) with --per-endpoint-metrics."}),
		retries: prometheus.NewCounterVec(opts("upstream_retries_total", "Requests offered to another engine because the chosen one could not be reached (connect_error) or answered 502, 503 or 504 (bad_status) before any byte reached the client."),
			[]string{"cause"}),
		matchedBlocks: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "picker", Name: "matched_blocks",
			Help:    "GPU blocks the chosen endpoint held of the request's prefix.",
			Buckets: []float64{0, 1, 4, 16, 64, 256, 1024, 4096, 16384}}),
		streamAborts: newByEngine[prometheus.Counter](perEndpoint, prometheus.NewCounterVec, opts("stream_aborts_total", "Answers aborted after their first byte went to the client (the connection closed or the stream reset, never a clean end), "+
			"by cause (and by engine, its URL, with --per-endpoint-metrics): upstream_error (reading the engine's answer failed), upstream_truncated (it ended before its final event), client_gone (the client left)."), "cause"),
		eppRequests: prometheus.NewCounterVec(opts("extproc_requests_total", "Requests the endpoint picker (ext_proc) answered, by result: picked (a destination sent), no_endpoint (503: none ready), "+
			"subset_empty (503: none of the gateway's subset hint is an endpoint here), shed (429: every candidate saturated), refused (another refusal: unknown model 404, bad request 400, body too large 413, …), "+
			"error (the stream ended in a gRPC error: a protocol violation, the body timeout)."), []string{"result"}),
		ttftError: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "picker", Name: "ttft_prediction_error_ratio",
			Help:    "Per request learned from (the first token of a request the picker carried, routed by precise): |predicted − observed| ÷ observed time to first token, from the dispatch.",
			Buckets: []float64{0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2, 5}}),
		ttftObserved: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "picker", Name: "ttft_observed_seconds",
			Help: "Time from the dispatch to the first output token of the requests the TTFT model learned from.", Buckets: latencyBuckets()}),
		ttftPredicted: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "picker", Name: "ttft_predicted_seconds",
			Help: "The TTFT predicted for the same requests, at their decision.", Buckets: latencyBuckets()}),
		eppServed: prometheus.NewCounterVec(opts("extproc_served_total", "Endpoint picker answers by the endpoint the gateway reports served them: picked, fallback (a later one of the list), "+
			"other (not in the list), unreported (no x-gateway-destination-endpoint-served)."), []string{"as"}),
	}
	m.newKVSourceMetrics(opts, perEndpoint)
	if reg != nil {
		reg.MustRegister(m.decisions, m.refused, m.unresolved, m.fallbacks, m.selected, m.tokenize, m.tokenizeErrors, m.coalesced,
			m.matchedBlocks, m.overhead, m.overrides, m.overrideTokens, m.outcomes, m.promptTokens, m.predicted, m.reported,
			m.requests, m.duration, m.ttfb, m.inFlight.vec, m.retries, m.streamAborts.vec, m.eppRequests, m.eppServed, endpointsByGroup{r},
			m.ttftError, m.ttftObserved, m.ttftPredicted, ttftModels{r}, m.kvSources.vec, m.kvSourceDrops, m.kvPullTokens, m.plannedTokens,
			m.clientKVDropped)
	}
	m.zero()
	return m
}

// zero makes the series the alerts and the dashboard divide by or watch
// for a first increase exist from the start, at 0.
func (m *metrics) zero() {
	for _, o := range outcomeLabels {
		m.outcomes.WithLabelValues(o)
	}
	for _, k := range []string{"timeout", "refused", "error"} {
		m.tokenizeErrors.WithLabelValues(k)
	}
	for _, c := range []string{"connect_error", "bad_status"} {
		m.retries.WithLabelValues(c)
	}
	for _, r := range []string{"bad_request", "unknown_model", "unknown_lora"} {
		m.refused.WithLabelValues(r)
	}
	for _, r := range []string{"unknown_block_size", "tokenize_failed", "anchor_render_failed", "load_only_endpoint"} {
		m.fallbacks.WithLabelValues(r)
	}
	m.unresolved.WithLabelValues("multimodal_without_render")
	for _, r := range []string{eppPicked, eppNoEndpoint, eppSubsetEmpty, eppShed, eppRefused, eppError} {
		m.eppRequests.WithLabelValues(r)
	}
	for _, as := range []string{"picked", "fallback", "other", "unreported"} {
		m.eppServed.WithLabelValues(as)
	}
	for _, r := range sourceDropReasons {
		m.kvSourceDrops.WithLabelValues(r)
	}
	for _, p := range placeLabels {
		m.plannedTokens.WithLabelValues(p)
	}
	// Without the engine label the dashboard's series exist from the
	// start; with it, an endpoint's stream aborts do from its first pick.
	m.inFlight.zero()
	m.kvSources.zero()
	for _, c := range streamAbortCauses {
		m.streamAborts.zero(c)
	}
}

// newKVSourceMetrics makes the KV source series (named, dropped, pulled
// tokens, the plan's places, the clients' kv_transfer_params dropped).
func (m *metrics) newKVSourceMetrics(opts func(name, help string) prometheus.CounterOpts, perEndpoint bool) {
	m.kvSources = newByEngine[prometheus.Counter](perEndpoint, prometheus.NewCounterVec, opts("kv_sources_total", "Decisions that named a KV source (the endpoint the chosen one pulls the prompt's prefix from, "+
		"out of its CPU tier: vLLM's remote_kv_source): all sources together, or by engine (the source's URL) with --per-endpoint-metrics."))
	m.kvSourceDrops = prometheus.NewCounterVec(opts("kv_sources_dropped_total", "KV sources a decision named that the picker did not pass on, by reason: "+
		"computing (the chosen endpoint itself), not_in_group (not an endpoint of the request's identity group), "+
		"no_address (it advertises no P2P side channel: --p2p-port on its sidecar)."), []string{"reason"})
	m.kvPullTokens = prometheus.NewCounter(opts("kv_pull_tokens_total", "Prompt tokens the decisions that named a KV source expect pulled from it."))
	m.plannedTokens = prometheus.NewCounterVec(opts("planned_prompt_tokens_total", "Prompt tokens of the decisions, by where the chosen endpoint is expected to find their KV (place): "+
		"gpu (its GPU cache), cpu (its CPU tier, loaded back), pulled (a source's CPU tier), recomputed (nowhere: prefilled)."), []string{"place"})
	m.clientKVDropped = prometheus.NewCounter(opts("client_kv_params_dropped_total",
		"Proxied requests whose client sent kv_transfer_params, removed before forwarding: only the picker names a KV source."))
}

// placeLabels are kvroute_picker_planned_prompt_tokens_total's places, in
// decide.Placement's order.
var placeLabels = []string{"gpu", "cpu", "pulled", "recomputed"}

// streamAbortCauses are kvroute_picker_stream_aborts_total's causes.
var streamAbortCauses = []string{causeUpstreamError, causeUpstreamTruncated, causeClientGone}

// outcomeLabels are kvroute_picker_outcomes_total's outcomes.
var outcomeLabels = []string{"as_predicted", "fewer_cached_than_predicted", "another_endpoint_held_more", "more_cached_than_predicted",
	"load_only", "no_usage", "no_cached_details"}

// latencyBuckets are the request latency buckets: 5 ms to 2 minutes.
func latencyBuckets() []float64 {
	return []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}
}

// observe records a pick: what its preparation noted and, when an
// endpoint was chosen, the decision and the pick made of it (its KV
// source). It is the one place a pick's metrics are recorded.
func (m *metrics) observe(n *notes, d *decide.Decision, p *Pick) {
	if n.refused != "" {
		m.refused.WithLabelValues(n.refused).Inc()
	}
	if n.unresolved != "" {
		m.unresolved.WithLabelValues(n.unresolved).Inc()
	}
	for _, k := range n.tokenizeErrors {
		m.tokenizeErrors.WithLabelValues(k).Inc()
	}
	if n.tokenized {
		m.tokenize.WithLabelValues(n.tokenizeVia).Observe(n.tokenizeSecs)
	}
	for _, f := range n.fallbacks {
		m.fallbacks.WithLabelValues(f).Inc()
	}
	if !d.OK() {
		return
	}
	if d.LoadOnly {
		m.fallbacks.WithLabelValues("load_only_endpoint").Inc()
	}
	if m.streamAborts.perEndpoint {
		if _, seen := m.chosen.LoadOrStore(d.Endpoint, true); !seen {
			for _, c := range streamAbortCauses {
				m.streamAborts.WithLabelValues(d.Endpoint, c) // at 0 from the first pick
			}
		}
	}
	m.decisions.WithLabelValues(string(d.Policy), string(d.Reason)).Inc()
	m.matchedBlocks.Observe(float64(d.MatchedBlocks))
	m.selected.WithLabelValues(d.Endpoint).Inc()
	if d.Override != nil {
		m.overrides.Inc()
		m.overrideTokens.Add(d.Override.TokensLost)
	}
	for i, n := range []int{d.Plan.GPU, d.Plan.CPU, d.Plan.Pulled, d.Plan.Recompute} {
		if n > 0 {
			m.plannedTokens.WithLabelValues(placeLabels[i]).Add(float64(n))
		}
	}
	if p == nil {
		return
	}
	if p.sourceDropped != "" {
		m.kvSourceDrops.WithLabelValues(p.sourceDropped).Inc()
	}
	if p.source.url != "" {
		m.kvSources.WithLabelValues(p.source.url).Inc()
		m.kvPullTokens.Add(float64(p.source.tokens))
	}
}

// byEngine is a metric vector whose first label, engine (an endpoint's
// URL), is there only per endpoint (Config.PerEndpointMetrics): without
// it, every endpoint counts in the series of the other labels, so a fleet
// of any size exports as many series as one endpoint. Queries that sum
// the engine label away read the same in both modes.
type byEngine[M any] struct {
	vec interface {
		prometheus.Collector
		WithLabelValues(lvs ...string) M
	}
	perEndpoint bool
}

// newByEngine makes a byEngine vector with labels (engine first, per
// endpoint) and opts; newVec is prometheus.NewCounterVec or NewGaugeVec.
func newByEngine[M any, O any, V interface {
	prometheus.Collector
	WithLabelValues(lvs ...string) M
}](perEndpoint bool, newVec func(O, []string) V, opts O, labels ...string) byEngine[M] {
	if perEndpoint {
		labels = append([]string{"engine"}, labels...)
	}
	return byEngine[M]{vec: newVec(opts, labels), perEndpoint: perEndpoint}
}

// WithLabelValues is the series of engine and the other labels' values;
// without the engine label, of the other labels' values alone.
func (b byEngine[M]) WithLabelValues(engine string, lvs ...string) M {
	if b.perEndpoint {
		return b.vec.WithLabelValues(append([]string{engine}, lvs...)...)
	}
	return b.vec.WithLabelValues(lvs...)
}

// zero makes the series of the other labels' values exist (at 0) when
// there is no engine label; per endpoint, an endpoint's come with it.
func (b byEngine[M]) zero(lvs ...string) {
	if !b.perEndpoint {
		b.vec.WithLabelValues(lvs...)
	}
}

// endpointsByGroup exports kvroute_picker_endpoints{group} at scrape time.
type endpointsByGroup struct{ r *Router }

var endpointsDesc = prometheus.NewDesc("kvroute_picker_endpoints", "Endpoints known, by identity group.", []string{"group"}, nil)

func (e endpointsByGroup) Describe(ch chan<- *prometheus.Desc) { ch <- endpointsDesc }

func (e endpointsByGroup) Collect(ch chan<- prometheus.Metric) {
	if e.r.fleet == nil {
		return
	}
	n := map[string]int{}
	for _, ep := range e.r.fleet.Endpoints() {
		n[ep.Group]++
	}
	for g, c := range n {
		ch <- prometheus.MustNewConstMetric(endpointsDesc, prometheus.GaugeValue, float64(c), g)
	}
}

// ttftModels exports the learned TTFT models at scrape time.
type ttftModels struct{ r *Router }

var (
	ttftCoefDesc = prometheus.NewDesc("kvroute_picker_ttft_model_coefficient",
		"The learned TTFT model's coefficients, by identity group and term (overhead_s, tail_s_per_ktok, attention_s_per_mtok2, ahead_s_per_ktok, running_s_per_seq, running_tail_s_per_seq_ktok, queued_s_per_request, kv_usage_s).",
		[]string{"group", "term"}, nil)
	ttftObsDesc = prometheus.NewDesc("kvroute_picker_ttft_model_observations", "Requests the TTFT model learned from, by identity group.", []string{"group"}, nil)
	ttftErrDesc = prometheus.NewDesc("kvroute_picker_ttft_model_median_error_ratio",
		"Median of |predicted − observed| ÷ observed over the TTFT model's last 512 requests, by identity group.", []string{"group"}, nil)
	ttftSpeedDesc = prometheus.NewDesc("kvroute_picker_ttft_speed_factor",
		"Each endpoint's learned speed against its group's TTFT curve (2: twice as slow), by engine (its URL); exported with --per-endpoint-metrics only (/debug/endpoints shows it always).", []string{"engine"}, nil)
)

func (t ttftModels) Describe(ch chan<- *prometheus.Desc) {
	ch <- ttftCoefDesc
	ch <- ttftObsDesc
	ch <- ttftErrDesc
	ch <- ttftSpeedDesc
}

func (t ttftModels) Collect(ch chan<- prometheus.Metric) {
	for g, m := range t.r.learn.state() {
		for term, v := range m.Coefficients {
			ch <- prometheus.MustNewConstMetric(ttftCoefDesc, prometheus.GaugeValue, v, g, term)
		}
		ch <- prometheus.MustNewConstMetric(ttftObsDesc, prometheus.GaugeValue, float64(m.Observations), g)
		if m.MedianRelativeError != nil {
			ch <- prometheus.MustNewConstMetric(ttftErrDesc, prometheus.GaugeValue, *m.MedianRelativeError, g)
		}
		if !t.r.cfg.PerEndpointMetrics {
			continue
		}
		for url, e := range m.Endpoints {
			ch <- prometheus.MustNewConstMetric(ttftSpeedDesc, prometheus.GaugeValue, e.Speed, url)
		}
	}
}
