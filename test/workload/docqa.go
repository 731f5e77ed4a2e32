package workload

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// DocQA is the peers' document Q&A (owner queueing): private long
// documents, each the subject of one conversation of a few turns, every
// turn resending the document with the questions and answers so far and
// a new question — turn k's prompt is the document, then for each
// earlier turn its question and answer, then question k — as a streaming
// text /v1/completions with ignore_eos, so every answer has exactly
// AnswerTokens tokens. Documents share nothing, so a turn hits only where
// its conversation ran before, and many conversations run at once against
// few engines. Medians tie (a turn at home hits under any sticky policy);
// policies separate on the tails, when turns queue on an owner busy
// prefilling other conversations' new documents: moving a turn off a busy
// owner pays only when it does not re-prefill the whole document, which a
// pull of the document from the owner's CPU tier makes cheap (the fleet
// has a CPU tier, so every document prefilled has a CPU copy). A
// conversation is closed-loop: a turn is sent when the previous one is
// answered (after Think), continuing the answer's endpoint (Prev), and
// ends at a failed answer or before a prompt with its answer would not
// fit Options.MaxModelLen. Conversations start at Poisson arrivals: Rate
// divides their start offsets (not the turns' pace), so a higher rate
// means more conversations in flight — the source's concurrency axis,
// reached open-loop, as in CodingAgent.
//
// Source and scaling (source | here): the P2P guide's doc-Q&A run
// (benchmark-results/gpt-oss-120b-h200.md@067fe1b; profile
// guide_p2p-kv-cache-sharing_1.yaml), 14–16 × gpt-oss-120b TP=1 H200 |
// 4 engines of the gptoss120b-h200 profile (prefill in chunks of 8,192,
// each step 29.8 ms, plus 19.14 µs a token and 0.226 ns a token² over a
// request; pulls ≈ 28 ms + 10.6 µs a token, kv-transfer.md §6):
//   - 192 documents of 49,152 tokens | 144 of 16,000–32,000 (uniform,
//     mean 24,000, about half): a mean document with its question (≈
//     24,270 tokens) costs ≈ 0.69 s cold on an idle engine and ≈ 0.29 s
//     pulled (the source's 49K: ≈ 1.67 s against ≈ 0.55 s), so a pull
//     saves more than half, as there. The longest prompt (≈ 34K tokens)
//     needs the profile's 65,536-token context.
//   - 6 turns, questions 256 tokens | the same.
//   - answers 256 tokens | 64: the profile decodes at ≈ 30–36 ms a token
//     (its 29.8 ms step base on every decode step; decode is marked
//     uncalibrated), ≈ 4× the rig's ≈ 7 ms (engine-profiles.md §7,
//     TP=4), so 64 tokens take here the ≈ 2 s that 256 took there, and a
//     conversation's turns come back at the source's pace against its
//     owner's prefill. With 256-token answers (and 8K–16K documents) the
//     owners idled between turns: the sticky policies' p99 stayed under
//     0.7 s even at 8× the conversation rate (the lab, seed 1).
//   - 128 conversations concurrent, closed-loop (128 ÷ 14 ≈ 9 an engine)
//     | open-loop starts at 4 a second nominal (36 s of starts), each
//     conversation's turns closed-loop as above: a conversation lives ≈
//     15–17 s, so ≈ 60–68 run at once at rate 1 (≈ 15–17 an engine) and
//     ≈ 8 an engine at Rate 0.5, the source's 9.
//   - 1,152 turns | 864 (144 × 6).
//   - corpus ≈ 9.2M tokens against ≈ 17M of fleet GPU KV (0.54×; ≈ 1.22M
//     a pod), CPU tier 88 GiB ≈ 2.22M tokens a pod (1.8×) | 144 × ≈ 24K
//     ≈ 3.5M tokens, ≈ 3.7M with the histories, against 4 × 64,000 blocks
//     of 16 (4.1M: 0.85×, 0.9×; 64,000 is 0.84× the profile's 76,250 and
//     within the summaries' default capacity, 65,536), CPU tier 115,200
//     blocks (1.8× GPU): capacity is not the constraint (an engine's live
//     conversations, ≈ 17 × 26K, fill under half its GPU) and every
//     document keeps a CPU copy.
//   - nominal rate: new documents arrive at 4 a second, ≈ 0.68 s of
//     prefill each, ≈ 68% of the fleet's prefill (≈ 100% near Rate 1.5):
//     the owners saturate in bursts but the fleet does not. In the lab
//     (seeds 1–3, before the CPU tier was wired) a policy that pins a
//     conversation by hash, blind to load (prefix-hash), is past its knee
//     at rate 1 (p90 7.6 s), a cache-blind one (least-loaded) re-prefills
//     documents (hits 17%, p90 7.9 s), and affinity with load-aware first
//     placement (precise, llm-d) keeps every turn home (82–83% hits, the
//     bound: first turns are cold) at p90 0.92–0.95 s, p99 1.4–1.6 s,
//     crossing the SLO between Rate 1.25 and 1.5. A sweep of Rate
//     0.5–1.5 spans them.
//
// Zero fields take the defaults in brackets.
type DocQA struct {
	Engines   int // [4]
	GPUBlocks int // KV blocks of 16 tokens per engine [64000]
	// CPUBlocks is each engine's CPU tier in blocks of 16 [115200;
	// negative: none].
	CPUBlocks int
	// MaxModelLen is the engines' context [65536, the profile's].
	MaxModelLen int
	// Conversations is the documents, one conversation each [144].
	Conversations int
	// DocMin and DocMax bound a document in tokens, uniform [16000,
	// 32000].
	DocMin, DocMax int
	Turns          int // per conversation [6]
	// QuestionTokens and AnswerTokens size a turn [256, 64].
	QuestionTokens, AnswerTokens int
	// ConversationsPerSecond is the nominal rate conversations start at
	// [4].
	ConversationsPerSecond float64
	// Think is the pause before each later turn [none: the source sends
	// the next turn at once].
	Think time.Duration
}

