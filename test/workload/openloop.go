package workload

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// servedModel is the model every scenario's requests name: the simulated
// engine's.
const servedModel = "Qwen/Qwen3-0.6B"

// checkOptions validates the options every scenario shares: a finite
// positive rate and a non-negative context length.
func checkOptions(name string, o Options) error {
	if !(o.Rate > 0) || math.IsInf(o.Rate, 1) {
		return fmt.Errorf("%s: rate %v, want > 0", name, o.Rate)
	}
	if o.MaxModelLen < 0 {
		return fmt.Errorf("%s: max model len %d, want ≥ 0", name, o.MaxModelLen)
	}
	return nil
}

// checkFits reports a shape whose longest prompt and output would not fit
// the engines' context (maxModelLen 0: no bound).
func checkFits(name string, maxModelLen, prompt, output int) error {
	if maxModelLen > 0 && prompt+output > maxModelLen {
		return fmt.Errorf("%s: prompts up to %d tokens with %d output tokens do not fit the engines' %d", name, prompt, output, maxModelLen)
	}
	return nil
}

// atRate is a nominal offset at rate times the nominal arrival rate.
func atRate(d time.Duration, rate float64) time.Duration {
	return time.Duration(float64(d) / rate)
}

// poissonGap draws the gap to the next arrival of a Poisson process of
// qps arrivals a second.
func poissonGap(rng *rand.Rand, qps float64) time.Duration {
	return time.Duration(rng.ExpFloat64() / qps * float64(time.Second))
}

// single is a session of one request, built when it is sent (so a plan
// keeps no bodies).
type single struct {
	build func() Request
	sent  bool
}

// Next returns the request the first time, then done.
func (s *single) Next(*Answer) (Request, time.Duration, bool) {
	if s.sent {
		return Request{}, 0, true
	}
	s.sent = true
	return s.build(), 0, false
}

// openLoop is a plan of one-request sessions at Poisson arrivals: n
// requests at qps (nominal; the offsets are divided by rate). For each,
// draw is called in arrival order with the plan's rng and returns the
// request's conversation and its builder; the plan numbers the turns of
// each conversation in arrival order and leaves Prev to the driver.
func openLoop(rng *rand.Rand, n int, qps, rate float64, draw func(rng *rand.Rand) (conv int, build func() Request)) Plan {
	p := Plan{Sessions: make([]Planned, 0, n)}
	turns := map[int]int{}
	var at time.Duration
	for i := 0; i < n; i++ {
		at += poissonGap(rng, qps)
		conv, build := draw(rng)
		turns[conv]++
		turn := turns[conv]
		p.Sessions = append(p.Sessions, Planned{Start: atRate(at, rate), Session: &single{build: func() Request {
			r := build()
			r.Conversation, r.Turn = conv, turn
			return r
		}}})
	}
	return p
}

// textCompletionBody is a streaming /v1/completions body with a text
// prompt; the fields go in the struct's order.
type textCompletionBody struct {
	Model         string             `json:"model"`
	Prompt        string             `json:"prompt"`
	MaxTokens     int                `json:"max_tokens"`
	IgnoreEOS     bool               `json:"ignore_eos"`
	CacheSalt     string             `json:"cache_salt,omitempty"`
	Stream        bool               `json:"stream"`
	StreamOptions includeUsageOption `json:"stream_options"`
}

// includeUsageOption is stream_options asking for the usage chunk.
type includeUsageOption struct {
	IncludeUsage bool `json:"include_usage"`
}

// textCompletion is the request for a text completion of prompt with
// exactly maxTokens output tokens (ignore_eos: the simulated engine would
// otherwise stop at its natural 16–63 tokens).
func textCompletion(prompt string, maxTokens int) Request {
	b, err := json.Marshal(textCompletionBody{Model: servedModel, Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true,
		Stream: true, StreamOptions: includeUsageOption{IncludeUsage: true}})
	if err != nil {
		panic(err) // a struct of strings, ints and bools always encodes
	}
	return Request{Path: "/v1/completions", Body: b}
}

// tokenCompletionBody is a streaming token-id completion, encoded by hand
// (a long prompt is most of the body), byte for byte what the bench's
// trace replay has sent.
func tokenCompletionBody(tokens []uint32, maxTokens int) []byte {
	b := make([]byte, 0, 16+7*len(tokens)+128)
	b = append(b, `{"model":"`+servedModel+`","prompt":[`...)
	for i, tok := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(tok), 10)
	}
	b = append(b, `],"max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	return append(b, `,"stream":true,"stream_options":{"include_usage":true}}`...)
}
