package workload

import (
	"time"
)

// Request is one HTTP request a client sends, streaming.
type Request struct {
	// Path is the OpenAI path: /v1/responses, /v1/chat/completions or
	// /v1/completions.
	Path string
	// Body is the encoded JSON body, with "stream" set (and, for chat and
	// completions, stream_options.include_usage).
	Body []byte
	// Tenant, when set, is sent as x-kvroute-tenant.
	Tenant string
	// Conversation and Turn label the request in the results (turn 1, 2,
	// …); Step is its load step (0: the scenario has none).
	Conversation, Turn, Step int
	// Prev is the endpoint the request continues, when the session knows
	// it (from an answer it saw); "" with Turn > 1 lets the driver fill in
	// the conversation's latest answered turn at send time.
	Prev string
	// Tokens, when set, regenerates the prompt's token ids (token-id
	// prompts), so a driver need not keep Body for the pooled bound.
	Tokens func() []uint32
}

// Answer is what the client saw of a request.
type Answer struct {
	Endpoint     string // the x-kvroute-endpoint header
	Text         string // the output text
	PromptTokens int    // usage.prompt_tokens
	OK           bool   // a 200 with the whole stream; false: refused or failed
}

// Session is one client's sequence of requests.
type Session interface {
	// Next returns the request to send after the answer to the previous
	// one (prev nil before the first), and how long to wait before sending
	// it, in simulated time; done when the session is over (then req and
	// wait are unused). A session ends at the first answer that is not OK.
	Next(prev *Answer) (req Request, wait time.Duration, done bool)
}

// After makes a session start when another has been handed the answer to
// one of its turns (a branch starts from a turn's history).
type After struct {
	Session int // index in Plan.Sessions
	Turn    int
}

// Planned is a session with when it starts.
type Planned struct {
	// Start is the offset from the run's start of its first request
	// (after the session's own first wait), when After is nil.
	Start time.Duration
	// After, when set, starts the session once Plan.Sessions[After.Session]
	// has been handed the answer to turn After.Turn, or has ended before
	// it; then Start is ignored and the session's first Next decides
	// whether it runs at all.
	After   *After
	Session Session
}

// Plan is a scenario's run: its sessions.
type Plan struct {
	Sessions []Planned
}

// Fleet is the fleet a scenario is defined for.
type Fleet struct {
	Engines     int // engines
	GPUBlocks   int // KV blocks per engine
	MaxModelLen int // 0: the driver's default
	// CPUBlocks is each engine's CPU offload tier (vLLM's
	// OffloadingConnector, docs/kv-transfer.md §1): completed prompt
	// blocks are copied to CPU and kept LRU; a request whose prefix is in
	// the engine's own CPU tier loads it back over PCIe instead of
	// recomputing it, and a peer may pull it from there when the router
	// names this engine as the source. In blocks of the scenario's block
	// size, 16 tokens as GPUBlocks; 0: no CPU tier (GPU only). A tier no
	// larger than GPUBlocks only mirrors the GPU and adds no hits (vLLM),
	// so a scenario that has one sizes it above.
	CPUBlocks int
	// Profile is the engine latency profile the scenario's sizes, rates
	// and SLO are scaled to, by the name test/enginesim/profile gives it
	// ("gptoss120b-h200", …); "": sim-default. The scenario's own
	// GPUBlocks and MaxModelLen stand, not the profile's.
	Profile string
}

// Options are a plan's inputs besides the scenario's shape.
type Options struct {
	// Seed draws the workload: a seed is a different workload.
	Seed uint64
	// Rate multiplies the nominal arrival rate (1 nominal; > 0).
	Rate float64
	// MaxModelLen is the engines' context length: sessions stop before a
	// prompt would not fit (0: no bound).
	MaxModelLen int
}

// Scenario is a named workload.
type Scenario interface {
	Name() string
	// Fleet is the fleet it is defined for.
	Fleet() Fleet
	// Plan draws the run for o.
	Plan(o Options) (Plan, error)
	// SLO is its default TTFT objective for goodput (p90 ≤ SLO).
	SLO() time.Duration
}