func (d DocQA) withDefaults() DocQA {
	d.Engines, d.GPUBlocks, d.CPUBlocks = cmp.Or(d.Engines, 4), cmp.Or(d.GPUBlocks, 64000), cmp.Or(d.CPUBlocks, 115200)
	d.MaxModelLen, d.Conversations, d.Turns = cmp.Or(d.MaxModelLen, 65536), cmp.Or(d.Conversations, 144), cmp.Or(d.Turns, 6)
	d.DocMin, d.DocMax = cmp.Or(d.DocMin, 16000), cmp.Or(d.DocMax, 32000)
	d.QuestionTokens, d.AnswerTokens = cmp.Or(d.QuestionTokens, 256), cmp.Or(d.AnswerTokens, 64)
	d.ConversationsPerSecond = cmp.Or(d.ConversationsPerSecond, 4)
	return d
}

// Name is the scenario's name.
func (DocQA) Name() string { return "doc-qa" }

// Fleet is the fleet the scenario is defined for: gptoss120b-h200
// engines with a CPU tier.
func (d DocQA) Fleet() Fleet {
	d = d.withDefaults()
	return Fleet{Engines: d.Engines, GPUBlocks: d.GPUBlocks, CPUBlocks: max(d.CPUBlocks, 0), MaxModelLen: d.MaxModelLen, Profile: "gptoss120b-h200"}
}

// SLO is 1.5 s: twice the cold prefill of a mean prompt (≈ 25,100
// tokens, a mean document and half its history: 4 chunks ≈ 0.74 s),
// rounded: a cold first turn on an idle engine meets it (the longest
// prompt, ≈ 34K tokens, costs ≈ 1.06 s), a turn queued on its owner
// behind two new documents' prefill does not.
func (DocQA) SLO() time.Duration { return 1500 * time.Millisecond }

