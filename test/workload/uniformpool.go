package workload

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"time"
)

// UniformPool is the negative control: a pool of shared prefixes, several
// per engine, requested uniformly at random (no skew), each request a
// prefix and a short question of its own with a short output, at Poisson
// arrivals; a streaming text /v1/completions with ignore_eos. It is
// prefix affinity's best case — a stable partition gives every request a
// hit on an evenly loaded fleet — so a challenger may at most tie: a
// policy that loses here pays for its cleverness where nothing is to be
// won. Conversations are prefixes, turns a prefix's requests in arrival
// order; Prev is left to the driver.
//
// Source and scaling (source | here): the peers' shared-prefix pool (P2P
// benchmarking README) |
//   - 128 prefixes over 16 pods (8 per pod) of 48K tokens | 64 over 8
//     engines (8 per engine) of 6,000 tokens: 48K ÷ 8, so a cold prefix
//     costs ≈ 0.6 s at the default engine's 10,000 tokens a second
//     (the source's ≈ 1.7 s at ≈ 29K).
//   - questions 256, outputs 64 tokens | the same.
//   - the pool ≈ 5× one pod's KV | 8 engines × 4,800 blocks of 16
//     (76.8K tokens): the pool (384K tokens) is 5× one engine and 0.63×
//     the fleet (the source's 16 pods held it 3×).
//   - pods with the CPU + P2P tier, 2× a pod's GPU KV (the P2P guide's
//     sizing) | a CPU tier of 9,600 blocks per engine (2× the GPU; a
//     tier no larger only mirrors it, vLLM). An engine's share of a
//     stable partition (8 prefixes, ≈ 50K tokens) already fits its GPU,
//     so the tier adds hits only to policies that spread the pool (its
//     154K tokens hold 0.4× of it). Engines of the sim-default profile
//     (its 10,000 tokens a second, as above).
//   - constant-rate stages 6–30 requests a second (all misses ≈ 0.6–3×
//     the fleet's prefill) | one rate per plan: nominal 12 requests a
//     second, where all misses would use ≈ 94% of the fleet's prefill
//     (12 × 6,256 of 8 × 10K tokens a second) and all hits ≈ 4%; Rate
//     0.5–2.5 spans the source's stages. In the lab (seed 1) a
//     cache-blind policy (≈ 18% hits) passes its knee near Rate 1,
//     prefix-aware ones (≈ 85–92% hits) stay within the SLO past 2.
//   - 2,400 requests (200 s at rate 1; each prefix ≈ 37 times). Rate
//     divides the arrival offsets.
//
// Zero fields take the defaults in brackets.
type UniformPool struct {
	Engines   int // [8]
	GPUBlocks int // KV blocks of 16 tokens per engine [4800]
	// CPUBlocks is each engine's CPU tier in blocks of 16 [2 ×
	// GPUBlocks, 9600; negative: none].
	CPUBlocks int
	Prefixes  int // [64]
	// PrefixTokens and QuestionTokens size the prompts [6000, 256].
	PrefixTokens, QuestionTokens int
	OutputTokens                 int     // per request [64]
	Requests                     int     // [2400]
	QPS                          float64 // nominal arrivals a second [12]
}

func (u UniformPool) withDefaults() UniformPool {
	u.Engines, u.GPUBlocks, u.Prefixes = cmp.Or(u.Engines, 8), cmp.Or(u.GPUBlocks, 4800), cmp.Or(u.Prefixes, 64)
	u.CPUBlocks = cmp.Or(u.CPUBlocks, 2*u.GPUBlocks)
	u.PrefixTokens, u.QuestionTokens = cmp.Or(u.PrefixTokens, 6000), cmp.Or(u.QuestionTokens, 256)
	u.OutputTokens, u.Requests, u.QPS = cmp.Or(u.OutputTokens, 64), cmp.Or(u.Requests, 2400), cmp.Or(u.QPS, 12)
	return u
}

// Name is the scenario's name.
func (UniformPool) Name() string { return "uniform-pool" }

// Fleet is the fleet the scenario is defined for: sim-default engines
// with a CPU tier (the driver's default context).
func (u UniformPool) Fleet() Fleet {
	u = u.withDefaults()
	return Fleet{Engines: u.Engines, GPUBlocks: u.GPUBlocks, CPUBlocks: max(u.CPUBlocks, 0)}
}

// SLO is 1.5 s: twice the cold prefill of a prompt (≈ 6,270 tokens ≈
// 0.63 s plus a 25 ms step), rounded up: a miss on an idle engine meets
// it; the misses of a cache-blind policy near saturation do not.
func (UniformPool) SLO() time.Duration { return 1500 * time.Millisecond }

// Plan draws the pool and the arrivals for o.
func (u UniformPool) Plan(o Options) (Plan, error) {
	u = u.withDefaults()
	if err := checkOptions("uniform-pool", o); err != nil {
		return Plan{}, err
	}
	if u.Engines < 1 || u.GPUBlocks < 2 || u.Prefixes < 1 || u.PrefixTokens < 1 || u.QuestionTokens < 1 || u.OutputTokens < 1 ||
		u.Requests < 1 || !(u.QPS > 0) {
		return Plan{}, fmt.Errorf("uniform-pool: bad shape %+v", u)
	}
	if err := checkFits("uniform-pool", o.MaxModelLen, u.PrefixTokens+u.QuestionTokens+32, u.OutputTokens); err != nil {
		return Plan{}, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x706f6f6c)) // "pool"
	prefixes := make([]string, u.Prefixes)
	for k := range prefixes {
		prefixes[k] = fmt.Sprintf("Pool prefix %d. ", k) + Text(rng, u.PrefixTokens)
	}
	n := 0
	return openLoop(rng, u.Requests, u.QPS, o.Rate, func(rng *rand.Rand) (int, func() Request) {
		k, seed, id := rng.IntN(u.Prefixes), rng.Uint64(), n
		n++
		return k, func() Request {
			own := rand.New(rand.NewPCG(seed, uint64(id)))
			return textCompletion(prefixes[k]+fmt.Sprintf("\nQuestion %d: ", id)+Text(own, u.QuestionTokens), u.OutputTokens)
		}
	}), nil
}
