package enginesim

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/test/enginesim/p2p"
	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// p2pTierLabel is the P2P tier's tier label: vLLM labels a secondary tier
// "<index+1>:<type>" (the primary CPU tier is "0:primary").
const p2pTierLabel = "1:p2p"

// offloadBuckets are vLLM's buckets for the offload size histograms, in
// bytes.
var offloadBuckets = []float64{1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6}

// offloadMetrics are the OffloadingConnector's series, registered only when
// it is configured, as vLLM registers its connector's: vLLM's names, help
// and labels (model_name, engine; tier for the tiering spec's), and ours
// (kvroute_engine_) for what vLLM does not export.
type offloadMetrics struct {
	loadBytes, loadTime, storeBytes, storeTime prometheus.Counter
	loadSize, storeSize                        prometheus.Histogram
	// The deprecated transfer_type-labelled series vLLM still emits beside
	// the flat ones: CPU_to_GPU (loads) and GPU_to_CPU (stores).
	totalBytes, totalTime *prometheus.CounterVec
	size                  *prometheus.HistogramVec
	storesSkipped         prometheus.Counter // CPUOffloadingSpec only; never counts (store_threshold ≤ 1)
	tokensByTier          *prometheus.CounterVec

	p2p *p2pMetrics // nil without the P2P tier
}

// p2pMetrics are the tiering spec's series for the P2P tier (tier="1:p2p")
// and ours for pulls.
type p2pMetrics struct {
	readBytes, readTime, writeBytes, writeTime prometheus.Counter
	promotionFailures, cascadeFailures         prometheus.Counter
	blockQueries, blockHits                    prometheus.Counter
	promotionJobs                              prometheus.Counter
	pullFailures                               *prometheus.CounterVec
}

func newOffloadMetrics(reg prometheus.Registerer, cfg *Config, labels prometheus.Labels) *offloadMetrics {
	f := func(c prometheus.Collector) prometheus.Collector { reg.MustRegister(c); return c }
	counter := func(name, help string) prometheus.Counter {
		return f(prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})).(prometheus.Counter)
	}
	histogram := func(name, help string) prometheus.Histogram {
		return f(prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: offloadBuckets})).(prometheus.Histogram)
	}
	m := &offloadMetrics{
		loadBytes:  counter("vllm:kv_offload_load_bytes_total", "Total bytes loaded from offload storage to GPU."),
		loadTime:   counter("vllm:kv_offload_load_time_total", "Total load time from offload storage to GPU, in seconds."),
		loadSize:   histogram("vllm:kv_offload_load_size", "Histogram of KV offload load operation size, in bytes."),
		storeBytes: counter("vllm:kv_offload_store_bytes_total", "Total bytes stored from GPU to offload storage."),
		storeTime:  counter("vllm:kv_offload_store_time_total", "Total store time from GPU to offload storage, in seconds."),
		storeSize:  histogram("vllm:kv_offload_store_size", "Histogram of KV offload store operation size, in bytes."),
		totalBytes: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:kv_offload_total_bytes_total",
			Help: "Number of bytes offloaded by KV connector", ConstLabels: labels}, []string{"transfer_type"})).(*prometheus.CounterVec),
		totalTime: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:kv_offload_total_time_total",
			Help: "Total time measured by all KV offloading operations", ConstLabels: labels}, []string{"transfer_type"})).(*prometheus.CounterVec),
		size: f(prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:kv_offload_size",
			Help: "Histogram of KV offload transfer size, in bytes.", ConstLabels: labels, Buckets: offloadBuckets}, []string{"transfer_type"})).(*prometheus.HistogramVec),
		tokensByTier: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_prompt_tokens_by_tier_total",
			Help:        "Prompt tokens the KV connector supplied, by tier: cpu (this engine's CPU tier) and p2p (pulled from a peer's); their sum is vllm:external_prefix_cache_hits. Ours: vLLM does not split them.",
			ConstLabels: labels}, []string{"tier"})).(*prometheus.CounterVec),
	}
	for _, t := range []string{"CPU_to_GPU", "GPU_to_CPU"} {
		m.totalBytes.WithLabelValues(t)
		m.totalTime.WithLabelValues(t)
		m.size.WithLabelValues(t)
	}
	m.tokensByTier.WithLabelValues("cpu")
	if cfg.KVTransfer.Offload.SpecName == CPUOffloadingSpec {
		m.storesSkipped = counter("vllm:kv_offload_stores_skipped_total", "Number of KV offload stores skipped because the reuse threshold was not reached.")
	}
	if cfg.KVTransfer.P2PEnabled() {
		m.tokensByTier.WithLabelValues("p2p")
		m.p2p = newP2PMetrics(f, labels)
	}
	return m
}