// docQALabel bounds a turn's labels ("\nAnswer: ", "\nQuestion k: ") and
// the document's, in tokens.
const docQALabel = 16

// Plan draws the conversations for o; their texts are drawn as they run.
func (d DocQA) Plan(o Options) (Plan, error) {
	d = d.withDefaults()
	if err := checkOptions("doc-qa", o); err != nil {
		return Plan{}, err
	}
	if d.Engines < 1 || d.GPUBlocks < 2 || d.MaxModelLen < 1 || d.Conversations < 1 || d.DocMin < 1 || d.DocMax < d.DocMin || d.Turns < 1 ||
		d.QuestionTokens < 1 || d.AnswerTokens < 1 || !(d.ConversationsPerSecond > 0) || math.IsInf(d.ConversationsPerSecond, 1) || d.Think < 0 {
		return Plan{}, fmt.Errorf("doc-qa: bad shape %+v", d)
	}
	// Every first turn fits: the longest document, a question and labels,
	// and the answer.
	if err := checkFits("doc-qa", o.MaxModelLen, d.DocMax+d.QuestionTokens+2*docQALabel, d.AnswerTokens); err != nil {
		return Plan{}, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x646f637161)) // "docqa"
	p := Plan{Sessions: make([]Planned, 0, d.Conversations)}
	var at time.Duration
	for i := 0; i < d.Conversations; i++ {
		at += poissonGap(rng, d.ConversationsPerSecond)
		c := &docQAConversation{d: d, id: i, seed: rng.Uint64(), doc: d.DocMin + rng.IntN(d.DocMax-d.DocMin+1), maxModelLen: o.MaxModelLen}
		p.Sessions = append(p.Sessions, Planned{Start: atRate(at, o.Rate), Session: c})
	}
	return p, nil
}

// docQAConversation is one document's conversation: its shape, drawn by
// the plan, and its prompt, built as it runs.
type docQAConversation struct {
	d           DocQA
	id          int
	seed        uint64 // its texts' rng
	doc         int    // document tokens
	maxModelLen int    // 0: no bound

	rng    *rand.Rand
	prompt strings.Builder
	// tokens bounds the prompt's tokens: the sum of its parts' (a part
	// starts at a newline, so the parts' tokens join unchanged, or fewer
	// where whitespace merges).
	tokens int
	turn   int // turns sent
	over   bool
}

// Next appends the previous answer and the next question to the prompt
// and sends it all.
func (c *docQAConversation) Next(prev *Answer) (Request, time.Duration, bool) {
	if c.over {
		return Request{}, 0, true
	}
	if c.turn == 0 {
		c.rng = rand.New(rand.NewPCG(c.seed, uint64(c.id)))
		c.add(fmt.Sprintf("Document %d. ", c.id) + Text(c.rng, c.doc))
	} else {
		if prev == nil || !prev.OK || c.turn == c.d.Turns {
			return c.end()
		}
		c.add("\nAnswer: " + prev.Text)
	}
	c.add(fmt.Sprintf("\nQuestion %d: ", c.turn+1) + Text(c.rng, c.d.QuestionTokens))
	if c.maxModelLen > 0 && c.tokens+c.d.AnswerTokens > c.maxModelLen {
		return c.end()
	}
	c.turn++
	req := textCompletion(c.prompt.String(), c.d.AnswerTokens)
	req.Conversation, req.Turn = c.id, c.turn
	var wait time.Duration
	if c.turn > 1 {
		req.Prev, wait = prev.Endpoint, c.d.Think
	}
	return req, wait, false
}

// add appends a part to the prompt and counts its tokens.
func (c *docQAConversation) add(part string) {
	c.prompt.WriteString(part)
	c.tokens += len(chat.Encode(part))
}

// end ends the conversation and lets its prompt go.
func (c *docQAConversation) end() (Request, time.Duration, bool) {
	c.over, c.rng = true, nil
	c.prompt = strings.Builder{}
	return Request{}, 0, true
}
