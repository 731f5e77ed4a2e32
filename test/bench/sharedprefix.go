package bench

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/test/workload"
)

// SharedPrefix is a lookalike of llm-d's shared-prefix benchmark: many
// customers, each with a long system prompt (the shared prefix) and a few
// users asking fixed questions, sent at stepped-up request rates (Poisson
// arrivals, customers and users uniform). The working set — every
// customer's prefix and questions — is ≈ 73% of the default fleet's KV.
//
// Zero fields take the defaults in brackets.
type SharedPrefix struct {
	Engines   int // [8]
	GPUBlocks int // KV blocks per engine [19264: working set ≈ 73% of 8 engines]
	Customers int // [150]
	Users     int // per customer [5]
	// PrefixTokens and QuestionTokens size the prompts [6000, 1200].
	PrefixTokens, QuestionTokens int
	// QPS are the request rates stepped through, each for StepFor of
	// simulated time [3, 6, 10, 15, 20 per second; 30 s].
	QPS          []float64
	StepFor      time.Duration
	OutputTokens int // [64]
}

func (s SharedPrefix) withDefaults() SharedPrefix {
	s.Engines, s.GPUBlocks = cmp.Or(s.Engines, 8), cmp.Or(s.GPUBlocks, 19264)
	s.Customers, s.Users = cmp.Or(s.Customers, 150), cmp.Or(s.Users, 5)
	s.PrefixTokens, s.QuestionTokens = cmp.Or(s.PrefixTokens, 6000), cmp.Or(s.QuestionTokens, 1200)
	if len(s.QPS) == 0 {
		s.QPS = []float64{3, 6, 10, 15, 20}
	}
	s.StepFor = cmp.Or(s.StepFor, 30*time.Second)
	s.OutputTokens = cmp.Or(s.OutputTokens, 64)
	return s
}

// Name is the scenario's name.
func (SharedPrefix) Name() string { return "shared-prefix" }

// Fleet is the fleet the scenario is defined for.
func (s SharedPrefix) Fleet() FleetConfig {
	s = s.withDefaults()
	return FleetConfig{Engines: s.Engines, GPUBlocks: s.GPUBlocks}
}

// Steps are the QPS steps and their length, for results.
func (s SharedPrefix) Steps() ([]float64, time.Duration) {
	s = s.withDefaults()
	return s.QPS, s.StepFor
}

// Run sends the stepped load; every request is a completion of a
// customer's prefix followed by one of its users' question. Conversations
// are customers: a request continues its customer's latest answered one.
func (s SharedPrefix) Run(ctx context.Context, c *Client, rng *rand.Rand) ([]Outcome, error) {
	s = s.withDefaults()
	if s.Customers < 1 || s.Users < 1 || s.StepFor <= 0 || slices.ContainsFunc(s.QPS, func(q float64) bool { return q <= 0 }) {
		return nil, fmt.Errorf("shared-prefix: bad shape %+v", s)
	}
	prefixes := make([]string, s.Customers)
	questions := make([][]string, s.Customers)
	for i := range prefixes {
		prefixes[i] = fmt.Sprintf("Customer %d system prompt. ", i) + workload.Text(rng, s.PrefixTokens)
		for u := 0; u < s.Users; u++ {
			questions[i] = append(questions[i], fmt.Sprintf("\nUser %d asks: ", u)+workload.Text(rng, s.QuestionTokens))
		}
	}
	var mu sync.Mutex
	var outcomes []Outcome
	// Each customer's latest answered request: its turn and endpoint.
	last := make([]string, s.Customers)
	lastTurn := make([]int, s.Customers)
	turns := make([]int, s.Customers)
	var wg sync.WaitGroup
	for step, qps := range s.QPS {
		stepStart := time.Now()
		for at := time.Duration(0); ; {
			at += time.Duration(rng.ExpFloat64() / qps * float64(time.Second))
			if at >= s.StepFor || !c.WaitUntil(ctx, stepStart.Add(c.Wall(at))) {
				break
			}
			cust, user := rng.IntN(s.Customers), rng.IntN(s.Users)
			mu.Lock()
			turns[cust]++
			turn, prev := turns[cust], last[cust]
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := c.Completions(ctx, map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prefixes[cust] + questions[cust][user],
					"max_tokens": s.OutputTokens})
				o.Conversation, o.Turn, o.PrevEndpoint, o.Step = cust, turn, prev, step+1
				mu.Lock()
				defer mu.Unlock()
				outcomes = append(outcomes, o)
				if o.Err == nil && turn > lastTurn[cust] {
					last[cust], lastTurn[cust] = o.Endpoint, turn
				}
			}()
		}
		// The next step starts on time even if this one's answers are late.
		if !c.WaitUntil(ctx, stepStart.Add(c.Wall(s.StepFor))) {
			break
		}
	}
	wg.Wait()
	slices.SortStableFunc(outcomes, func(x, y Outcome) int { return x.Start.Compare(y.Start) })
	return outcomes, ctx.Err()
}
