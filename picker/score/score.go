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

// The peers' arms with KV pulls (peer-policies.md §4): a peer's
// placement plus its source decision, and llm-d's load-only recompute
// control.
const (
	LLMDPreciseP2P Policy = peers.LLMDPreciseP2P
	LLMDP2P        Policy = peers.LLMDP2P
	LLMDLoad       Policy = peers.LLMDLoad
	LLMDLoadP2P    Policy = peers.LLMDLoadP2P
	DynamoHint     Policy = peers.DynamoHint
)

// ArmPolicies lists the peers' arms with KV pulls, for runs on engines
// with vLLM's CPU and P2P tiers.
func ArmPolicies() []Policy {
	return []Policy{LLMDPreciseP2P, LLMDP2P, LLMDLoad, LLMDLoadP2P, DynamoHint}
}

// IsPeer reports whether p is one of the peers' policies or arms.
func (p Policy) IsPeer() bool {
	return slices.Contains(PeerPolicies(), p) || slices.Contains(ArmPolicies(), p)
}

// ParsePolicy checks a policy name: one of kvroute's, a peer's or a
// peer's arm with KV pulls.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range append(append(Policies(), PeerPolicies()...), ArmPolicies()...) {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown policy %q: want precise, prefix-hash, least-loaded or round-robin, or a peer's for comparison: llm-d, llm-d-precise, dynamo or sglang, or an arm with KV pulls: llm-d-precise+p2p, llm-d+p2p, llm-d-load, llm-d-load+p2p or dynamo+hint", s)
}

// Reason says why a decision went the way it did (a metric label).
type Reason string

// The reasons.
const (
	ReasonCacheHit     Reason = "cache_hit"      // precise: the fastest predicted holds a useful prefix
	ReasonWithinSLO    Reason = "within_slo"     // precise: the most cached of those predicted within the request's SLO
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
	// requests in flight while another is under it. Default 3: a cap at
	// four times the mean, a safety net behind the predicted TTFT, which
	// spreads load by itself. At 1 (twice the mean, the default before the
	// prediction) the cap still moved sessions off their warm engines on
	// the tuning seeds (agentic-pressure warm returns 90.9% against 93.9%,
	// hit rate 74.3% against 75.0%, b2b-saas 90.8% against 91.3%);
	// at 3 it did not bind there (docs/benchmarks.md, "Issue 35").
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
	// TieRatio: candidates predicted within this share of the fastest
	// are tied; of those, the one holding most of the prefix wins, then
	// the rendezvous weight on the request's anchor, so that the fleet's
	// cache is kept, siblings of a new prefix land together, and picker
	// replicas that see slightly different bookings still agree. Default
	// 0.25: on the tuning seeds (1–10) it beat 0 on every scenario tried
	// (agentic-pressure 66.9% → 74.3% hit, 1,047 → 623 ms mean TTFT) and
	// 0.1 and 0.5 on their balance (docs/benchmarks.md, "Issue 35").
	TieRatio float64
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Policy: Precise, Epsilon: 3, MinCap: 4, MinMatchTokens: 16, TierWeights: [tier.Count]float64{1, 0.8, 0.5}, TieRatio: 0.25}
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
	if !(c.TieRatio >= 0 && c.TieRatio <= 10) {
		errs = append(errs, fmt.Errorf("tie ratio %v: want 0..10", c.TieRatio))
	}
	return errors.Join(errs...)
}

// Candidate is one endpoint of the request's identity group.
type Candidate struct {
	ID string // stable identity: the engine URL
	// IDHash is xxh3.HashString(ID), when the caller has it at hand (0:
	// hashed here): the rendezvous weight's part of the endpoint.
	IDHash  uint64
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
	// Predicted is the request's predicted TTFT there, in seconds, and
	// Ahead the prefill work in tokens it would wait behind (precise
	// decides by them; picker/predict and picker/decide compute them).
	Predicted, Ahead float64
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
	// SLO is the request's TTFT target in seconds (0: none): precise
	// chooses, among the candidates predicted within it, the one that
	// keeps the fleet's cache best.
	SLO float64
	// Terse: the decision is not explained (Decision.Explain nil), which
	// spares a decision over a large group an explanation per candidate
	// nobody reads. The choice is the same.
	Terse bool
}

// Decision is the choice and its reasons.
type Decision struct {
	Index  int // into the candidates; -1 when none is healthy
	Reason Reason
	Cap    int     // the bounded-load cap in force
	Cached float64 // the chosen candidate's credited cached tokens
	// Override is set when the best-cached candidate was skipped for load.
	Override *Override
	Explain  []Explain // per candidate, in input order; nil when Request.Terse
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
	// Predicted is the predicted TTFT in seconds (precise).
	Predicted float64 `json:"-"`
	UnderCap  bool    `json:"under_load_cap"`
	Why       string  `json:"why"`
}

// cand is a candidate's derived figures.
type cand struct {
	i        int
	cached   float64
	inFlight float64
	queued   float64
	cost     float64
	// predicted is the predicted TTFT (seconds)
	predicted float64
	weight    uint64 // rendezvous weight for the request's key
	underCap  bool
}

// Scratch is memory a decision's per-candidate work reuses: a caller
// deciding often keeps a few (one per decision under way) so that a
// decision at 1,000 endpoints does not allocate its working set each
// time. The zero value is ready; nothing a Decision holds points into it.
type Scratch struct {
	cands []cand
}

