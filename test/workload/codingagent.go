package workload

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// CodingAgent is the peers' code-generation workload (prefill-bound):
// coding-agent conversations, each with a long private system prompt (the
// repository's context) and a few turns of large new input, every turn
// resending the whole conversation as a streaming /v1/chat/completions
// with the answers so far. Conversations share nothing (each its own
// cache_salt), so hits come only from turn-to-turn continuity of long
// private contexts, and prefill is the bottleneck: keeping a conversation
// on its owner until the owner saturates is the whole game. A
// conversation is closed-loop: a turn is sent when the previous one is
// answered (after Think), continuing its endpoint (Prev), and ends at a
// failed answer or before a prompt would not fit Options.MaxModelLen.
// Conversations start at Poisson arrivals: Rate divides their start
// offsets (not the turns' pace), so a higher rate means more
// conversations in flight — the source's concurrency axis, reached
// open-loop.
//
// Source and scaling (sticky blog's code-generation replay, 10 ×
// Qwen3-32B TP2 H100 | here, 8 engines). Token lengths are scaled by ¼,
// to fit the default engine's 32K context and its KV with the source's
// ratios (a context costs at 10,000 tokens a second about what the
// source's did at 16–20K, ×½):
//   - system prompt 3K–100K, mean ≈ 55K | triangular over 750–25,000
//     with mode 15,500: mean 13,750.
//   - 2–20 turns, mean 6 | 2 + a geometric count (p = 0.2) capped at 18:
//     mean ≈ 5.9.
//   - new input per turn 100–10K, mean 1,500 | 25 + exponential of mean
//     350, capped at 2,500: mean ≈ 375.
//   - output per turn 50–4K, mean 800 | ⅛ for run time: 6 + exponential
//     of mean 94, capped at 500: mean ≈ 100 (ignore_eos, so exactly that
//     many; the answer goes back into the history).
//   - prompts ≈ 70K on average, 307K KV tokens per pod (≈ 4.4 prompts)
//     | prompts ≈ 15K on average (p90 22K); 4,800 blocks of 16 (76.8K
//     tokens, ≈ 5 prompts) per engine; context 32,768 (longer
//     conversations end early).
//   - concurrency 10→100 (knee 60 with affinity, 30 without, on 10
//     pods) | 400 conversations (≈ 2,300 turns; a few end early at the
//     context) starting at 4/3 a second (≈ 300 s). A conversation whose
//     turns hit lasts ≈ 17 s (a 1.4 s cold first prefill, then ≈ 2.7 s
//     a turn, mostly decode), so ≈ 23 run at once at rate 1: ≈ 3 per
//     engine, within what its KV holds (4–5 contexts), their prefill
//     ≈ 28% of the fleet's (1.33 × (13,750 + 5.7 × 475) tokens a
//     second), while missing every turn would need ≈ 110K tokens a
//     second, past the fleet's 80K. Rate 2 puts ≈ 46 or more in
//     flight, past the fleet's KV, where every policy's hits collapse,
//     as in the source. (Estimates from the default engine's costs.)
//
// Zero fields take the defaults in brackets.
type CodingAgent struct {
	Engines       int // [8]
	GPUBlocks     int // KV blocks of 16 tokens per engine [4800]
	MaxModelLen   int // the fleet's context [32768]
	Conversations int // [400]
	// ConversationsPerSecond is the nominal rate conversations start at
	// [4/3].
	ConversationsPerSecond float64
	// Think is the pause before each later turn (the agent's tool running)
	// [none: the source's replay sends the next turn at once].
	Think time.Duration
}

// The coding agent's per-conversation distributions, in tokens (the
// source's ¼, outputs ⅛; see CodingAgent).
const (
	codingSystemMin, codingSystemMode, codingSystemMax = 750, 15_500, 25_000
	codingMinTurns, codingMaxTurns                     = 2, 20
	codingMoreTurnP                                    = 0.8 // a geometric count of further turns: mean 4
	codingInputMin, codingInputMean, codingInputMax    = 25, 350, 2_500
	codingOutputMin, codingOutputMean, codingOutputMax = 6, 94, 500
)

func (c CodingAgent) withDefaults() CodingAgent {
	c.Engines, c.GPUBlocks, c.MaxModelLen = cmp.Or(c.Engines, 8), cmp.Or(c.GPUBlocks, 4800), cmp.Or(c.MaxModelLen, 32768)
	c.Conversations, c.ConversationsPerSecond = cmp.Or(c.Conversations, 400), cmp.Or(c.ConversationsPerSecond, 4.0/3)
	return c
}

// Name is the scenario's name.
func (CodingAgent) Name() string { return "coding-agent" }

// Fleet is the fleet the scenario is defined for.
func (c CodingAgent) Fleet() Fleet {
	c = c.withDefaults()
	return Fleet{Engines: c.Engines, GPUBlocks: c.GPUBlocks, MaxModelLen: c.MaxModelLen}
}

// SLO is 5 s: twice the cold prefill of the p90 prompt (≈ 22K tokens ≈
// 2.2 s plus three 25 ms steps), rounded up: a conversation's first turn
// meets it on an idle engine, and a later turn that misses (re-prefilling
// its whole context) behind another such miss does not.
func (CodingAgent) SLO() time.Duration { return 5 * time.Second }

