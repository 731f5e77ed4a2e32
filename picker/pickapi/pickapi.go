package pickapi

// Path is the decision API's path.
const Path = "/routing/v1/pick"

// Answer is the decision API's answer.
type Answer struct {
	Endpoint      string `json:"endpoint"`
	EndpointID    string `json:"endpoint_id"`
	Model         string `json:"model"`
	PromptTokens  int    `json:"prompt_tokens"`
	MatchedTokens int    `json:"matched_tokens"`
	MatchedBlocks int    `json:"matched_blocks"`
	// PrefixHash is 16 lowercase hex digits; "" when the request opted
	// out (X-KVRoute-Cache: off) or its anchor holds no full block.
	PrefixHash string `json:"prefix_hash,omitempty"`
	// PredictedTTFTMs is the time to first token predicted on the chosen
	// endpoint, in milliseconds, from the dispatch (precise; absent for
	// other policies and for an endpoint whose cache is unknown).
	PredictedTTFTMs float64 `json:"predicted_ttft_ms,omitempty"`
	// KVSource is where the chosen endpoint should pull the prompt's
	// prefix from: host:port, the P2P side channel of another endpoint of
	// the request's identity group, out of whose CPU tier (vLLM's
	// kv_transfer_params.remote_kv_source); "" when none. KVSourceTokens
	// is how many prompt tokens the pull is expected to bring (0 with
	// none).
	KVSource       string `json:"kv_source"`
	KVSourceTokens int    `json:"kv_source_tokens"`
	Policy         string `json:"policy"`
	Reason         string `json:"reason"`
	// Priority is the engine priority the picker set (vLLM's request
	// priority, lower first), with --engine-priority; absent without.
	// A gateway forwarding the request sets it in the body.
	Priority *int `json:"priority,omitempty"`
	// Candidates explain the decision (?explain=true).
	Candidates []Candidate `json:"candidates,omitempty"`
	// Keys are the request's block keys, canonical (?explain=true): what a
	// sidecar's /debug/keys?canonical= looks up, for checking parity.
	Keys []string `json:"keys,omitempty"`
}

// Candidate is one endpoint as the decision saw it.
type Candidate struct {
	Endpoint      string  `json:"endpoint"`
	MatchedTokens int     `json:"matched_tokens"` // GPU
	CPUTokens     int     `json:"cpu_matched_tokens,omitempty"`
	StorageTokens int     `json:"storage_matched_tokens,omitempty"`
	InFlight      float64 `json:"in_flight"`
	Cost          float64 `json:"estimated_cost_tokens"`
	// PredictedTTFTMs is the request's predicted TTFT there (precise).
	PredictedTTFTMs float64 `json:"predicted_ttft_ms,omitempty"`
	UnderCap        bool    `json:"under_load_cap"`
	Why             string  `json:"why"`
}

// MostMatched is the most GPU tokens the decision credits to any endpoint:
// the chosen one's, or a candidate's (explained answers).
func (a Answer) MostMatched() int {
	n := a.MatchedTokens
	for _, c := range a.Candidates {
		n = max(n, c.MatchedTokens)
	}
	return n
}
