package score

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/peers"
)

// Policy names a routing policy.
type Policy string

// The policies. Precise is the product; the others are baselines.
const (
	Precise     Policy = "precise"      // lowest estimated TTFT from exact matches, bounded load
	PrefixHash  Policy = "prefix-hash"  // what an external consistent-hash LB keyed on prefix_hash does
	LeastLoaded Policy = "least-loaded" // fewest requests in flight
	RoundRobin  Policy = "round-robin"  // in turn
)

// The peers' policies, re-implemented as comparison baselines (package
// picker/peers decides for them, not Decide).
const (
	LLMD        Policy = peers.LLMD
	LLMDPrecise Policy = peers.LLMDPrecise
	Dynamo      Policy = peers.Dynamo
	SGLang      Policy = peers.SGLang
)

// Policies lists kvroute's own policies: the product and its baselines.
func Policies() []Policy { return []Policy{Precise, PrefixHash, LeastLoaded, RoundRobin} }

// PeerPolicies lists the peers' policies.
func PeerPolicies() []Policy { return []Policy{LLMD, LLMDPrecise, Dynamo, SGLang} }

// IsPeer reports whether p is one of the peers' policies.
func (p Policy) IsPeer() bool { return slices.Contains(PeerPolicies(), p) }

// ParsePolicy checks a policy name: one of kvroute's or a peer's.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range append(Policies(), PeerPolicies()...) {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown policy %q: want precise, prefix-hash, least-loaded or round-robin, or a peer's for comparison: llm-d, llm-d-precise, dynamo or sglang", s)
}

// Reason says why a decision went the way it did (a metric label).
type Reason string

// The reasons.
const (
	ReasonCacheHit     Reason = "cache_hit"      // precise: a candidate holds a useful prefix
	ReasonColdAnchor   Reason = "cold_anchor"    // precise: nobody does; rendezvous on the anchor
	ReasonColdNoAnchor Reason = "cold_no_anchor" // precise: nobody does and there is no anchor
	ReasonLoadOnly     Reason = "load_only"      // the request's identity is unresolved: load only
	ReasonPrefixHash   Reason = "prefix_hash"    // the prefix-hash baseline
	ReasonLeastLoaded  Reason = "least_loaded"   // the least-loaded baseline
	ReasonRoundRobin   Reason = "round_robin"    // the round-robin baseline
	ReasonNoneHealthy  Reason = "none_healthy"   // no candidate to choose
)