// Plan draws the conversations for o; their texts are drawn as they run.
func (c CodingAgent) Plan(o Options) (Plan, error) {
	c = c.withDefaults()
	if err := checkOptions("coding-agent", o); err != nil {
		return Plan{}, err
	}
	if c.Engines < 1 || c.GPUBlocks < 2 || c.MaxModelLen < 1 || c.Conversations < 1 || !(c.ConversationsPerSecond > 0) ||
		math.IsInf(c.ConversationsPerSecond, 1) || c.Think < 0 {
		return Plan{}, fmt.Errorf("coding-agent: bad shape %+v", c)
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x636f64696e67)) // "coding"
	gen, err := chat.Render(nil, nil, chat.RenderOptions{AddGenerationPrompt: true})
	if err != nil {
		return Plan{}, err
	}
	p := Plan{Sessions: make([]Planned, 0, c.Conversations)}
	var at time.Duration
	for i := 0; i < c.Conversations; i++ {
		at += poissonGap(rng, c.ConversationsPerSecond)
		conv := &codingConversation{id: i, salt: fmt.Sprintf("conversation-%d-%016x", i, rng.Uint64()), seed: rng.Uint64(),
			system: triangular(rng, codingSystemMin, codingSystemMode, codingSystemMax), think: c.Think,
			maxModelLen: o.MaxModelLen, genPrompt: len(gen)}
		turns := codingMinTurns
		for turns < codingMaxTurns && rng.Float64() < codingMoreTurnP {
			turns++
		}
		for k := 0; k < turns; k++ {
			conv.inputs = append(conv.inputs, min(codingInputMax, codingInputMin+int(rng.ExpFloat64()*codingInputMean)))
			conv.outputs = append(conv.outputs, min(codingOutputMax, codingOutputMin+int(rng.ExpFloat64()*codingOutputMean)))
		}
		p.Sessions = append(p.Sessions, Planned{Start: atRate(at, o.Rate), Session: conv})
	}
	return p, nil
}

// triangular draws from the triangular distribution over [lo, hi] with
// the given mode, rounded down.
func triangular(rng *rand.Rand, lo, mode, hi int) int {
	a, c, b := float64(lo), float64(mode), float64(hi)
	u := rng.Float64()
	if u < (c-a)/(b-a) {
		return int(a + math.Sqrt(u*(b-a)*(c-a)))
	}
	return int(b - math.Sqrt((1-u)*(b-a)*(b-c)))
}

// codingConversation is one coding-agent conversation: its shape, drawn
// by the plan, and its history, built as it runs.
type codingConversation struct {
	id              int
	salt            string
	seed            uint64 // its texts' rng
	system          int    // system prompt tokens
	inputs, outputs []int  // per turn: new user tokens, max_tokens
	think           time.Duration
	maxModelLen     int // 0: no bound
	genPrompt       int // the template's generation prompt, in tokens

	rng    *rand.Rand
	msgs   []byte // the messages so far, JSON, comma-separated
	tokens int    // their rendered tokens
	turn   int    // turns sent
	over   bool
}

// Next appends the previous answer and the next turn's input to the
// history and sends it all.
func (c *codingConversation) Next(prev *Answer) (Request, time.Duration, bool) {
	if c.over {
		return Request{}, 0, true
	}
	if c.turn == 0 {
		c.rng = rand.New(rand.NewPCG(c.seed, uint64(c.id)))
		c.add("system", fmt.Sprintf("Repository %d context. ", c.id)+Text(c.rng, c.system))
	} else {
		if prev == nil || !prev.OK || c.turn == len(c.inputs) {
			return c.end()
		}
		c.add("assistant", prev.Text)
	}
	c.add("user", fmt.Sprintf("Turn %d: ", c.turn+1)+Text(c.rng, c.inputs[c.turn]))
	maxTokens := c.outputs[c.turn]
	if c.maxModelLen > 0 && c.tokens+c.genPrompt+maxTokens > c.maxModelLen {
		return c.end()
	}
	c.turn++
	b := make([]byte, 0, len(c.msgs)+256)
	b = append(b, `{"model":"`+servedModel+`","messages":[`...)
	b = append(b, c.msgs...)
	b = append(b, `],"max_tokens":`...)
	b = strconv.AppendInt(b, int64(maxTokens), 10)
	b = append(b, `,"ignore_eos":true,"cache_salt":`...)
	b = strconv.AppendQuote(b, c.salt) // ASCII letters, digits and dashes: JSON as well
	b = append(b, `,"stream":true,"stream_options":{"include_usage":true}}`...)
	req := Request{Path: "/v1/chat/completions", Body: b, Conversation: c.id, Turn: c.turn}
	var wait time.Duration
	if c.turn > 1 {
		req.Prev, wait = prev.Endpoint, c.think
	}
	return req, wait, false
}

// end ends the conversation and lets its history go.
func (c *codingConversation) end() (Request, time.Duration, bool) {
	c.over, c.msgs, c.rng = true, nil, nil
	return Request{}, 0, true
}

// add appends a message to the history and counts its rendered tokens
// (the template renders each message on its own: <|im_start|>role\n
// content<|im_end|>\n).
func (c *codingConversation) add(role, content string) {
	if len(c.msgs) > 0 {
		c.msgs = append(c.msgs, ',')
	}
	text, err := json.Marshal(content)
	if err != nil {
		panic(err) // a string always encodes
	}
	c.msgs = append(c.msgs, `{"role":"`+role+`","content":`...)
	c.msgs = append(c.msgs, text...)
	c.msgs = append(c.msgs, '}')
	toks, err := chat.Render([]chat.Message{{Role: role, Content: content}}, nil, chat.RenderOptions{})
	if err != nil {
		panic(err) // a plain message always renders
	}
	c.tokens += len(toks)
}
