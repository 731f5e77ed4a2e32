package workload

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"time"
)

// TieredEviction is llm-d's tiered-eviction benchmark (inference-perf
// shared_prefix, a CPU tier beyond HBM): many groups, each with a long
// system prompt shared by a few fixed questions, single turn, at Poisson
// arrivals; run as a rate sweep (Options.Rate). Each request picks a
// group and one of its questions uniformly and sends a streaming text
// /v1/completions of the group's system prompt and the question, with
// ignore_eos. The distinct prompts are ≈ 1.32× the fleet's GPU KV and
// fit in its CPU tiers, and are revisited: the case where a CPU tier pays
// (a prompt evicted from GPU is loaded back from CPU instead of
// recomputed) and where a router that sees the CPU tiers can place a
// request on the engine whose CPU holds its group. Conversations are
// groups, turns a group's requests in arrival order; Prev is left to the
// driver.
//
// Source and scaling (source | here): the P/D guide's tiered-eviction
// template (pd-disaggregation/benchmark-templates/tiered-eviction.yaml.in
// @c3fc5bd, report vllm-gpt-oss-120b-h200-multi-tier.md@3cfabd6) on
// gpt-oss-120b H200 | engines of the gptoss120b-h200 profile, so a
// request costs what it did there and the source's rates carry over:
//   - 1,000 groups × 5 prompts | 200 × 5 (1,000 distinct prompts): the
//     groups, the GPU and the CPU tier all ÷ 5.
//   - system prompt 16,000, question 256 tokens | the same: a cold
//     prompt (≈ 16,270 tokens) costs ≈ 0.43 s on an idle engine, so an
//     engine prefills ≈ 2.3 misses a second and the fleet ≈ 18.6.
//   - output 256 | 64 tokens: the profile decodes at ≈ 30–40 ms a token
//     (its 29.8 ms step base on every decode step; decode is marked
//     uncalibrated), ≈ 4× the rig's TPOT (6.6–7.4 ms, TP=4), so 64
//     tokens take here what 256 took there; and the source's prefillers
//     decode nothing (P/D), so the aggregated engines here should hold a
//     request's KV only briefly.
//   - 8 prefill pods (TP=1, 1,630,790 HBM tokens, block 128, 100 GiB CPU
//     ≈ 2.59M tokens at 41.5 KB) + 2 decode pods | 8 aggregated engines
//     of 20,400 blocks of 16 (326K tokens) with a CPU tier of 32,400
//     (518K tokens, 1.6× the GPU, as there). The working set (200 ×
//     16,000 + 1,000 × 256 ≈ 3.46M tokens) is 1.32× the fleet's GPU
//     (2.61M), as the source's 17.28M was its 13.05M, and 0.83× its CPU
//     (4.15M); an engine's share of the groups (≈ 432K) fits its CPU.
//   - eight 60 s Poisson stages 5, 10, …, 40 QPS (10,800 requests);
//     published P90 latency HBM only 24.0 s, CPU tier with a CPU-blind
//     router 8.08 s, CPU-aware 2.86 s; at 40 QPS 22.1 / 32.6 / 36.0
//     requests a second achieved | one rate per plan: nominal 30 QPS,
//     where the GPU-only fleet struggles. In the lab (seeds 1–3, no CPU
//     tier) the affinity policies hit ≈ 73% (LRU under uniform picks
//     keeps ≈ 1/1.32 = 76%) and sit at the SLO at rate 1 (precise p90 0.68 s, llm-d
//     1.0 s; p99 1.7–1.9 s), hash pinning is past its knee (p90 5 s) and
//     a cache-blind policy far past (9% hits); at Rate 4/3 (40 QPS, the
//     source's top stage) every GPU-only policy's p90 is 2.6–3.6 s; at
//     Rate 2/3 (20 QPS) all meet the SLO. A CPU tier turns the ≈ 27% of
//     misses into loads (≈ 0.8 µs a token over PCIe, engine-profiles.md
//     §6, against ≈ 26 µs of prefill): that is the arms' difference. A
//     sweep of Rate 1/6–4/3 spans the source's stages.
//   - 2,400 requests (80 s at rate 1; each group ≈ 12 times, each
//     prompt ≈ 2.4, the source's 10.8 and 2.2). Rate divides the arrival
//     offsets. The run starts cold: its first ≈ 200 requests miss
//     whatever the tiers.
//
// Zero fields take the defaults in brackets.
type TieredEviction struct {
	Engines   int // [8]
	GPUBlocks int // KV blocks of 16 tokens per engine [20400]
	// CPUBlocks is each engine's CPU tier in blocks of 16 [32400;
	// negative: none, the GPU-only arm].
	CPUBlocks int
	Groups    int // [200]
	Prompts   int // questions per group [5]
	// SystemTokens and QuestionTokens size the prompts [16000, 256].
	SystemTokens, QuestionTokens int
	OutputTokens                 int     // per request [64]
	Requests                     int     // [2400]
	QPS                          float64 // nominal arrivals a second [30]
}