// Config tunes the decision. Start from DefaultConfig: a zero field is
// invalid, not a default, and Validate says which.
type Config struct {
	Policy Policy
	// Epsilon is the bounded-load factor: no candidate above ⌈(1+ε)·mean⌉
	// requests in flight while another is under it. Default 1: a hard cap
	// at twice the mean, a safety net behind the cost, which spreads load
	// by itself through RunningTokens (0.25 moved sessions off their warm
	// engines too often: docs/benchmarks.md, issue 16).
	Epsilon float64
	// MinCap is the least the cap may be. At low load ⌈(1+ε)·mean⌉ is 1,
	// and a conversation whose previous turn the picker still counts in
	// flight (until the engine's next load report) would be pushed off its
	// warm endpoint, though an engine batching a few sequences is not
	// overloaded. Default 4; 1 applies the formula alone.
	MinCap int
	// MinMatchTokens: a prefix shorter than this is cold. Default 16 (one
	// block of vLLM's default size).
	MinMatchTokens int
	// TierWeights credit a matched token by tier: a GPU block is free, CPU
	// and storage blocks must be loaded back. Default 1, 0.8, 0.5.
	TierWeights [tier.Count]float64
	// WaitingTokens is the prefill work assumed for a waiting request the
	// picker knows nothing about (another picker's). Default 1024.
	WaitingTokens float64
	// SaturationWaiting and SaturationKVUsage gate the bounded-load cap
	// for cache hits: the cap moves a request off the endpoint holding its
	// prefix only when that engine is saturated — it reports at least
	// SaturationWaiting requests waiting (it queues, not just batches), or
	// its live requests hold at least SaturationKVUsage of its KV cache
	// (more sessions would evict cached prefixes). An engine with room
	// keeps its warm sessions; the cost (RunningTokens, the picks in
	// flight) still weighs its load. Either at 0 lets the cap bind on the
	// count alone. Defaults 1 and 0.25 (chosen on the agentic-pressure and
	// shared-prefix benches, docs/benchmarks.md).
	SaturationWaiting, SaturationKVUsage float64
	// RunningTokens is the prefill-token equivalent of the slowdown one
	// running request adds (its decode steps share the batch, its KV
	// crowds the cache). Default 512: calibrated on the agentic-pressure
	// bench, where 32 left the cost blind to how many sessions an engine
	// already serves (docs/benchmarks.md, issue 16).
	RunningTokens float64
	// OverrideCost bounds what the cap may cost a cache hit: it moves a
	// request off the endpoint holding its prefix only to one whose
	// estimated cost is at most OverrideCost times the warm one's. Past
	// that the move costs more prefill than the queue it escapes, and
	// leaves a duplicate of the prefix behind. Default 1.5 (on the trace
	// bench, unbounded moves cost 2–3 points of hit rate:
	// docs/benchmarks.md, issue 16); 0 lets the cap move any cache hit.
	OverrideCost float64
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Policy: Precise, Epsilon: 1, MinCap: 4, MinMatchTokens: 16, TierWeights: [tier.Count]float64{1, 0.8, 0.5},
		WaitingTokens: 1024, RunningTokens: 512, SaturationWaiting: 1, SaturationKVUsage: 0.25, OverrideCost: 1.5}
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []error
	if _, err := ParsePolicy(string(c.Policy)); err != nil {
		errs = append(errs, err)
	}
	if !(c.Epsilon >= 0 && c.Epsilon <= 100) {
		errs = append(errs, fmt.Errorf("load epsilon %v: want 0..100", c.Epsilon))
	}
	if c.MinCap < 1 {
		errs = append(errs, fmt.Errorf("min load cap %d: want at least 1", c.MinCap))
	}
	if c.MinMatchTokens < 1 {
		errs = append(errs, fmt.Errorf("min match tokens %d: want at least 1", c.MinMatchTokens))
	}
	for t, w := range c.TierWeights {
		if !(w >= 0 && w <= 1) {
			errs = append(errs, fmt.Errorf("tier %d weight %v: want 0..1", t, w))
		}
	}
	if !(c.SaturationWaiting >= 0) || math.IsInf(c.SaturationWaiting, 0) {
		errs = append(errs, fmt.Errorf("saturation waiting %v: want a finite count ≥ 0", c.SaturationWaiting))
	}
	if !(c.SaturationKVUsage >= 0 && c.SaturationKVUsage <= 1) {
		errs = append(errs, fmt.Errorf("saturation KV usage %v: want 0..1", c.SaturationKVUsage))
	}
	if !(c.OverrideCost == 0 || (c.OverrideCost >= 1 && c.OverrideCost <= 1000)) {
		errs = append(errs, fmt.Errorf("override cost factor %v: want 0 (unbounded) or 1..1000", c.OverrideCost))
	}
	if !(c.WaitingTokens >= 0) || !(c.RunningTokens >= 0) || math.IsInf(c.WaitingTokens, 0) || math.IsInf(c.RunningTokens, 0) {
		errs = append(errs, errors.New("waiting and running token costs must be finite and non-negative"))
	}
	return errors.Join(errs...)
}

// Candidate is one endpoint of the request's identity group.
type Candidate struct {
	ID      string // stable identity: the engine URL
	Healthy bool
	// Matched is how many leading prompt tokens the endpoint holds, per
	// tier (whole blocks, from the fleet index).
	Matched [tier.Count]int
	// Waiting, Running and KVUsage (0..1: the share of its KV cache its
	// live requests hold) are the engine's last load report.
	Waiting, Running, KVUsage float64
	// Sent and SentTokens are the requests (and their uncached prompt
	// tokens) this picker sent the endpoint since that report.
	Sent       int
	SentTokens float64
}

// Request is what the decision needs of a request.
type Request struct {
	PromptTokens int
	// Anchor is the request's prefix_hash key; HasAnchor is false when its
	// anchor holds no full block.
	Anchor    uint64
	HasAnchor bool
	// TieKey breaks ties when there is no anchor (the first block's key,
	// say); any stable value of the request.
	TieKey uint64
	// LoadOnly routes by load alone (an unresolved identity).
	LoadOnly bool
	// Counter is the round-robin position (the caller's request count).
	Counter uint64
}

