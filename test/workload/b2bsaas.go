package workload

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"time"
)

// B2BSaaS is llm-d's b2b-saas benchmark (inference-perf shared_prefix,
// "pathological prefill-bound"): many customer groups, each with a long
// system prompt shared by a few fixed questions, single turn, at Poisson
// arrivals; run as a rate sweep (Options.Rate). Each request picks a group
// and one of its questions uniformly and sends a streaming text
// /v1/completions (the source's API) of the group's system prompt and the
// question, with ignore_eos (as the source) so every answer has exactly
// OutputTokens tokens. Conversations are groups, turns a group's requests
// in arrival order; Prev is left to the driver.
//
// Source and scaling (source | here):
//   - 150 groups × 5 questions | the same (750 distinct prompts).
//   - system prompt 6,000, question 1,200 tokens | 3,000 and 600: halved,
//     so a cold prompt (3,600 tokens at the default engine's 10,000
//     tokens a second ≈ 0.36 s) costs what the source's 7,200 did at
//     16–20K tokens a second on Qwen3-32B TP2 H100.
//   - output 1,000 | 100 tokens, for run time (decode steps are most of a
//     simulated run's events; the engine's prefill, not its decode,
//     is what placement decides).
//   - fleet 8 × ≈250K KV tokens; the 150 system prompts (900K) are
//     3–4× one engine and ≈ 0.45× the fleet | 8 × 16,000 blocks of 16
//     (256K tokens): the distinct prompts (150 × 3,000 + 750 × 600 =
//     900K tokens) are 3.5× one engine and 0.44× the fleet, so the fleet
//     holds them partitioned and no engine holds them all: placement
//     decides between a stable partition (hits) and eviction churn.
//   - Poisson ramp 3→60 QPS (knee 38 for llm-d, 18 for round robin;
//     their all-miss prefill capacity ≈ 18–22 QPS) | one rate per plan:
//     nominal 20 requests a second, where the prompts, were every
//     request a miss, would use ≈ 90% of the fleet's prefill (20 × 3,600
//     = 72K of 8 × 10K tokens a second). A policy without placement
//     still hits on part of each system prompt (≈ 34% of the tokens,
//     from the engines' LRU) and so crosses its knee between Rate 1 and
//     2; policies that keep the partition hit 80–90%, and the best of
//     them crosses between 2 and 3 (the lab, seed 1). A sweep of Rate
//     0.5–3 spans both, as the source's ramp did.
//   - ≈ 15,000 requests per ramp | 3,000 per plan (≈ 150 s at rate 1;
//     each group ≈ 20 times, each prompt ≈ 4 times). Rate divides the
//     arrival offsets: the same requests, compressed.
//
// Zero fields take the defaults in brackets.
type B2BSaaS struct {
	Engines   int // [8]
	GPUBlocks int // KV blocks of 16 tokens per engine [16000]
	Groups    int // [150]
	Questions int // per group [5]
	// SystemTokens and QuestionTokens size the prompts [3000, 600].
	SystemTokens, QuestionTokens int
	OutputTokens                 int     // per request [100]
	Requests                     int     // [3000]
	QPS                          float64 // nominal arrivals a second [20]
}

func (b B2BSaaS) withDefaults() B2BSaaS {
	b.Engines, b.GPUBlocks = cmp.Or(b.Engines, 8), cmp.Or(b.GPUBlocks, 16000)
	b.Groups, b.Questions = cmp.Or(b.Groups, 150), cmp.Or(b.Questions, 5)
	b.SystemTokens, b.QuestionTokens = cmp.Or(b.SystemTokens, 3000), cmp.Or(b.QuestionTokens, 600)
	b.OutputTokens, b.Requests, b.QPS = cmp.Or(b.OutputTokens, 100), cmp.Or(b.Requests, 3000), cmp.Or(b.QPS, 20)
	return b
}

// Name is the scenario's name.
func (B2BSaaS) Name() string { return "b2b-saas" }

// Fleet is the fleet the scenario is defined for (the driver's default
// context).
func (b B2BSaaS) Fleet() Fleet {
	b = b.withDefaults()
	return Fleet{Engines: b.Engines, GPUBlocks: b.GPUBlocks}
}

// SLO is 1 s: twice the cold prefill of a prompt (3,600 tokens ≈ 0.36 s
// plus a 25 ms step), rounded up, so a miss on an idle engine meets it
// and a miss behind another miss still does, while the queueing of a
// churning cache does not.
func (B2BSaaS) SLO() time.Duration { return time.Second }

// Plan draws the groups' prompts and the arrivals for o.
func (b B2BSaaS) Plan(o Options) (Plan, error) {
	b = b.withDefaults()
	if err := checkOptions("b2b-saas", o); err != nil {
		return Plan{}, err
	}
	if b.Engines < 1 || b.GPUBlocks < 2 || b.Groups < 1 || b.Questions < 1 || b.SystemTokens < 1 || b.QuestionTokens < 1 ||
		b.OutputTokens < 1 || b.Requests < 1 || !(b.QPS > 0) {
		return Plan{}, fmt.Errorf("b2b-saas: bad shape %+v", b)
	}
	// Labels and a word of slack (Text is ± one word).
	if err := checkFits("b2b-saas", o.MaxModelLen, b.SystemTokens+b.QuestionTokens+32, b.OutputTokens); err != nil {
		return Plan{}, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x62326273616173)) // "b2bsaas"
	systems := make([]string, b.Groups)
	questions := make([][]string, b.Groups)
	for g := range systems {
		systems[g] = fmt.Sprintf("Group %d system prompt. ", g) + Text(rng, b.SystemTokens)
		questions[g] = make([]string, b.Questions)
		for q := range questions[g] {
			questions[g][q] = fmt.Sprintf("\nQuestion %d: ", q) + Text(rng, b.QuestionTokens)
		}
	}
	return openLoop(rng, b.Requests, b.QPS, o.Rate, func(rng *rand.Rand) (int, func() Request) {
		g, q := rng.IntN(b.Groups), rng.IntN(b.Questions)
		return g, func() Request { return textCompletion(systems[g]+questions[g][q], b.OutputTokens) }
	}), nil
}
