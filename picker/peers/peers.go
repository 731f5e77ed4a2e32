package peers

import (
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/tier"
)

// The policy names, as --policy takes them.
const (
	LLMD        = "llm-d"         // llm-d's default "sticky until saturated" profile
	LLMDPrecise = "llm-d-precise" // llm-d's precise-prefix-cache well-lit path
	Dynamo      = "dynamo"        // NVIDIA Dynamo's KV router, default cost
	SGLang      = "sglang"        // SMG's cache_aware policy, HTTP mode
)

// The arms with KV pulls (shared/docs/peer-policies.md §4), as --policy
// takes them: each a peer's placement and a source decision (Choice.Source),
// or, for LLMDLoad, the recompute control of LLMDLoadP2P.
const (
	LLMDPreciseP2P = "llm-d-precise+p2p" // llm-d-precise's placement + p2p-source-producer (delta 2048)
	LLMDP2P        = "llm-d+p2p"         // llm-d's sticky-until-saturated placement + p2p-source-producer on its own model (delta 1)
	LLMDLoad       = "llm-d-load"        // llm-d's epp-load.yaml: queue 3 + KV utilization 2, weighted-random picker, no pull
	LLMDLoadP2P    = "llm-d-load+p2p"    // LLMDLoad's placement + p2p-source-producer (delta 2048)
	DynamoHint     = "dynamo+hint"       // Dynamo's placement + its KV hint (longest CPU prefix beyond the target's)
)

// Names lists the peer policies.
func Names() []string { return []string{LLMD, LLMDPrecise, Dynamo, SGLang} }

// ArmNames lists the arms with KV pulls and their recompute control
// (LLMDLoad): run on engines with the P2P tier. The other arms' recompute
// controls are the peers themselves (Names): the same placement, no source.
func ArmNames() []string { return []string{LLMDPreciseP2P, LLMDP2P, LLMDLoad, LLMDLoadP2P, DynamoHint} }

// Request is what a peer policy sees of a request.
type Request struct {
	// ID identifies the request (llm-d's request id), for what a policy
	// derives from it per request: the p2p-source-producer's sampling
	// coordinate, FNV-32a(ID)/2^32. "" hashes as the empty string.
	ID        string
	Model     string
	CacheSalt string // "" none
	// Tokens are the prompt's exact tokens; nil when none could be had
	// (a policy then works from what else it has, or falls back to load).
	Tokens []uint32
	// Text is the request's text as SMG's HTTP mode reads it: a text
	// prompt as sent, or the chat messages' (or Responses input items')
	// text contents joined with single spaces.
	Text string
	// BlockSize is the engines' KV block size, in tokens.
	BlockSize int
	// Keys are kvroute's chained keys of the prompt's full blocks at
	// BlockSize (model, salt, LoRA and multimodal items included): the
	// block identities the engines' KV events carry.
	Keys []blockkey.Key
	// MaxTokens is the request's output limit; 0 when not given.
	MaxTokens int
	Stream    bool
}

// PromptTokens is the request's prompt length in tokens.
func (r *Request) PromptTokens() int { return len(r.Tokens) }

// Candidate is one endpoint of the request's identity group.
type Candidate struct {
	ID      string // the engine's URL
	Healthy bool   // routable; a policy never chooses an unhealthy one
	// Matched is how many of the request's leading blocks (at BlockSize)
	// the endpoint holds, per tier, in kvroute's fleet index built from
	// the engines' KV events: the longest run from block 0.
	Matched [tier.Count]int
	// Waiting and KVUsage are the engine's vllm:num_requests_waiting and
	// vllm:kv_cache_usage_perc (0..1) as last scraped.
	Waiting, KVUsage float64
	// NumGPUBlocks is the engine's KV cache size in blocks (0 unknown).
	NumGPUBlocks int
}

// Choice is a policy's pick.
type Choice struct {
	Index  int    // into the candidates; -1 when none is healthy
	Reason string // the rule that decided, e.g. "sticky", "min_load", a metric label
	// Scores is each candidate's figure as the policy saw it (a score,
	// higher better, or a cost, lower better, as the policy's doc says),
	// in input order; 0 for unhealthy ones.
	Scores []float64
	// Source, for the arms with KV pulls (peer-policies.md §4), is the
	// ID of the candidate the chosen one should pull the prefix from (out
	// of its CPU tier); "" for none. Policies without a source rule leave
	// it empty.
	Source string
}

// Ticket names a booking, for FirstChunk, FirstToken and Done.
type Ticket uint64

// Policy is one peer's algorithm and its state. See the package doc for
// the lifecycle and the rules on state and randomness.
type Policy interface {
	Name() string
	// Pick chooses among cands for req at now; rnd seeds its random
	// tie-breaks (Rand).
	Pick(req *Request, cands []Candidate, rnd uint64, now time.Time) Choice
	// Dispatched books req on endpoint, the one Pick chose.
	Dispatched(req *Request, endpoint string, now time.Time) Ticket
	// FirstChunk marks the first chunk of a streamed answer reaching the
	// client, whatever it carries: on a /v1/responses stream that is
	// response.created, sent before the prompt is scheduled. Never called
	// for a non-streamed answer.
	FirstChunk(t Ticket, now time.Time)
	// FirstToken marks the engine's first output token: the prefill is
	// done. On chat and completion streams the first chunk carries it (the
	// caller calls FirstChunk, then FirstToken); on a /v1/responses stream
	// it is the first event after the opening ones; on a non-streamed
	// answer, the answer.
	FirstToken(t Ticket, now time.Time)
	// Done ends the booking (FirstChunk and FirstToken or not).
	Done(t Ticket, now time.Time)
	// Forget drops what the policy holds of an endpoint that left.
	Forget(endpoint string)
}

// Rand is a splitmix64 sequence from a seed: the random values a policy's
// tie-breaks draw, reproducible from the value Pick was given.
type Rand struct{ state uint64 }

// NewRand starts a sequence at seed.
func NewRand(seed uint64) *Rand { return &Rand{state: seed} }

// Uint64 returns the next value.
func (r *Rand) Uint64() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// IntN returns a value in [0, n); n must be positive.
func (r *Rand) IntN(n int) int { return int(r.Uint64() % uint64(n)) }

// Shuffle permutes n items (Fisher–Yates), swapping with swap.
func (r *Rand) Shuffle(n int, swap func(i, j int)) {
	for i := n - 1; i > 0; i-- {
		swap(i, r.IntN(i+1))
	}
}
