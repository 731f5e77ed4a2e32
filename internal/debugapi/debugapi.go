package debugapi

// Path is where the picker's admin surface serves the Document.
const Path = "/debug/endpoints"

// Document is the whole answer of GET /debug/endpoints. Its fields are in
// the order of their JSON names.
type Document struct {
	// Endpoints are the endpoints the picker routes among, sorted by URL.
	Endpoints []Endpoint `json:"endpoints"`
	// Picker is what the picker says of itself.
	Picker Picker `json:"picker"`
	// Refused are the endpoints offered but not taken (never routed to).
	Refused []Refusal `json:"refused"`
	// SidecarsFailing are the sidecars followed whose summary stream
	// fails: one that never streamed has no endpoint to show it by.
	SidecarsFailing []SidecarFailing `json:"sidecars_failing"`
	// TTFTModels are the picker's learned TTFT models, one per identity
	// group, sorted by group.
	TTFTModels []TTFTModel `json:"ttft_models"`
}

// TTFTModel is one identity group's learned model of time to first
// token: the group, its coefficients (by term: overhead_s, tail_s_per_ktok,
// attention_s_per_mtok2, ahead_s_per_ktok, running_s_per_seq,
// running_tail_s_per_seq_ktok, queued_s_per_request, kv_usage_s), the
// requests it learned from, the median
// relative error of its recent predictions (nil before any), and the
// group's mean uncached prompt per request.
type TTFTModel struct {
	Group               string             `json:"group"`
	Coefficients        map[string]float64 `json:"coefficients"`
	Observations        int                `json:"observations"`
	MedianRelativeError *float64           `json:"median_relative_error"`
	MeanUncachedTokens  float64            `json:"mean_uncached_tokens"`
}

// TTFTEndpoint is what the TTFT model learned of one endpoint: its speed
// factor against the group's curve, the requests it learned from there,
// and, from the engine's own counters and histograms, its mean uncached
// prompt and its mean queue, prefill and TTFT seconds per request.
type TTFTEndpoint struct {
	SpeedFactor        float64 `json:"speed_factor"`
	Observations       int     `json:"observations"`
	MeanUncachedTokens float64 `json:"engine_mean_uncached_tokens"`
	MeanQueueSeconds   float64 `json:"engine_mean_queue_s"`
	MeanPrefillSeconds float64 `json:"engine_mean_prefill_s"`
	MeanTTFTSeconds    float64 `json:"engine_mean_ttft_s"`
}

// Endpoint is one endpoint (an engine rank) as the picker knows it.
type Endpoint struct {
	Endpoint   string `json:"endpoint"`    // the engine's base URL
	EndpointID string `json:"endpoint_id"` // the decision API's ID of it
	Sidecar    string `json:"sidecar"`     // the sidecar's gRPC address
	// SidecarDebug is the sidecar's debug HTTP base URL ("" unknown).
	SidecarDebug string `json:"sidecar_debug"`
	Group        string `json:"group"` // the picker's identity group
	Model        string `json:"model"`
	Rank         int    `json:"rank"`
	BlockSize    int    `json:"block_size"`
	// The rest of the identity the sidecar reported: what keys, summaries
	// and tokens must agree on across an identity group.
	NumGPUBlocks         int    `json:"num_gpu_blocks"`
	HashAlgo             string `json:"hash_algo"`
	KeyFormat            string `json:"key_format"`
	SummaryParams        string `json:"summary_params"`
	TokenizerFingerprint string `json:"tokenizer_fingerprint"`
	Epoch                uint64 `json:"epoch"`
	Partial              bool   `json:"partial"` // the sidecar lost events it could not replay
	// KVSource is where peers pull the endpoint's CPU-tier KV from (its
	// engine's P2P side channel, host:port), absent when it advertises
	// none: it is then never named as a source.
	KVSource string  `json:"kv_source,omitempty"`
	Waiting  float64 `json:"waiting"`
	Running  float64 `json:"running"`
	KVUsage  float64 `json:"kv_cache_usage"` // 0..1
	// StaleSecs is how long ago the sidecar last sent anything for the
	// endpoint; 0 with NeverUpdated, when it has sent nothing yet.
	StaleSecs    float64 `json:"seconds_since_update"`
	NeverUpdated bool    `json:"never_updated,omitempty"`
	// State is the endpoint's health on the picker (cached, load_only,
	// draining, down) and StateReason why; StreamState and StreamReason
	// the sidecar's verdict on its live event stream; EngineDown and
	// EngineError whether the sidecar's last check of the engine failed,
	// and how.
	State        string `json:"state"`
	StateReason  string `json:"state_reason,omitempty"`
	StreamState  string `json:"stream_state,omitempty"`
	StreamReason string `json:"stream_reason,omitempty"`
	EngineDown   bool   `json:"engine_down,omitempty"`
	EngineError  string `json:"engine_error,omitempty"`
	// LagSeconds is the median of the endpoint's recent event-to-routable
	// lags; nil (absent) while none was measured.
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
	// TTFT is what the TTFT model learned of the endpoint (absent before
	// anything).
	TTFT *TTFTEndpoint `json:"ttft,omitempty"`
}

