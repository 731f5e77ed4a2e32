package workload

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// HotPrefix is a hot prefix under Zipf skew: Prefixes long shared
// prefixes, each request picking one by Zipf (rank k with weight k^-Skew)
// and adding a short suffix of its own, at Poisson arrivals; a streaming
// text /v1/completions with ignore_eos. The hottest prefix draws more of
// the load than one engine's share of the fleet, so placement must keep
// prefixes on their owners and still spread the hot one: a policy that
// pins each prefix to one owner saturates the hot owner, one that ignores
// the cache re-prefills the cold tail. Conversations are prefixes (the
// hottest is 0), turns a prefix's requests in arrival order; Prev is left
// to the driver.
//
// Source and scaling (source | here): the peers' hot set (P2P
// benchmarking README: 64 × 48K prefixes, 2.5× a pod's KV, 16 pods,
// 512-token outputs, 12–48 requests a second), with Zipf picks (s ≈ 1.1,
// issue 34) in place of uniform ones |
//   - 32 prefixes (4 per engine, as the source's 64 over 16 pods) of
//     8,000 tokens: a cold prefix costs ≈ 0.8 s at the default engine's
//     10,000 tokens a second (the source's 48K ≈ 1.7 s at ≈ 29K).
//   - Zipf s = 1.1 over 32: the hottest prefix draws 28% of the requests,
//     the top 4 56%, the top 8 71%.
//   - suffixes 128–384 tokens (mean 256, the source's question), outputs
//     128 tokens (512 ÷ 4, for run time).
//   - 8 engines × 6,400 blocks of 16 (102K tokens): the prefixes (256K
//     tokens) are 2.5× one engine, as in the source, and 0.31× the fleet.
//   - nominal 30 requests a second: the hottest prefix's suffixes alone
//     (0.28 × 30 × 256 ≈ 2.2K tokens a second) are ≈ 22% of one
//     engine's prefill, its whole traffic ≈ 8.5 requests a second with
//     their decode. A cache-blind policy re-prefills the tail (≈ 35% of
//     the tokens miss when every engine sees every prefix) and is past
//     its knee already at Rate 0.5; prefix-aware ones cross theirs
//     between Rate 1 and 2, where holding the hot prefix on one owner
//     and spreading it (re-prefilling it elsewhere) trade off (the lab,
//     seed 1). A sweep of Rate 0.5–2 spans them.
//   - 3,000 requests (100 s at rate 1). Rate divides the arrival
//     offsets.
//
// Zero fields take the defaults in brackets.
type HotPrefix struct {
	Engines      int     // [8]
	GPUBlocks    int     // KV blocks of 16 tokens per engine [6400]
	Prefixes     int     // [32]
	PrefixTokens int     // [8000]
	Skew         float64 // the Zipf exponent, > 0 [1.1]
	// SuffixMin and SuffixMax bound a request's own suffix [128, 384].
	SuffixMin, SuffixMax int
	OutputTokens         int     // per request [128]
	Requests             int     // [3000]
	QPS                  float64 // nominal arrivals a second [30]
}

func (h HotPrefix) withDefaults() HotPrefix {
	h.Engines, h.GPUBlocks = cmp.Or(h.Engines, 8), cmp.Or(h.GPUBlocks, 6400)
	h.Prefixes, h.PrefixTokens, h.Skew = cmp.Or(h.Prefixes, 32), cmp.Or(h.PrefixTokens, 8000), cmp.Or(h.Skew, 1.1)
	h.SuffixMin, h.SuffixMax = cmp.Or(h.SuffixMin, 128), cmp.Or(h.SuffixMax, 384)
	h.OutputTokens, h.Requests, h.QPS = cmp.Or(h.OutputTokens, 128), cmp.Or(h.Requests, 3000), cmp.Or(h.QPS, 30)
	return h
}

// Name is the scenario's name.
func (HotPrefix) Name() string { return "hot-prefix" }

// Fleet is the fleet the scenario is defined for (the driver's default
// context).
func (h HotPrefix) Fleet() Fleet {
	h = h.withDefaults()
	return Fleet{Engines: h.Engines, GPUBlocks: h.GPUBlocks}
}

// SLO is 2 s: twice the cold prefill of the longest prompt (≈ 8,400
// tokens ≈ 0.84 s plus two 25 ms steps), rounded up: a miss on an idle
// engine meets it, a saturated owner's queue does not.
func (HotPrefix) SLO() time.Duration { return 2 * time.Second }

// Plan draws the prefixes and the arrivals for o.
func (h HotPrefix) Plan(o Options) (Plan, error) {
	h = h.withDefaults()
	if err := checkOptions("hot-prefix", o); err != nil {
		return Plan{}, err
	}
	if h.Engines < 1 || h.GPUBlocks < 2 || h.Prefixes < 1 || h.PrefixTokens < 1 || !(h.Skew > 0) || math.IsInf(h.Skew, 1) ||
		h.SuffixMin < 1 || h.SuffixMax < h.SuffixMin || h.OutputTokens < 1 || h.Requests < 1 || !(h.QPS > 0) {
		return Plan{}, fmt.Errorf("hot-prefix: bad shape %+v", h)
	}
	if err := checkFits("hot-prefix", o.MaxModelLen, h.PrefixTokens+h.SuffixMax+32, h.OutputTokens); err != nil {
		return Plan{}, err
	}
	rng := rand.New(rand.NewPCG(o.Seed, 0x686f74707265)) // "hotpre"
	prefixes := make([]string, h.Prefixes)
	for k := range prefixes {
		prefixes[k] = fmt.Sprintf("Shared prefix %d. ", k) + Text(rng, h.PrefixTokens)
	}
	cdf := zipfCDF(h.Prefixes, h.Skew)
	n := 0
	return openLoop(rng, h.Requests, h.QPS, o.Rate, func(rng *rand.Rand) (int, func() Request) {
		k := sort.SearchFloat64s(cdf, rng.Float64()*cdf[len(cdf)-1])
		k = min(k, len(cdf)-1)
		size, seed, id := h.SuffixMin+rng.IntN(h.SuffixMax-h.SuffixMin+1), rng.Uint64(), n
		n++
		return k, func() Request {
			own := rand.New(rand.NewPCG(seed, uint64(id)))
			return textCompletion(prefixes[k]+fmt.Sprintf("\nRequest %d: ", id)+Text(own, size), h.OutputTokens)
		}
	}), nil
}

// zipfCDF is the cumulative weights of ranks 1..n under k^-s, unnormalized.
func zipfCDF(n int, s float64) []float64 {
	cdf := make([]float64, n)
	var sum float64
	for k := range cdf {
		sum += math.Pow(float64(k+1), -s)
		cdf[k] = sum
	}
	return cdf
}