func newP2PMetrics(f func(prometheus.Collector) prometheus.Collector, labels prometheus.Labels) *p2pMetrics {
	tier := prometheus.Labels{"tier": p2pTierLabel}
	for k, v := range labels {
		tier[k] = v
	}
	counter := func(name, help string) prometheus.Counter {
		return f(prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: tier})).(prometheus.Counter)
	}
	m := &p2pMetrics{
		readBytes:         counter("vllm:kv_offload_tiering_read_bytes_total", "Total bytes read from secondary tiers into the primary tier."),
		readTime:          counter("vllm:kv_offload_tiering_read_time_total", "Total time spent reading from secondary tiers into the primary tier, in seconds."),
		writeBytes:        counter("vllm:kv_offload_tiering_write_bytes_total", "Total bytes written from the primary tier to secondary tiers."),
		writeTime:         counter("vllm:kv_offload_tiering_write_time_total", "Total time spent writing from the primary tier to secondary tiers, in seconds."),
		promotionFailures: counter("vllm:kv_offload_tiering_promotion_job_failures_total", "Number of failed secondary-tier promotion jobs."),
		cascadeFailures:   counter("vllm:kv_offload_tiering_cascade_job_failures_total", "Number of failed secondary-tier cascade jobs."),
		blockQueries:      counter("vllm:kv_offload_tiering_block_queries_total", "Number of block lookup queries sent to secondary tiers."),
		blockHits:         counter("vllm:kv_offload_tiering_block_hits_total", "Number of block lookup hits in secondary tiers."),
		promotionJobs: counter("kvroute_engine_kv_offload_tiering_promotion_jobs_total",
			"Secondary-tier promotion jobs started: for the P2P tier, pulls (a lookup that hit, then a fetch). Ours: vLLM counts only the failed ones."),
		pullFailures: f(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_engine_p2p_pull_failures_total",
			Help:        "P2P pulls that failed into a local recompute, by reason: unreachable, rejected (fingerprint mismatch, duplicate), handshake, timeout (vLLM's 30 s), peer_down, closed. Ours.",
			ConstLabels: labels}, []string{"reason"})).(*prometheus.CounterVec),
	}
	for _, r := range p2p.Reasons {
		m.pullFailures.WithLabelValues(r)
	}
	return m
}

// observeOffload counts a core step's connector figures, when there is a
// connector.
func (e *Engine) observeOffload(st sched.Step) {
	if m := e.metrics.offload; m != nil {
		m.observe(e.metrics, stepOffload(st), h2dBandwidth(e.cfg.Sim.Profile()))
	}
}

// offloadStep is what one core step did through the connector: the
// figures the core reports with its Step.
type offloadStep struct {
	// PromptTokens are the prompt tokens admitted (the connector's
	// queries, vllm:external_prefix_cache_queries).
	PromptTokens int
	// CPUHitTokens and PulledTokens are the admitted prompts' tokens
	// supplied by the CPU tier and pulled from peers (together
	// vllm:external_prefix_cache_hits).
	CPUHitTokens, PulledTokens int
	// LoadedBytes went CPU→GPU (CPU hits and pulled blocks),
	// StoredBytes GPU→CPU, PulledBytes peer→CPU.
	LoadedBytes, StoredBytes, PulledBytes int64
	// Pulls arrived, PullFailures failed (into recompute; a miss, the
	// source holding nothing, is not a failure), in the step.
	Pulls, PullFailures int
}

// observe counts a step's connector figures; bandwidth is the profile's
// host-device bandwidth, which times the loads and stores.
func (m *offloadMetrics) observe(ext *metrics, s offloadStep, bandwidth float64) {
	if s.PromptTokens > 0 {
		ext.externalQueries.Add(float64(s.PromptTokens))
		ext.externalHits.Add(float64(s.CPUHitTokens + s.PulledTokens))
	}
	m.tokensByTier.WithLabelValues("cpu").Add(float64(s.CPUHitTokens))
	transfer := func(bytes int64, total, secs prometheus.Counter, size prometheus.Histogram, kind string) {
		if bytes <= 0 {
			return
		}
		t := 0.0
		if bandwidth > 0 {
			t = float64(bytes) / bandwidth
		}
		total.Add(float64(bytes))
		secs.Add(t)
		size.Observe(float64(bytes))
		m.totalBytes.WithLabelValues(kind).Add(float64(bytes))
		m.totalTime.WithLabelValues(kind).Add(t)
		m.size.WithLabelValues(kind).Observe(float64(bytes))
	}
	transfer(s.LoadedBytes, m.loadBytes, m.loadTime, m.loadSize, "CPU_to_GPU")
	transfer(s.StoredBytes, m.storeBytes, m.storeTime, m.storeSize, "GPU_to_CPU")
	if p := m.p2p; p != nil {
		m.tokensByTier.WithLabelValues("p2p").Add(float64(s.PulledTokens))
		p.readBytes.Add(float64(max(s.PulledBytes, 0)))
		p.promotionJobs.Add(float64(s.Pulls))
		p.promotionFailures.Add(float64(s.PullFailures))
	}
}

// observePull counts what one pull's side-channel exchange found, as the
// shell sees it: the blocks probed and found at the peer, its transfer
// time, and its failure's reason.
func (m *offloadMetrics) observePull(d pullDone) {
	p := m.p2p
	if p == nil {
		return
	}
	p.blockQueries.Add(float64(d.probed))
	p.blockHits.Add(float64(d.found))
	p.readTime.Add(d.wait.Seconds())
	if d.failed {
		p.pullFailures.WithLabelValues(d.reason).Inc()
	}
}