// Decision is the choice and its reasons.
type Decision struct {
	Index  int // into the candidates; -1 when none is healthy
	Reason Reason
	Cap    int     // the bounded-load cap in force
	Cached float64 // the chosen candidate's credited cached tokens
	// Override is set when the best-cached candidate was skipped for load.
	Override *Override
	Explain  []Explain // per candidate, in input order
}

// Override records a best-cached candidate skipped for load.
type Override struct {
	Index      int
	TokensLost float64 // credited cached tokens it had over the chosen one
}

// Explain is one candidate as the decision saw it.
type Explain struct {
	ID       string          `json:"endpoint"`
	Matched  [tier.Count]int `json:"-"`
	Cached   float64         `json:"cached_tokens"`
	InFlight float64         `json:"in_flight"`
	Queued   float64         `json:"queued_tokens"`
	Cost     float64         `json:"estimated_cost_tokens"`
	UnderCap bool            `json:"under_load_cap"`
	Why      string          `json:"why"`
}

// cand is a candidate's derived figures.
type cand struct {
	i        int
	cached   float64
	inFlight float64
	queued   float64
	cost     float64
	weight   uint64 // rendezvous weight for the request's key
	underCap bool
}

// Decide chooses among cs for r.
func Decide(cfg *Config, r Request, cs []Candidate) Decision {
	d := Decision{Index: -1, Explain: make([]Explain, len(cs))}
	key := r.TieKey
	if r.HasAnchor {
		key = r.Anchor
	}
	if r.LoadOnly || cfg.Policy == LeastLoaded {
		// Load-only choices break ties by the request count: breaking them
		// by the prefix would give the baseline an affinity it does not
		// have by design.
		key = mix(r.Counter)
	}
	healthy := make([]cand, 0, len(cs))
	total := 0.0
	for i := range cs {
		c := &cs[i]
		x := cand{i: i, cached: cfg.cached(c, r.PromptTokens), inFlight: inFlight(c),
			queued: c.Waiting*cfg.WaitingTokens + c.Running*cfg.RunningTokens + c.SentTokens, weight: Weight(key, c.ID)}
		x.cost = float64(r.PromptTokens) - x.cached + x.queued
		d.Explain[i] = Explain{ID: c.ID, Matched: c.Matched, Cached: x.cached, InFlight: x.inFlight, Queued: x.queued, Cost: x.cost}
		if !c.Healthy {
			d.Explain[i].Why = "unhealthy"
			continue
		}
		healthy = append(healthy, x)
		total += x.inFlight
	}
	if len(healthy) == 0 {
		d.Reason = ReasonNoneHealthy
		return d
	}
	// The cap counts this request: ⌈(1+ε)·(total+1)/n⌉, at least MinCap.
	d.Cap = max(cfg.MinCap, int(math.Ceil((1+cfg.Epsilon)*(total+1)/float64(len(healthy)))))
	anyUnder := false
	for j := range healthy {
		healthy[j].underCap = healthy[j].inFlight+1 <= float64(d.Cap)
		anyUnder = anyUnder || healthy[j].underCap
		d.Explain[healthy[j].i].UnderCap = healthy[j].underCap
	}
	if !anyUnder { // cannot happen with ε ≥ 0, but never choose nobody
		for j := range healthy {
			healthy[j].underCap = true
		}
	}
	var pick int // index into healthy
	switch {
	case r.LoadOnly:
		pick, d.Reason = leastLoaded(healthy), ReasonLoadOnly
	case cfg.Policy == RoundRobin:
		sort.Slice(healthy, func(a, b int) bool { return cs[healthy[a].i].ID < cs[healthy[b].i].ID })
		pick, d.Reason = int(r.Counter%uint64(len(healthy))), ReasonRoundRobin
	case cfg.Policy == LeastLoaded:
		pick, d.Reason = leastLoaded(healthy), ReasonLeastLoaded
	case cfg.Policy == PrefixHash:
		if r.HasAnchor {
			pick, d.Reason = rendezvous(healthy), ReasonPrefixHash
		} else {
			pick, d.Reason = leastLoaded(healthy), ReasonLeastLoaded
		}
	default:
		best := bestCached(healthy)
		switch {
		case healthy[best].cached >= float64(cfg.MinMatchTokens):
			for j := range healthy { // the cap binds only on engines that queue
				if !cfg.saturated(cs[healthy[j].i]) {
					healthy[j].underCap = true
					d.Explain[healthy[j].i].UnderCap = true
				}
			}
			pick, d.Reason = cheapest(healthy), ReasonCacheHit
			if !healthy[best].underCap && cfg.OverrideCost > 0 && healthy[pick].cost > cfg.OverrideCost*healthy[best].cost {
				pick = best // moving would cost more than the queue it escapes
			}
			if !healthy[best].underCap && healthy[best].cached > healthy[pick].cached {
				d.Override = &Override{Index: healthy[best].i, TokensLost: healthy[best].cached - healthy[pick].cached}
			}
		case r.HasAnchor:
			pick, d.Reason = rendezvous(healthy), ReasonColdAnchor
		default:
			pick, d.Reason = leastLoaded(healthy), ReasonColdNoAnchor
		}
	}
	chosen := healthy[pick]
	d.Index, d.Cached = chosen.i, chosen.cached
	for _, x := range healthy {
		d.Explain[x.i].Why = why(&d, x, chosen)
	}
	return d
}

