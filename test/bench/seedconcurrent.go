package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
	"github.com/kvroute/kvroute/test/workload"
)

// SeedConcurrent is seed-continuation's default form: the seed run's
// two-turn agentic conversations (a ≈ 5.8k-token system prompt with its
// tools, a ≈ 700-token task, a fresh cache_salt each), many at once and
// interleaved, on four engines under cache pressure. Conversations start
// at random (a Poisson process of Rate a simulated second); turn 1 asks,
// the answer calls a tool, and after the tool runs (Think) turn 2 carries
// the whole conversation back — the assistant's message, the
// function_call and its function_call_output — as agentic-api rehydrates
// it. So turn 2 of one conversation lands among other conversations'
// first turns: load-only routing brings it back to its first turn's
// engine about one time in Engines, and the working set (every
// conversation's blocks) is several times one engine's KV and above the
// fleet's, while the conversations in progress fit it, so a router that
// knows where each prefix is can keep nearly every turn 2 warm and one that
// guesses can be wrong. SeedContinuation is the sequential form.
//
// Zero fields take the defaults in brackets; the plan (texts, salts,
// starts, tool runs) comes from the run's seed, so every policy gets the
// same requests.
type SeedConcurrent struct {
	Engines       int // [4]
	GPUBlocks     int // KV blocks per engine [3072]
	Conversations int // [64]
	// Rate is conversations started per simulated second, on average
	// [1.25].
	Rate float64
	// InstructionTokens is the system prompt's size (its tools aside)
	// [5800]; InputTokens the task's [700].
	InstructionTokens, InputTokens int
	// ToolMin and ToolMax bound the tool output, in tokens [32, 128].
	ToolMin, ToolMax int
	OutputTokens     int // per turn [32]
	// Think is the longest tool run between the turns, in simulated time;
	// runs are uniform in [Think/4, Think] [2 s].
	Think time.Duration
}

func (s SeedConcurrent) withDefaults() SeedConcurrent {
	s.Engines, s.GPUBlocks = cmp.Or(s.Engines, 4), cmp.Or(s.GPUBlocks, 3072)
	s.Conversations, s.Rate = cmp.Or(s.Conversations, 64), cmp.Or(s.Rate, 1.25)
	s.InstructionTokens, s.InputTokens = cmp.Or(s.InstructionTokens, 5800), cmp.Or(s.InputTokens, 700)
	s.ToolMin, s.ToolMax = cmp.Or(s.ToolMin, 32), cmp.Or(s.ToolMax, 128)
	s.OutputTokens, s.Think = cmp.Or(s.OutputTokens, 32), cmp.Or(s.Think, 2*time.Second)
	return s
}

// Name is the scenario's name.
func (SeedConcurrent) Name() string { return "seed-continuation" }

// Fleet is the fleet the scenario is defined for.
func (s SeedConcurrent) Fleet() FleetConfig {
	s = s.withDefaults()
	return FleetConfig{Engines: s.Engines, GPUBlocks: s.GPUBlocks}
}

// seedTools are the conversations' tools (every conversation has them).
var seedTools = []any{
	map[string]any{"type": "function", "name": "search_orders", "description": "Search the order database by free text.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{
			"query": map[string]any{"type": "string"}, "limit": map[string]any{"type": "integer"}}, "required": []string{"query"}}},
	map[string]any{"type": "function", "name": "read_ticket", "description": "Read a support ticket by its id.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{
			"id": map[string]any{"type": "string"}}, "required": []string{"id"}}},
}

// seedConversation is one planned conversation.
type seedConversation struct {
	id         int
	start      time.Duration // simulated, since the run's start
	think      time.Duration // the tool's run between the turns
	toolTokens int
	seed       uint64 // its texts
}

// plan draws the conversations from rng: Poisson starts, tool runs and
// outputs, and a seed for each one's texts.
func (s SeedConcurrent) plan(rng *rand.Rand) []seedConversation {
	cs := make([]seedConversation, s.Conversations)
	at := 0.0
	for i := range cs {
		if i > 0 {
			at += rng.ExpFloat64() / s.Rate
		}
		cs[i] = seedConversation{id: i, start: time.Duration(at * float64(time.Second)),
			think:      s.Think/4 + time.Duration(rng.Int64N(int64(s.Think-s.Think/4)+1)),
			toolTokens: s.ToolMin + rng.IntN(s.ToolMax-s.ToolMin+1), seed: rng.Uint64()}
	}
	return cs
}