func (e TieredEviction) withDefaults() TieredEviction {
	e.Engines, e.GPUBlocks, e.CPUBlocks = cmp.Or(e.Engines, 8), cmp.Or(e.GPUBlocks, 20400), cmp.Or(e.CPUBlocks, 32400)
	e.Groups, e.Prompts = cmp.Or(e.Groups, 200), cmp.Or(e.Prompts, 5)
	e.SystemTokens, e.QuestionTokens = cmp.Or(e.SystemTokens, 16000), cmp.Or(e.QuestionTokens, 256)
	e.OutputTokens, e.Requests, e.QPS = cmp.Or(e.OutputTokens, 64), cmp.Or(e.Requests, 2400), cmp.Or(e.QPS, 30)
	return e
}

// Name is the scenario's name.
func (TieredEviction) Name() string { return "tiered-eviction" }

// Fleet is the fleet the scenario is defined for: gptoss120b-h200
// engines with a CPU tier (the driver's default context).
func (e TieredEviction) Fleet() Fleet {
	e = e.withDefaults()
	return Fleet{Engines: e.Engines, GPUBlocks: e.GPUBlocks, CPUBlocks: max(e.CPUBlocks, 0), Profile: "gptoss120b-h200"}
}

// SLO is 1 s: twice the cold prefill of a prompt (≈ 16,270 tokens, two
// chunks ≈ 0.43 s), rounded up: a miss on an idle engine meets it, and a
// miss behind one more; the queue of a fleet whose misses outrun its
// prefill does not.
func (TieredEviction) SLO() time.Duration { return time.Second }

// Plan draws the groups' prompts and the arrivals for o.
func (e TieredEviction) Plan(o Options) (Plan, error) {
	e = e.withDefaults()
	if err := checkOptions("tiered-eviction", o); err != nil {
		return Plan{}, err
	}
	if e.Engines < 1 || e.GPUBlocks < 2 || e.Groups < 1 || e.Prompts < 1 || e.SystemTokens < 1 || e.QuestionTokens < 1 ||
		e.OutputTokens < 1 || e.Requests < 1 || !(e.QPS > 0) {
		return Plan{}, fmt.Errorf("tiered-eviction: bad shape %+v", e)
	}
	if err := checkFits("tiered-eviction", o.MaxModelLen, e.SystemTokens+e.QuestionTokens+32, e.OutputTokens); err != nil {
		return Plan{}, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x7469657265)) // "tiere"
	systems := make([]string, e.Groups)
	questions := make([][]string, e.Groups)
	for g := range systems {
		systems[g] = fmt.Sprintf("Group %d system prompt. ", g) + Text(rng, e.SystemTokens)
		questions[g] = make([]string, e.Prompts)
		for q := range questions[g] {
			questions[g][q] = fmt.Sprintf("\nQuestion %d: ", q) + Text(rng, e.QuestionTokens)
		}
	}
	return openLoop(rng, e.Requests, e.QPS, o.Rate, func(rng *rand.Rand) (int, func() Request) {
		g, q := rng.IntN(e.Groups), rng.IntN(e.Prompts)
		return g, func() Request { return textCompletion(systems[g]+questions[g][q], e.OutputTokens) }
	}), nil
}
