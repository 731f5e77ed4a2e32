package enginesim

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// metrics are one rank's Prometheus series, under vLLM's names (counters
// carry the _total suffix the Python client adds) with vLLM's model_name and
// engine labels; simulator-only series are prefixed kvroute_engine_.
type metrics struct {
	running, waiting, usage        prometheus.Gauge
	prefixQueries, prefixHits      prometheus.Counter
	externalQueries, externalHits  prometheus.Counter
	promptTokensCached             prometheus.Counter
	promptTokensRecomputed         prometheus.Counter
	promptTokens, generationTokens prometheus.Counter
	preemptions, aborted           prometheus.Counter
	resetFailures                  prometheus.Counter
	success                        *prometheus.CounterVec
	ttft                           prometheus.Histogram
	queueTime, prefillTime         prometheus.Histogram
	startTime                      prometheus.Gauge
	httpErrors                     *prometheus.CounterVec
	events, eventBatchesDropped    *prometheus.CounterVec
	replayRequests                 *prometheus.CounterVec
	cacheInfo                      *prometheus.GaugeVec
	kvParamsIgnored                *prometheus.CounterVec
	// offload are the KV connector's series; nil without one.
	offload *offloadMetrics
}

// requestLatencyBuckets are vLLM's buckets for its per-request phase
// histograms (e2e, queue, inference, prefill, decode).
var requestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
	40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

func newMetrics(reg prometheus.Registerer, cfg *Config, rank int) *metrics {
	labels := prometheus.Labels{"model_name": cfg.servedNames()[0], "engine": strconv.Itoa(rank)}
	f := func(c prometheus.Collector) prometheus.Collector { reg.MustRegister(c); return c }
	gauge := func(name, help string) prometheus.Gauge {
		return f(prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})).(prometheus.Gauge)
	}
	counter := func(name, help string) prometheus.Counter {
		return f(prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})).(prometheus.Counter)
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return f(prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})).(prometheus.Histogram)
	}
	m := &metrics{
		running:                gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:                gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		usage:                  gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		prefixQueries:          counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:             counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		promptTokens:           counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		externalQueries:        counter("vllm:external_prefix_cache_queries_total", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens."),
		externalHits:           counter("vllm:external_prefix_cache_hits_total", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens."),
		promptTokensCached:     counter("vllm:prompt_tokens_cached_total", "Prompt tokens served from the prefix cache."),
		promptTokensRecomputed: counter("vllm:prompt_tokens_recomputed_total", "Prompt tokens computed."),
		generationTokens:       counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preemptions:            counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		aborted:                counter("kvroute_engine_requests_aborted_total", "Requests dropped because their client went away."),
		resetFailures:          counter("kvroute_engine_reset_prefix_cache_failures_total", "/reset_prefix_cache calls that could not reset (blocks in use by running requests); answered 200, as vLLM does."),
		startTime:              gauge("process_start_time_seconds", "Start time of the (simulated) engine process since unix epoch in seconds."),
		success: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
			Help: "Count of successfully processed requests.", ConstLabels: labels}, []string{"finished_reason"})).(*prometheus.CounterVec),
		ttft: histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds (simulated time).",
			[]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}),
		// vLLM observes these two when a request finishes, on its
		// request-latency buckets; here on the simulated clock.
		queueTime:   histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestLatencyBuckets),
		prefillTime: histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", requestLatencyBuckets),
		httpErrors: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_http_errors_total",
			Help: "Requests answered with an error, by path and status.", ConstLabels: labels}, []string{"path", "status"})).(*prometheus.CounterVec),
		events: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_kv_events_total",
			Help: "KV-cache events published, by type.", ConstLabels: labels}, []string{"type"})).(*prometheus.CounterVec),
		eventBatchesDropped: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_kv_event_batches_dropped_total",
			Help: "Event batches not sent live: by the drop fault, or past the high-water mark.", ConstLabels: labels}, []string{"reason"})).(*prometheus.CounterVec),
		replayRequests: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_kv_replay_requests_total",
			Help: "Replay requests received, by outcome.", ConstLabels: labels}, []string{"outcome"})).(*prometheus.CounterVec),
		cacheInfo: f(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:cache_config_info",
			Help: "Information of the LLMEngine CacheConfig"}, []string{
			"block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization",
			"num_cpu_blocks", "num_gpu_blocks", "prefix_caching_hash_algo", "engine", "model_name"})).(*prometheus.GaugeVec),
	}
	m.kvParamsIgnored = f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_kv_transfer_params_ignored_total",
		Help: "Requests' kv_transfer_params (or a part) ignored, as vLLM's connector ignores them, by reason: malformed, no_p2p_tier, " +
			"not_modelled (the P/D roles), legacy_key (p2p, prefill, decode), self (the source is this rank). Ours.",
		ConstLabels: labels}, []string{"reason"})).(*prometheus.CounterVec)
	for _, r := range kvIgnoredReasons {
		m.kvParamsIgnored.WithLabelValues(r)
	}
	if cfg.KVTransfer.Enabled() {
		m.offload = newOffloadMetrics(reg, cfg, labels)
	}
	m.cacheInfo.WithLabelValues(strconv.Itoa(cfg.BlockSize), "auto", "True", "0.9", "0",
		strconv.Itoa(cfg.NumGPUBlocks), cfg.HashAlgo, strconv.Itoa(rank), cfg.servedNames()[0]).Set(1)
	return m
}

// observe sets the load gauges to the core's figures.
func (m *metrics) observe(l sched.Load) {
	m.running.Set(float64(l.Running))
	m.waiting.Set(float64(l.Waiting))
	m.usage.Set(l.KVUsage)
}
