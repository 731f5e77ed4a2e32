package workload

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"time"
)

// HotSet is the peers' hot set in its owner-concentration variant: fewer
// long shared prefixes than engines, each small enough to fit on every
// engine, requested uniformly at random, each request a prefix and a
// question of its own with a long output, at Poisson arrivals; a
// streaming text /v1/completions with ignore_eos. The load is
// decode-heavy and exceeds what the prefixes' owners can serve, so a
// policy that keeps each prefix on one owner saturates those owners
// while the rest of the fleet idles; a policy must spread a hot prefix
// beyond its owner, and a spread pays one copy of the prefix per engine
// it reaches: a cold prefill, or a pull from a peer's CPU tier (the fleet
// has one). Conversations are prefixes, turns a prefix's requests in
// arrival order; Prev is left to the driver.
//
// Source and scaling (source | here): the P2P guide's hot set, variant
// of 8 prefixes (benchmarking/README.md@01cac34), gpt-oss-120b TP=1
// H200 pods with a CPU + P2P tier | engines of the gptoss120b-h200
// profile:
//   - 8 prefixes over 16 pods, 48K tokens | 4 over 8 engines (half a
//     prefix an engine, as there) of 12,000 tokens: a cold prompt (≈
//     12,270 tokens) costs ≈ 0.33 s on an idle engine, a pull of the
//     prefix ≈ 0.16 s (the source's 48K: ≈ 1.6 s against ≈ 0.54 s).
//   - questions 256 tokens | the same.
//   - outputs 512 tokens | 128: the profile decodes at ≈ 30–60 ms a
//     token (its 29.8 ms step base on every decode step; decode is
//     marked uncalibrated), ≈ 4× the rig, so 128 tokens take here about
//     what 512 took there.
//   - the prefixes (384K tokens) fit in every pod (0.31× of ≈ 1.22M) |
//     4 × 12K = 48K tokens: 0.3× an engine of 10,000 blocks of 16
//     (160K tokens). CPU tier 2× the GPU (the P2P guide's sizing): 20,000
//     blocks.
//   - constant-rate stages 12, 24, 36, 48 requests a second; affinity's
//     8 owners cap at ≈ 15 and shed 672 requests at 48, load + P2P
//     reaches 34.3 | one rate per plan. In the lab (round-robin, one
//     engine) an engine serves 15–20 requests a second before its queue
//     grows (decode-bound), so 4 evenly placed owners cap near 70 and the
//     fleet near 140. Nominal 100 requests a second: ≈ 1.5× the owners'
//     cap and ≈ 0.7× the fleet's, as the source's 24 stage was (1.6× its
//     owners' 15, 0.7× its 34). In the lab (seeds 1–2, before the CPU
//     tier was wired) hash pinning (prefix-hash) is past its knee by
//     Rate 0.75 (p90 8.4 s; at 0.5 already on the seed whose hash put two
//     prefixes on one owner), llm-d, which spreads late, at rate 1 (p90
//     5.6–7.2 s), while precise, which spills, holds p90 ≤ 0.35 s (p99
//     1.4 s) and round-robin, which puts every prefix on every engine
//     after warm-up (97% hits), stays under 0.2 s to Rate 1.5. A sweep
//     of Rate 0.5–2 spans the source's stages.
//   - 3,000 requests (30 s at rate 1; each prefix ≈ 750 times). Rate
//     divides the arrival offsets.
//
// Zero fields take the defaults in brackets.
type HotSet struct {
	Engines   int // [8]
	GPUBlocks int // KV blocks of 16 tokens per engine [10000]
	// CPUBlocks is each engine's CPU tier in blocks of 16 [20000;
	// negative: none].
	CPUBlocks int
	Prefixes  int // [4]
	// PrefixTokens and QuestionTokens size the prompts [12000, 256].
	PrefixTokens, QuestionTokens int
	OutputTokens                 int     // per request [128]
	Requests                     int     // [3000]
	QPS                          float64 // nominal arrivals a second [100]
}

func (h HotSet) withDefaults() HotSet {
	h.Engines, h.GPUBlocks, h.CPUBlocks = cmp.Or(h.Engines, 8), cmp.Or(h.GPUBlocks, 10000), cmp.Or(h.CPUBlocks, 20000)
	h.Prefixes, h.PrefixTokens, h.QuestionTokens = cmp.Or(h.Prefixes, 4), cmp.Or(h.PrefixTokens, 12000), cmp.Or(h.QuestionTokens, 256)
	h.OutputTokens, h.Requests, h.QPS = cmp.Or(h.OutputTokens, 128), cmp.Or(h.Requests, 3000), cmp.Or(h.QPS, 100)
	return h
}

// Name is the scenario's name.
func (HotSet) Name() string { return "hot-set" }

// Fleet is the fleet the scenario is defined for: gptoss120b-h200
// engines with a CPU tier (the driver's default context).
func (h HotSet) Fleet() Fleet {
	h = h.withDefaults()
	return Fleet{Engines: h.Engines, GPUBlocks: h.GPUBlocks, CPUBlocks: max(h.CPUBlocks, 0), Profile: "gptoss120b-h200"}
}

// SLO is 750 ms: twice the cold prefill of a prompt (≈ 12,270 tokens,
// two chunks ≈ 0.33 s), rounded up: a miss on an idle engine meets it,
// as does a first copy on a spread engine; a saturated owner's queue
// does not.
func (HotSet) SLO() time.Duration { return 750 * time.Millisecond }

// Plan draws the prefixes and the arrivals for o.
func (h HotSet) Plan(o Options) (Plan, error) {
	h = h.withDefaults()
	if err := checkOptions("hot-set", o); err != nil {
		return Plan{}, err
	}
	if h.Engines < 1 || h.GPUBlocks < 2 || h.Prefixes < 1 || h.PrefixTokens < 1 || h.QuestionTokens < 1 || h.OutputTokens < 1 ||
		h.Requests < 1 || !(h.QPS > 0) {
		return Plan{}, fmt.Errorf("hot-set: bad shape %+v", h)
	}
	if err := checkFits("hot-set", o.MaxModelLen, h.PrefixTokens+h.QuestionTokens+32, h.OutputTokens); err != nil {
		return Plan{}, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x686f74736574)) // "hotset"
	prefixes := make([]string, h.Prefixes)
	for k := range prefixes {
		prefixes[k] = fmt.Sprintf("Hot prefix %d. ", k) + Text(rng, h.PrefixTokens)
	}
	n := 0
	return openLoop(rng, h.Requests, h.QPS, o.Rate, func(rng *rand.Rand) (int, func() Request) {
		k, seed, id := rng.IntN(h.Prefixes), rng.Uint64(), n
		n++
		return k, func() Request {
			own := rand.New(rand.NewPCG(seed, uint64(id)))
			return textCompletion(prefixes[k]+fmt.Sprintf("\nQuestion %d: ", id)+Text(own, h.QuestionTokens), h.OutputTokens)
		}
	}), nil
}
