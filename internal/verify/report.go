package verify

import (
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
)

// EndpointFacts is what verify saw of one endpoint outside the probes:
// its sidecar and engine before them, and its sidecar's stream state after
// them (and after the lag probes).
type EndpointFacts struct {
	Sidecar SidecarFacts
	Details DetailsFacts
	Stream  StreamFacts
}

// ProbeFacts is one probe of a model: sent through the picker, and
// rendered by every endpoint of the model.
type ProbeFacts struct {
	Result ProbeResult
	Tokens []TokenFacts
}

// Facts is everything verify gathered of a fleet.
type Facts struct {
	Picker string // the picker's base URL
	// Self is what verify saw of the picker itself.
	Self PickerFacts
	// Fleet are the endpoints checked (with a model asked for, its own),
	// and Refused the endpoints the picker did not take, as its
	// /debug/endpoints lists them (package debugapi).
	Fleet   []debugapi.Endpoint
	Refused []debugapi.Refusal
	// Endpoints are one per Fleet endpoint, in its order.
	Endpoints []EndpointFacts
	// Probes are, model by model (the order of Groups), the chat,
	// completion and Responses probes.
	Probes []ProbeFacts
	// Admission are the model groups the picker holds admission state
	// for (saturated, or with requests waiting).
	Admission []Admission
	// Metrics are what the picker's admin port, then each sidecar's (in
	// the order of Fleet, each once), served at /metrics.
	Metrics []MetricsFacts
	// Lags are, model by model, the lag probes of the endpoints the picker
	// routes the model to (an endpoint in another identity group of the
	// model gets no routing, so no lag to measure: its identity checks say
	// why).
	Lags []LagResult
}

// Limits are the thresholds Judge applies.
type Limits struct {
	MaxStale float64       // seconds without an update from the sidecar
	MaxLag   time.Duration // event-to-routable lag a lag probe passes with
	// Series are, by component (ComponentPicker, ComponentSidecar,
	// ComponentGossip), the series its /metrics must serve: the
	// dashboard's (deploy/monitoring). None: /metrics need only answer.
	Series map[string][]string
}

// DefaultLimits are kvroute verify's defaults.
func DefaultLimits() Limits { return Limits{MaxStale: DefaultMaxStale, MaxLag: DefaultMaxLag} }

// Report is verify's result (kvroute verify --json prints it).
type Report struct {
	Picker string        `json:"picker"`
	Groups []Group       `json:"groups"`
	Probes []ProbeResult `json:"probes"`
	Lags   []LagResult   `json:"lag_probes"`
	Checks []Check       `json:"checks"`
	OK     bool          `json:"ok"`
	Fleet  []Endpoint    `json:"endpoints"`
}

// Judge turns a fleet's facts into its report: the identity, freshness
// and picker-state checks, the picker's own (gossip, admin surface), the
// refused endpoints, the models' admission and KV sources, each
// endpoint's sidecar, its stream and
// its cached-token details, then each probe's checks followed by its
// per-endpoint token checks, then the lag probes, then each admin port's
// /metrics. OK is whether every check passed.
func Judge(f Facts, lim Limits) Report {
	r := Report{Picker: f.Picker, Fleet: reported(f.Fleet), Lags: f.Lags}
	r.Groups, r.Checks = Consistency(f.Fleet, lim.MaxStale)
	r.Checks = append(r.Checks, JudgePicker(f.Self)...)
	for _, rf := range f.Refused {
		r.Checks = append(r.Checks, refusedCheck(rf))
	}
	for _, a := range f.Admission {
		r.Checks = append(r.Checks, JudgeAdmission(a))
	}
	r.Checks = append(r.Checks, JudgeKVSources(f.Fleet)...)
	for _, e := range f.Endpoints {
		r.Checks = append(r.Checks, JudgeSidecar(e.Sidecar), JudgeGossip(e.Sidecar), JudgeStream(e.Stream), JudgeCachedDetails(e.Details))
	}
	for _, p := range f.Probes {
		r.Probes = append(r.Probes, p.Result)
		r.Checks = append(r.Checks, JudgeProbe(p.Result)...)
		for _, t := range p.Tokens {
			r.Checks = append(r.Checks, JudgeTokenParity(t))
		}
	}
	for _, l := range f.Lags {
		r.Checks = append(r.Checks, JudgeLag(l, lim.MaxLag))
	}
	r.Checks = append(r.Checks, JudgeMetrics(f.Metrics, lim.Series)...)
	r.OK = len(Failed(r.Checks)) == 0
	return r
}

// Endpoint is one endpoint as kvroute verify --json reports it (the
// report's "endpoints"): what verify judged of the picker's entry
// (debugapi.Endpoint), under the same names. It is verify's output,
// pinned by the golden file, not the picker's wire: a field the picker
// adds appears here only when verify reports it.
type Endpoint struct {
	Endpoint             string  `json:"endpoint"`
	Sidecar              string  `json:"sidecar"`
	Model                string  `json:"model"`
	Rank                 int     `json:"rank"`
	BlockSize            int     `json:"block_size"`
	NumGPUBlocks         int     `json:"num_gpu_blocks"`
	HashAlgo             string  `json:"hash_algo"`
	KeyFormat            string  `json:"key_format"`
	SummaryParams        string  `json:"summary_params"`
	TokenizerFingerprint string  `json:"tokenizer_fingerprint"`
	Partial              bool    `json:"partial"`
	StaleSecs            float64 `json:"seconds_since_update"`
	NeverUpdated         bool    `json:"never_updated,omitempty"`
	// SidecarDebug is the sidecar's debug HTTP base URL ("" unknown).
	SidecarDebug string `json:"sidecar_debug"`
	// Group is the picker's identity group of the endpoint.
	Group string `json:"group,omitempty"`
	// State is the picker's health state of the endpoint (cached,
	// load_only, draining, down) and StateReason why; StreamState and
	// StreamReason the sidecar's verdict on its event stream, as the picker
	// has it; LagSecs its recent event-to-routable lag (nil: none). All
	// absent from pickers that do not report them.
	State        string   `json:"state,omitempty"`
	StateReason  string   `json:"state_reason,omitempty"`
	StreamState  string   `json:"stream_state,omitempty"`
	StreamReason string   `json:"stream_reason,omitempty"`
	LagSecs      *float64 `json:"lag_seconds,omitempty"`
	// KVSource is where peers pull the endpoint's CPU-tier KV from
	// (host:port), absent when it advertises none.
	KVSource string `json:"kv_source,omitempty"`
}

// reported is the report's endpoints of the picker's (nil for none).
func reported(fleet []debugapi.Endpoint) []Endpoint {
	var out []Endpoint
	for _, e := range fleet {
		out = append(out, Endpoint{Endpoint: e.Endpoint, Sidecar: e.Sidecar, Model: e.Model, Rank: e.Rank, BlockSize: e.BlockSize,
			NumGPUBlocks: e.NumGPUBlocks, HashAlgo: e.HashAlgo, KeyFormat: e.KeyFormat, SummaryParams: e.SummaryParams,
			TokenizerFingerprint: e.TokenizerFingerprint, Partial: e.Partial, StaleSecs: e.StaleSecs, NeverUpdated: e.NeverUpdated,
			SidecarDebug: e.SidecarDebug, Group: e.Group, State: e.State, StateReason: e.StateReason,
			StreamState: e.StreamState, StreamReason: e.StreamReason, LagSecs: e.LagSeconds, KVSource: e.KVSource})
	}
	return out
}