// why words one candidate's outcome.
func why(d *Decision, x, chosen cand) string {
	switch {
	case x.i == chosen.i:
		return "chosen: " + string(d.Reason)
	case !x.underCap:
		return "over the load cap"
	}
	switch d.Reason {
	case ReasonCacheHit:
		if x.cost > chosen.cost {
			return "higher estimated cost"
		}
		return "equal cost, lower tie-break weight"
	case ReasonColdAnchor, ReasonPrefixHash:
		return "lower rendezvous weight for the anchor"
	case ReasonRoundRobin:
		return "not its turn"
	}
	if x.inFlight > chosen.inFlight {
		return "more requests in flight"
	}
	return "equal load, lower tie-break weight"
}

// saturated reports whether the bounded-load cap binds on c's engine for
// a cache hit (SaturationWaiting, SaturationKVUsage).
func (cfg *Config) saturated(c Candidate) bool {
	return cfg.SaturationWaiting == 0 || cfg.SaturationKVUsage == 0 ||
		c.Waiting >= cfg.SaturationWaiting || c.KVUsage >= cfg.SaturationKVUsage
}

func inFlight(c *Candidate) float64 {
	return math.Max(0, c.Waiting) + math.Max(0, c.Running) + float64(max(0, c.Sent))
}

// cached credits the matched tokens: the GPU prefix fully, what the CPU
// and storage tiers hold beyond it at their weights.
func (cfg *Config) cached(c *Candidate, prompt int) float64 {
	have, credit := 0, 0.0
	for _, t := range tier.All() {
		m := min(max(c.Matched[t], 0), prompt)
		if m > have {
			credit += float64(m-have) * cfg.TierWeights[t]
			have = m
		}
	}
	return credit
}

// Weight is the rendezvous (highest-random-weight) hash of key for an
// endpoint: every replica computes the same ranking of endpoints for a key,
// and removing an endpoint moves only the keys it ranked first.
func Weight(key uint64, id string) uint64 {
	return mix(key ^ xxh3.HashString(id))
}

func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// argmin returns the candidate (under the cap, unless all is set) with
// the least key, ties going to the higher rendezvous weight; -1 when none
// qualifies.
func argmin(cs []cand, all bool, key func(cand) float64) int {
	pick := -1
	for j, x := range cs {
		if !x.underCap && !all {
			continue
		}
		if pick < 0 {
			pick = j
			continue
		}
		kx, kp := key(x), key(cs[pick])
		if kx < kp || (kx == kp && x.weight > cs[pick].weight) {
			pick = j
		}
	}
	return pick
}

// rendezvous picks the highest-weight candidate under the cap.
func rendezvous(cs []cand) int { return argmin(cs, false, func(cand) float64 { return 0 }) }

// leastLoaded picks the fewest in flight (under the cap by construction).
func leastLoaded(cs []cand) int { return argmin(cs, false, func(x cand) float64 { return x.inFlight }) }

// cheapest picks the lowest estimated cost under the cap.
func cheapest(cs []cand) int { return argmin(cs, false, func(x cand) float64 { return x.cost }) }

// bestCached is the candidate holding most, cap or not.
func bestCached(cs []cand) int { return argmin(cs, true, func(x cand) float64 { return -x.cached }) }
