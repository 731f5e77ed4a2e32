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
// Qwen3-32B TP2 H100 | here, 8 engines). Every token length is scaled by
// ⅛, which keeps the source's ratio of prefill to decode tokens (its
// 70K-token prompts to 800-token answers) and fits the default engine's
// context; a context then costs at 10,000 tokens a second about a quarter
// of what the source's did at 16–20K:
//   - system prompt 3K–100K, mean ≈ 55K | triangular over 375–12,500
//     with mode 7,750: mean 6,875.
//   - 2–20 turns, mean 6 | 2 + a geometric count (p = 0.2) capped at 18:
//     mean ≈ 5.9 (5.7 at seed 1).
//   - new input per turn 100–10K, mean 1,500 | 12 + exponential of mean
//     175, capped at 1,250: mean ≈ 187.
//   - output per turn 50–4K, mean 800 | 6 + exponential of mean 94,
//     capped at 500: mean ≈ 100 (ignore_eos, so exactly that many; the
//     answer goes back into the history).
//   - prompts ≈ 70K on average | ≈ 7.7K (p90 11.1K, max ≈ 15K).
//   - 307K KV tokens per pod (≈ 4.4 prompts; hits were 48% at
//     concurrency 20 and collapsed for every policy beyond) | 4,800
//     blocks of 16 per engine (76.8K tokens, ≈ 10 prompts): twice the
//     source's room, so that below the knee an owner keeps its
//     conversations resident and the knee is set by placement, not by
//     KV thrash. (With 2,400 blocks, the source's ratio, every policy's
//     hits collapse by Rate 1.)
//   - concurrency 10→100 (knee 60 with affinity, 30 without) | 400
//     conversations (≈ 2,300 turns) starting at 4/3 a second (≈ 300 s);
//     a conversation whose turns hit lasts ≈ 15 s (mostly decode), so
//     ≈ 20 run at once at rate 1, ≈ 2.5 per engine. In the lab (seed 1)
//     cache-blind policies pass their knee below Rate 1 (hits ≈ 15–25%),
//     prefix affinity between 1 and 1.5, precise between 1.5 and 2
//     (hits ≈ 80% below it): a sweep of Rate 0.5–2 crosses them all.
//
// Zero fields take the defaults in brackets.
type CodingAgent struct {
	Engines       int // [8]
	GPUBlocks     int // KV blocks of 16 tokens per engine [4800]
	Conversations int // [400]
	// ConversationsPerSecond is the nominal rate conversations start at
	// [4/3].
	ConversationsPerSecond float64
	// Think is the pause before each later turn (the agent's tool running)
	// [none: the source's replay sends the next turn at once].
	Think time.Duration
}

// The coding agent's per-conversation distributions, in tokens (the
// source's ⅛; see CodingAgent).
const (
	codingSystemMin, codingSystemMode, codingSystemMax = 375, 7_750, 12_500
	codingMinTurns, codingMaxTurns                     = 2, 20
	codingMoreTurnP                                    = 0.8 // a geometric count of further turns: mean 4
	codingInputMin, codingInputMean, codingInputMax    = 12, 175, 1_250
	codingOutputMin, codingOutputMean, codingOutputMax = 6, 94, 500
)

func (c CodingAgent) withDefaults() CodingAgent {
	c.Engines, c.GPUBlocks = cmp.Or(c.Engines, 8), cmp.Or(c.GPUBlocks, 4800)
	c.Conversations, c.ConversationsPerSecond = cmp.Or(c.Conversations, 400), cmp.Or(c.ConversationsPerSecond, 4.0/3)
	return c
}

// Name is the scenario's name.
func (CodingAgent) Name() string { return "coding-agent" }

// Fleet is the fleet the scenario is defined for.
func (c CodingAgent) Fleet() Fleet {
	c = c.withDefaults()
	return Fleet{Engines: c.Engines, GPUBlocks: c.GPUBlocks}
}

// SLO is 2.5 s: twice the cold prefill of the p90 prompt (≈ 11.1K
// tokens ≈ 1.1 s plus two 25 ms steps), rounded up: a conversation's
// first turn meets it on an idle engine, and a later turn that misses
// (re-prefilling its whole context) behind another such miss does not.
func (CodingAgent) SLO() time.Duration { return 2500 * time.Millisecond }

// Plan draws the conversations for o; their texts are drawn as they run.
func (c CodingAgent) Plan(o Options) (Plan, error) {
	c = c.withDefaults()
	if err := checkOptions("coding-agent", o); err != nil {
		return Plan{}, err
	}
	if c.Engines < 1 || c.GPUBlocks < 2 || c.Conversations < 1 || !(c.ConversationsPerSecond > 0) ||
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