// Picker is what the picker says of itself.
type Picker struct {
	// GossipInsecure: its gossip runs without a keyring off loopback
	// (--gossip-insecure).
	GossipInsecure bool `json:"gossip_insecure"`
	// Instance is the picker's instance id, random at each start ("" when
	// it shares no bookings).
	Instance string `json:"instance,omitempty"`
	// Pickers are the other pickers whose bookings it follows (found
	// through gossip, or --peer-pickers), sorted by address; absent when
	// it shares no bookings (SharesBookings false).
	Pickers []PeerPicker `json:"pickers,omitempty"`
	// SharesBookings: it streams its bookings to the other pickers and
	// follows theirs (--peer-listen, and gossip or --peer-pickers).
	SharesBookings bool `json:"shares_bookings"`
	// ExtProc is its endpoint picker (--ext-proc-listen); absent when it
	// serves none.
	ExtProc *ExtProc `json:"ext_proc,omitempty"`
	// EnginePriority is its --engine-priority state; absent when off.
	EnginePriority *EnginePriority `json:"engine_priority,omitempty"`
}

// EnginePriority is the picker's --engine-priority: the engines that
// refused a request's priority since it started (they run
// --scheduling-policy fcfs; their requests are resent without one),
// sorted.
type EnginePriority struct {
	RefusedBy []string `json:"refused_by"`
}

// ExtProc is the picker's endpoint picker (Envoy ext_proc, with gRPC
// health), as it listens.
type ExtProc struct {
	// Address is the address it listens on, as bound (host:port; an
	// unspecified host is every interface of the picker's).
	Address string `json:"address"`
	// TLS: it serves TLS (--ext-proc-tls-cert). ClientCert: it requires
	// a client certificate (--ext-proc-client-ca).
	TLS        bool `json:"tls"`
	ClientCert bool `json:"client_cert"`
}

// PeerPicker is another picker as this one follows its bookings.
type PeerPicker struct {
	// Address is the other picker's --peer-listen address as dialled.
	Address string `json:"address"`
	// Awaiting are its bookings held here before their first token.
	Awaiting int `json:"awaiting"`
	// Error is why its stream last failed ("" none).
	Error string `json:"error,omitempty"`
	// Expired counts its bookings dropped at their lifetime while still
	// awaiting their first token (releases lost).
	Expired uint64 `json:"expired"`
	// Instance is its instance id, from its last batch.
	Instance string `json:"instance,omitempty"`
	// LagSeconds is how old its last batch was when it arrived, by the
	// two pickers' clocks (nil before one).
	LagSeconds *float64 `json:"lag_seconds,omitempty"`
	// LastBatchSeconds is how long ago its last batch (heartbeats
	// included) arrived (nil before one).
	LastBatchSeconds *float64 `json:"last_batch_seconds,omitempty"`
	// Live are its bookings counted here now.
	Live int `json:"live"`
	// Received counts its booking changes applied here.
	Received uint64 `json:"received"`
	// State is following (its stream is up), connecting (dialling, or
	// waiting to dial again after a failure) or self (the address is this
	// picker's own: skipped).
	State string `json:"state"`
}

// Peer picker states.
const (
	PeerFollowing  = "following"
	PeerConnecting = "connecting"
	PeerSelf       = "self"
)

// Refusal is an endpoint the picker was offered but did not take, and
// why (Reason: see the package's contract).
type Refusal struct {
	Endpoint             string `json:"endpoint"`
	Sidecar              string `json:"sidecar"`
	Reason               string `json:"reason"`
	Model                string `json:"model"`
	BlockSize            int    `json:"block_size"`
	SummaryParams        string `json:"summary_params"`
	TokenizerFingerprint string `json:"tokenizer_fingerprint"`
	// Since (RFC 3339, UTC) and Detail are the trust check's: since when
	// it refuses the endpoint and why; empty for the other reasons.
	Since  string `json:"since,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// SidecarFailing is a sidecar whose summary stream is failing: a TLS
// handshake (reason tls), not reached (unavailable), or ended otherwise
// (stream); Error is the last one, SecondsFailing since when it began.
type SidecarFailing struct {
	Sidecar        string  `json:"sidecar"`
	Reason         string  `json:"reason"`
	Error          string  `json:"error"`
	SecondsFailing float64 `json:"seconds_failing"`
}