// Decide chooses among cs for r.
func Decide(cfg *Config, r Request, cs []Candidate) Decision {
	return DecideWith(cfg, r, cs, nil)
}

// DecideWith is Decide working in s (nil: fresh memory): the same
// decision. s must not be used by another decision at the same time.
func DecideWith(cfg *Config, r Request, cs []Candidate, s *Scratch) Decision {
	d := Decision{Index: -1}
	if !r.Terse {
		d.Explain = make([]Explain, len(cs))
	}
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
	var healthy []cand
	if s != nil && cap(s.cands) >= len(cs) {
		healthy = s.cands[:0]
	} else {
		healthy = make([]cand, 0, len(cs))
		if s != nil {
			s.cands = healthy
		}
	}
	total := 0.0
	for i := range cs {
		c := &cs[i]
		x := cand{i: i, cached: cfg.cached(c, r.PromptTokens), inFlight: inFlight(c), queued: c.Ahead,
			predicted: c.Predicted, weight: weight(key, c)}
		x.cost = float64(r.PromptTokens) - x.cached + x.queued
		if d.Explain != nil {
			d.Explain[i] = Explain{ID: c.ID, Matched: c.Matched, Cached: x.cached, InFlight: x.inFlight, Queued: x.queued, Cost: x.cost, Predicted: x.predicted}
		}
		if !c.Healthy {
			if d.Explain != nil {
				d.Explain[i].Why = "unhealthy"
			}
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
		if d.Explain != nil {
			d.Explain[healthy[j].i].UnderCap = healthy[j].underCap
		}
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
		pick, d.Reason = cfg.precise(r, healthy)
		if best := bestCached(healthy); healthy[best].cached > healthy[pick].cached && healthy[best].cached >= float64(cfg.MinMatchTokens) {
			d.Override = &Override{Index: healthy[best].i, TokensLost: healthy[best].cached - healthy[pick].cached}
		}
	}
	chosen := healthy[pick]
	d.Index, d.Cached = chosen.i, chosen.cached
	for _, x := range healthy {
		if d.Explain == nil {
			break
		}
		d.Explain[x.i].Why = why(&d, x, chosen, cfg.TieRatio)
	}
	return d
}

// why words one candidate's outcome.
func why(d *Decision, x, chosen cand, tie float64) string {
	switch {
	case x.i == chosen.i:
		return "chosen: " + string(d.Reason)
	case !x.underCap:
		return "over the load cap"
	}
	switch d.Reason {
	case ReasonCacheHit, ReasonColdAnchor, ReasonColdNoAnchor:
		switch {
		case x.predicted > chosen.predicted*(1+tie):
			return "higher predicted TTFT"
		case x.cached < chosen.cached:
			return "predicted as fast, holds less of the prefix"
		}
		return "predicted as fast, lower tie-break weight"
	case ReasonWithinSLO:
		if x.cached < chosen.cached {
			return "holds less of the prefix"
		}
		return "predicted past the SLO, or equal, lower tie-break weight"
	case ReasonPrefixHash:
		return "lower rendezvous weight for the anchor"
	case ReasonRoundRobin:
		return "not its turn"
	}
	if x.inFlight > chosen.inFlight {
		return "more requests in flight"
	}
	return "equal load, lower tie-break weight"
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

// weight is Weight(key, c.ID), from c.IDHash when given.
func weight(key uint64, c *Candidate) uint64 {
	if c.IDHash != 0 {
		return mix(key ^ c.IDHash)
	}
	return Weight(key, c.ID)
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

// precise is the decision by predicted TTFT: the fastest candidate under
// the cap, those within TieRatio of it tied and broken by the rendezvous
// weight; with an SLO, of the candidates predicted within it, the one
// holding most of the prefix (ties by weight).
func (cfg *Config) precise(r Request, cs []cand) (int, Reason) {
	held := func(x cand) float64 { // a match under MinMatchTokens is none
		if x.cached < float64(cfg.MinMatchTokens) {
			return 0
		}
		return x.cached
	}
	// keeps is the candidate under the cap predicted within limit that
	// holds most of the prefix, ties by weight; -1 when none is.
	keeps := func(limit float64) int {
		pick := -1
		for j, x := range cs {
			if !x.underCap || x.predicted > limit {
				continue
			}
			if pick < 0 || held(x) > held(cs[pick]) || (held(x) == held(cs[pick]) && x.weight > cs[pick].weight) {
				pick = j
			}
		}
		return pick
	}
	if r.SLO > 0 {
		if within := keeps(r.SLO); within >= 0 {
			return within, ReasonWithinSLO
		}
	}
	fastest := argmin(cs, false, func(x cand) float64 { return x.predicted })
	pick := keeps(cs[fastest].predicted * (1 + cfg.TieRatio))
	switch {
	case cs[pick].cached >= float64(cfg.MinMatchTokens):
		return pick, ReasonCacheHit
	case r.HasAnchor:
		return pick, ReasonColdAnchor
	}
	return pick, ReasonColdNoAnchor
}

// bestCached is the candidate holding most, cap or not.
func bestCached(cs []cand) int { return argmin(cs, true, func(x cand) float64 { return -x.cached }) }