// promptBound is a conversation's longest prompt and output, in tokens,
// with room for the template's markers.
func (s SeedConcurrent) promptBound() int {
	tools, _ := json.Marshal(seedTools)
	return s.InstructionTokens + s.InputTokens + len(chat.Encode(string(tools))) + 2*s.OutputTokens + s.ToolMax + 200
}

// Run runs every conversation concurrently and returns the outcomes in the
// order they were sent.
func (s SeedConcurrent) Run(ctx context.Context, c *Client, rng *rand.Rand) ([]Outcome, error) {
	s = s.withDefaults()
	if s.Engines < 1 || s.Conversations < 1 || s.Rate <= 0 || s.InstructionTokens < 1 || s.InputTokens < 1 || s.ToolMin < 1 ||
		s.ToolMax < s.ToolMin || s.OutputTokens < 1 || s.Think <= 0 {
		return nil, fmt.Errorf("seed-continuation: bad shape %+v", s)
	}
	if n := s.promptBound(); c.MaxModelLen > 0 && n > c.MaxModelLen {
		return nil, fmt.Errorf("seed-continuation: a conversation needs ≈ %d tokens of context, the engines have %d (more --gpu-blocks)", n, c.MaxModelLen)
	}
	convs := s.plan(rng)
	var mu sync.Mutex
	var outcomes []Outcome
	record := func(o Outcome) {
		mu.Lock()
		outcomes = append(outcomes, o)
		mu.Unlock()
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, cv := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.WaitUntil(ctx, start.Add(c.Wall(cv.start))) {
				s.runConversation(ctx, c, cv, record)
			}
		}()
	}
	wg.Wait()
	// Arrival order: the order the pooled bound replays.
	slices.SortStableFunc(outcomes, func(x, y Outcome) int { return x.Start.Compare(y.Start) })
	return outcomes, ctx.Err()
}

// runConversation sends one conversation's two turns.
func (s SeedConcurrent) runConversation(ctx context.Context, c *Client, cv seedConversation, record func(Outcome)) {
	rng := rand.New(rand.NewPCG(cv.seed, uint64(cv.id)))
	instructions := fmt.Sprintf("You are support agent %d. ", cv.id) + workload.Text(rng, s.InstructionTokens)
	input := []any{map[string]any{"role": "user", "content": workload.Text(rng, s.InputTokens)}}
	salt := fmt.Sprintf("conversation-%d-%016x", cv.id, rng.Uint64())
	body := func() map[string]any {
		return map[string]any{"model": "Qwen/Qwen3-0.6B", "instructions": instructions, "tools": seedTools, "input": input,
			"max_output_tokens": s.OutputTokens, "cache_salt": salt}
	}
	o1, answer := c.Responses(ctx, body())
	o1.Conversation, o1.Turn = cv.id, 1
	record(o1)
	if o1.Err != nil {
		return
	}
	call := fmt.Sprintf("call_%d_1", cv.id)
	name, args := "search_orders", fmt.Sprintf(`{"query":%q,"limit":%d}`, workload.Words(rng, 5), 1+rng.IntN(20))
	if rng.IntN(2) == 0 {
		name, args = "read_ticket", fmt.Sprintf(`{"id":"T-%d"}`, rng.IntN(100000))
	}
	input = append(input,
		map[string]any{"type": "message", "role": "assistant", "content": answer},
		map[string]any{"type": "function_call", "call_id": call, "name": name, "arguments": args},
		toolOutput(rng, call, cv.toolTokens))
	if !c.Wait(ctx, cv.think) {
		return
	}
	o2, _ := c.Responses(ctx, body())
	o2.Conversation, o2.Turn, o2.PrevEndpoint = cv.id, 2, o1.Endpoint
	record(o2)
}
