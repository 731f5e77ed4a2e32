package fleet

import (
	"time"

	"github.com/kvroute/kvroute/internal/identity"
)

// Identity is one endpoint as its sidecar describes it: what keys,
// summaries and tokens depend on, and where to find the sidecar's debug
// pages. It is kvroute's own copy of what the summary stream carries, so
// routing never sees protobuf types.
type Identity struct {
	Endpoint             string // the engine's base URL
	Rank                 int    // data-parallel rank
	Model                string // the served model name
	BlockSize            int    // the engine's KV block size; 0 while unknown
	NumGPUBlocks         int
	HashAlgo             string
	KeyFormat            string
	SummaryParams        string
	TokenizerFingerprint string
	Epoch                uint64
	Partial              bool   // the sidecar lost events it could not replay
	DebugURL             string // the sidecar's debug HTTP base URL; "" unknown
	StreamState          string // the live event stream, as the sidecar judged it when asked
	StreamReason         string
	// KVSource is where peers pull the endpoint's CPU-tier KV from: its
	// engine's P2P side channel, host:port (vLLM's P2P tier); "" when the
	// engine runs none, and it is then never named as a source. Not part
	// of the identity group.
	KVSource string
}

// Group is the identity group the endpoint belongs to: endpoints of
// different groups are never compared.
func (id Identity) Group() string {
	return identity.Group{Model: id.Model, BlockSize: id.BlockSize, KeyFormat: id.KeyFormat,
		SummaryParams: id.SummaryParams, TokenizerFingerprint: id.TokenizerFingerprint}.ID()
}

// Load is an engine's load as its sidecar last scraped it.
type Load struct {
	Waiting      float64 // requests waiting
	Running      float64 // requests running
	KVCacheUsage float64 // 0..1
	// EngineDown: the sidecar's last check of the engine failed, and how.
	EngineDown  bool
	EngineError string
	// StreamState and StreamReason are the sidecar's verdict on the live
	// event stream (Stream* constants; "" from sidecars that send none).
	StreamState, StreamReason string
	// Draining: the sidecar announced that the engine is going away, for
	// DrainReason (such as "SIGTERM").
	Draining    bool
	DrainReason string
	// Engine are the engine's own request figures, cumulative, as its
	// /metrics last had them.
	Engine EngineStats
}

// EngineStats are an engine's own cumulative request figures from its
// /metrics: the sums (seconds, on the engine's clock) and counts of vLLM's
// request histograms and its prompt counters, each summed over the
// series the engine exports. The picker learns from their growth between
// reports (what every picker's requests cost there, not just its own).
// Have is false when the engine (or its sidecar) reports none, and every
// figure is then 0; a figure that went down is an engine restart.
//
// The histograms are not observed at the same moment: vLLM observes the
// TTFT at a request's first token, the queue and prefill times when the
// request finishes. So QueueCount and PrefillCount trail TTFTCount by the
// requests still decoding (and count only requests that finished), and a
// report's growth in QueueSeconds + PrefillSeconds is the TTFT of the
// requests that finished since, not of those whose first token came.
type EngineStats struct {
	Have bool
	// QueueSeconds and QueueCount: vllm:request_queue_time_seconds (time
	// from arrival to first scheduled; a preempted request's readmission
	// does not count).
	QueueSeconds, QueueCount float64
	// PrefillSeconds and PrefillCount: vllm:request_prefill_time_seconds
	// (first scheduled to first token, any preemption included).
	PrefillSeconds, PrefillCount float64
	// TTFTSeconds and TTFTCount: vllm:time_to_first_token_seconds (arrival
	// to first token).
	TTFTSeconds, TTFTCount float64
	// PromptTokens and CachedTokens: vllm:prompt_tokens_total and
	// vllm:prefix_cache_hits_total (prompt tokens found in the prefix
	// cache; vllm:gpu_prefix_cache_hits_total on vLLM ~0.9–0.10).
	PromptTokens, CachedTokens float64
}

// Endpoint is one engine rank as the fleet state knows it: a value,
// copied out of the state, safe to keep.
type Endpoint struct {
	URL string
	// LoadAt is when the last load report (Load) arrived (this process's
	// clock), zero while none has. Beside URL: the two fields a decision
	// reads of every endpoint of its group in the bookings, on one cache
	// line.
	LoadAt  time.Time
	Sidecar string // the sidecar's gRPC address
	Group   string
	Info    Identity
	// Load is the last load report, which arrived at LoadAt.
	Load Load
	// LastUpdate is when anything (delta, snapshot, load report) last
	// arrived for the endpoint; zero while nothing has. Since is when the
	// state took the endpoint.
	LastUpdate, Since time.Time
	// StreamState and StreamReason are the sidecar's latest verdict on the
	// live event stream (from Info, then from every load report).
	StreamState, StreamReason string
	// Ejected: the picker's passive outlier detection took the endpoint
	// out, for EjectReason; it is probed again from EjectedUntil and comes
	// back when a probe succeeds.
	Ejected      bool
	EjectedUntil time.Time
	EjectReason  string
	// Lag is the median of the recent event-to-routable lags (0: none
	// measured yet).
	Lag time.Duration
	// SidecarLost is when the endpoint's sidecar was lost (zero: it is
	// not); EngineAnswers is the picker's own health probe of the engine
	// since.
	SidecarLost   time.Time
	EngineAnswers bool
}

// HasLoad reports whether a load report has arrived.
func (e *Endpoint) HasLoad() bool { return !e.LoadAt.IsZero() }

// Refused is an endpoint a sidecar offered that the state did not take.
type Refused struct {
	Info    Identity
	Sidecar string
	Reason  string // ReasonSummaryParams, ReasonGroupFull or ReasonOtherOwner
}
