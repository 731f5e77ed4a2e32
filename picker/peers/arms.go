package peers

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/tier"
)

// The arms with KV pulls (shared/docs/peer-policies.md §4): each is a
// peer's placement, unchanged, plus a source decision after it
// (Choice.Source: the candidate whose CPU tier the chosen one should pull
// the prompt's prefix from; the engine pulls, kv-transfer.md §2–3). The
// placement and its state are the base policy's, so the arm picks what
// the base picks on the same inputs; Dispatched, FirstChunk, FirstToken,
// Done and Forget are the base's.
//
// Substitutions common to the llm-d arms' p2p-source-producer:
//   - The request id hashed for the sampling coordinate is Request.ID:
//     the picker fills it with a value drawn per request from its seeded
//     policy random source (picker/peer.go), as the decision has no
//     request id of its own; like an x-request-id it differs per request,
//     and a seeded run reproduces it.
//   - The producer's endpoints are the healthy candidates, in candidate
//     order (the identity group's, by URL): an unhealthy endpoint can
//     neither serve nor set the best, as upstream drops endpoints it has
//     no address for.
//   - Waiting is the last scrape kvroute's sidecar reports
//     (Candidate.Waiting), every 100 ms, not llm-d's 50 ms.
//   - Choice.Source is the candidate's ID; the picker turns it into the
//     engine's P2P address and kv_transfer_params.remote_kv_source (the
//     routing sidecar's header upstream). An inbound source is never
//     read here: the decision starts with none.
//   - There is no prefill/decode split: the computing endpoint is the
//     chosen one.

// SourceThreshold is an arm whose source rule has a threshold a run may
// set (the llm-d arms: their p2p-source-producer's minCachedTokenDelta),
// so a run can hold the arm at the upstream value or at the crossover
// measured on its engines (CalibratedMinCachedTokenDelta).
type SourceThreshold interface {
	MinCachedTokenDelta() int
	SetMinCachedTokenDelta(tokens int) error
}

var (
	_ SourceThreshold = (*LLMDPreciseP2PPolicy)(nil)
	_ SourceThreshold = (*LLMDP2PPolicy)(nil)
	_ SourceThreshold = (*LLMDLoadP2PPolicy)(nil)
)

// LLMDPreciseP2PConfig is the llm-d-precise+p2p arm's: llm-d-precise's
// placement and the source rule's threshold.
type LLMDPreciseP2PConfig struct {
	Placement LLMDPreciseConfig
	Source    P2PSourceConfig
}

// DefaultLLMDPreciseP2PConfig is today's llm-d-precise placement with the
// p2p guide's minCachedTokenDelta, 2048 (epp-*-p2p.yaml).
func DefaultLLMDPreciseP2PConfig() LLMDPreciseP2PConfig {
	return LLMDPreciseP2PConfig{Placement: DefaultLLMDPreciseConfig(), Source: P2PSourceConfig{MinCachedTokenDelta: 2048}}
}

// Validate reports the placement's and the threshold's problems.
func (c LLMDPreciseP2PConfig) Validate() error {
	return armConfigError(LLMDPreciseP2P, c.Placement.Validate(), c.Source.Validate())
}

// LLMDPreciseP2PPolicy is llm-d-precise+p2p (llm-d/llm-d
// guides/p2p-kv-cache-sharing): LLMDPrecisePolicy's placement, unchanged,
// then llm-d's p2p-source-producer over the same precise per-tier data,
// threshold 2048 tokens.
//
//   - Before placement, each healthy candidate's source count is its
//     CPU-tier run in Candidate.Matched (tokens: blocks × the engines'
//     block size), its local count its longest run on any tier (P2PPerTier);
//     P2PSample draws the source among those within one block of the best.
//   - After placement, the source is named iff it is not the chosen
//     endpoint and holds at least MinCachedTokenDelta more tokens than the
//     chosen one holds on any tier (P2PSourceConfig.Name).
//
// Substitutions, beyond the placement's (LLMDPrecisePolicy) and those
// common to the arms (above): the guide's own arm file
// (epp-affinity-p2p.yaml) places with the older blend (prefix 3, queue 2,
// KV 2, no-hit-lru 2) and speculative indexing; this arm keeps today's
// llm-d-precise so that the source rule is the only change. The "one
// block" is the engines' block size (Request.BlockSize; the guide's
// producer uses 64).
type LLMDPreciseP2PPolicy struct {
	*LLMDPrecisePolicy
	p2pRule
}

// NewLLMDPreciseP2P returns the arm, or c's problems.
func NewLLMDPreciseP2P(c LLMDPreciseP2PConfig) (*LLMDPreciseP2PPolicy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	base, err := NewLLMDPrecise(c.Placement)
	if err != nil {
		return nil, err
	}
	return &LLMDPreciseP2PPolicy{LLMDPrecisePolicy: base, p2pRule: p2pRule{c.Source}}, nil
}

// Name is LLMDPreciseP2P.
func (p *LLMDPreciseP2PPolicy) Name() string { return LLMDPreciseP2P }

// Pick places as llm-d-precise does and names the source.
func (p *LLMDPreciseP2PPolicy) Pick(req *Request, cands []Candidate, rnd uint64, now time.Time) Choice {
	eps := P2PPerTier(cands, req.BlockSize)
	ch := p.LLMDPrecisePolicy.Pick(req, cands, rnd, now)
	p.name(req.ID, eps, cands, &ch)
	return ch
}

// LLMDP2PConfig is the llm-d+p2p arm's: llm-d's sticky-until-saturated
// placement and the source rule's threshold.
type LLMDP2PConfig struct {
	Placement LLMDConfig
	Source    P2PSourceConfig
}

// DefaultLLMDP2PConfig is llm-d's default profile (DefaultLLMDConfig)
// with minCachedTokenDelta 1, the remaining-work-routing runs' value
// (benchmark-results/remaining-work-routing/RESULTS.md) and the
// producer's default.
func DefaultLLMDP2PConfig() LLMDP2PConfig {
	return LLMDP2PConfig{Placement: DefaultLLMDConfig(), Source: DefaultP2PSourceConfig()}
}

// Validate reports the placement's and the threshold's problems.
func (c LLMDP2PConfig) Validate() error {
	return armConfigError(LLMDP2P, c.Placement.Validate(), c.Source.Validate())
}

// LLMDP2PPolicy is llm-d+p2p: LLMDPolicy's placement (sticky until
// saturated), unchanged, then llm-d's p2p-source-producer over the
// placement's own approximate prefix model, which has no tiers, at
// threshold 1.
//
//   - Before placement, each healthy candidate's count, as a source and
//     as the computing endpoint alike, is M × B: M its matched blocks in
//     the approximate model (the walk the affinity filter uses), B that
//     model's block size (the engines', raised to at least 64); the last,
//     partial block counts in full, as the model counts it (P2PTierless).
//     P2PSample draws the source among those within one block of the best.
//   - After placement, the source is named iff it is not the chosen
//     endpoint and its count exceeds the chosen one's by at least
//     MinCachedTokenDelta.
//
// The model sees only routing decisions, not the engines' CPU tiers, so
// it can name a source that no longer holds the blocks (evicted, or never
// offloaded): that pull misses and the engine recomputes — a wrong-source
// pull, faithful to upstream. The load gate is LLMDPolicy's (SetLoadGate),
// so the lab's calibrated llm-d runs this arm too.
//
// Substitutions: the placement's (LLMDPolicy) and those common to the
// arms (above). llm-d's GLM runs used the affinity filter over the
// precise index with delta 12,288; that variant is not this arm.
type LLMDP2PPolicy struct {
	*LLMDPolicy
	p2pRule
}

// NewLLMDP2P returns the arm, or c's problems.
func NewLLMDP2P(c LLMDP2PConfig) (*LLMDP2PPolicy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	base, err := NewLLMD(c.Placement)
	if err != nil {
		return nil, err
	}
	return &LLMDP2PPolicy{LLMDPolicy: base, p2pRule: p2pRule{c.Source}}, nil
}

// Name is LLMDP2P.
func (p *LLMDP2PPolicy) Name() string { return LLMDP2P }

// Pick places as llm-d does and names the source from the same model.
func (p *LLMDP2PPolicy) Pick(req *Request, cands []Candidate, rnd uint64, _ time.Time) Choice {
	ch, pr, matched := p.LLMDPolicy.pick(req, cands, rnd)
	p.name(req.ID, P2PTierless(cands, matched, pr.blockSize), cands, &ch)
	return ch
}

// LLMDLoadConfig is llm-d's load-balanced profile (the p2p guide's
// epp-load.yaml): the scorers' weights.
type LLMDLoadConfig struct {
	// QueueWeight and KVUtilizationWeight are queue-scorer's (3) and
	// kv-cache-utilization-scorer's (2).
	QueueWeight, KVUtilizationWeight float64
}

// DefaultLLMDLoadConfig is epp-load.yaml's weights.
func DefaultLLMDLoadConfig() LLMDLoadConfig {
	return LLMDLoadConfig{QueueWeight: 3, KVUtilizationWeight: 2}
}

// Validate reports every weight out of range.
func (c LLMDLoadConfig) Validate() error {
	err := errors.Join(
		llmdInRange("QueueWeight", c.QueueWeight, 0, math.MaxFloat64),
		llmdInRange("KVUtilizationWeight", c.KVUtilizationWeight, 0, math.MaxFloat64),
	)
	if !(c.QueueWeight+c.KVUtilizationWeight > 0) {
		err = errors.Join(err, errors.New("every scorer's weight is 0"))
	}
	return llmdConfigError(LLMDLoad, err)
}

// LLMDLoadPolicy is llm-d-load, the recompute control of llm-d-load+p2p
// (llm-d/llm-d guides/p2p-kv-cache-sharing/benchmarking/epp-load.yaml):
// total = 3·queue + 2·(1 − KV usage) over the healthy candidates, no
// prefix scorer, and the weighted-random picker.
//
//   - queue = (q_max − q)/(q_max − q_min) over the healthy candidates'
//     waiting requests, 1 for all when they are equal (queue-scorer); KV
//     usage is vllm:kv_cache_usage_perc (kv-cache-utilization-scorer);
//     each score is clamped to [0, 1] before it is weighted — the same
//     scorers as LLMDPrecisePolicy's.
//   - Weighted-random picker (A-Res): each candidate whose total is above
//     0 gets the key U^(1/total), U uniform on (0, 1) (a draw of 0 taken
//     as 1e-10, as upstream), and the largest key wins, so P ∝ total; a
//     candidate scoring 0 never wins unless all do, and then the pick is
//     uniform.
//
// Choice.Scores holds each candidate's total, higher better; 0 for
// unhealthy ones. Reason is "load" ("none_healthy" when nothing is
// healthy). The policy keeps no state.
//
// Substitutions: waiting and KV usage are as last scraped by kvroute
// (every 100 ms, not 50); the draws come from Rand seeded with Pick's
// rnd, one per candidate with a positive total in candidate order (the
// uniform fallback one more), where upstream draws from a shared source;
// a key that underflows to 0 still beats a zero total (upstream's sort
// leaves such ties unordered).
type LLMDLoadPolicy struct {
	cfg  LLMDLoadConfig
	last Ticket
}

// NewLLMDLoad returns the policy, or c's problems.
func NewLLMDLoad(c LLMDLoadConfig) (*LLMDLoadPolicy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &LLMDLoadPolicy{cfg: c}, nil
}

// Name is LLMDLoad.
func (p *LLMDLoadPolicy) Name() string { return LLMDLoad }

// Pick scores the healthy candidates and draws one, P ∝ score.
func (p *LLMDLoadPolicy) Pick(_ *Request, cands []Candidate, rnd uint64, _ time.Time) Choice {
	ch := Choice{Index: -1, Reason: llmdReasonNoneHealthy, Scores: make([]float64, len(cands))}
	healthy := llmdHealthy(cands)
	if len(healthy) == 0 {
		return ch
	}
	queue := llmdQueueScores(cands, healthy)
	for k, i := range healthy {
		ch.Scores[i] = p.cfg.QueueWeight*llmdClamp(queue[k]) + p.cfg.KVUtilizationWeight*llmdClamp(1-cands[i].KVUsage)
	}
	ch.Index, ch.Reason = llmdWeightedRandom(healthy, ch.Scores, NewRand(rnd)), llmdReasonLoad
	return ch
}

// Dispatched books nothing: the policy keeps no state.
func (p *LLMDLoadPolicy) Dispatched(*Request, string, time.Time) Ticket {
	p.last++
	return p.last
}

// FirstChunk does nothing.
func (p *LLMDLoadPolicy) FirstChunk(Ticket, time.Time) {}

// FirstToken does nothing.
func (p *LLMDLoadPolicy) FirstToken(Ticket, time.Time) {}

// Done does nothing.
func (p *LLMDLoadPolicy) Done(Ticket, time.Time) {}

// Forget does nothing.
func (p *LLMDLoadPolicy) Forget(string) {}

// llmdWeightedRandom is the weighted-random picker over set: the
// largest key U^(1/score) among the positive scores; uniform over set
// when none is positive.
func llmdWeightedRandom(set []int, scores []float64, r *Rand) int {
	best, bestKey := -1, -1.0
	for _, i := range set {
		if !(scores[i] > 0) {
			continue
		}
		u := llmdFloat(r)
		if u == 0 {
			u = 1e-10
		}
		if key := math.Pow(u, 1/scores[i]); key > bestKey {
			best, bestKey = i, key
		}
	}
	if best < 0 {
		return set[r.IntN(len(set))]
	}
	return best
}

// LLMDLoadP2PConfig is the llm-d-load+p2p arm's: llm-d-load's placement
// and the source rule's threshold.
type LLMDLoadP2PConfig struct {
	Placement LLMDLoadConfig
	Source    P2PSourceConfig
}

// DefaultLLMDLoadP2PConfig is epp-load-p2p.yaml's: epp-load.yaml's
// weights, minCachedTokenDelta 2048.
func DefaultLLMDLoadP2PConfig() LLMDLoadP2PConfig {
	return LLMDLoadP2PConfig{Placement: DefaultLLMDLoadConfig(), Source: P2PSourceConfig{MinCachedTokenDelta: 2048}}
}

// Validate reports the placement's and the threshold's problems.
func (c LLMDLoadP2PConfig) Validate() error {
	return armConfigError(LLMDLoadP2P, c.Placement.Validate(), c.Source.Validate())
}

// LLMDLoadP2PPolicy is llm-d-load+p2p (epp-load-p2p.yaml): LLMDLoadPolicy's
// placement, unchanged, then llm-d's p2p-source-producer over the precise
// per-tier data (Candidate.Matched), which feeds only the source rule,
// threshold 2048 tokens — as LLMDPreciseP2PPolicy's rule, whose doc says
// how the counts are taken. Substitutions: the placement's and those
// common to the arms (above); the "one block" is the engines' block size
// (the guide's producer uses 64).
type LLMDLoadP2PPolicy struct {
	*LLMDLoadPolicy
	p2pRule
}

// NewLLMDLoadP2P returns the arm, or c's problems.
func NewLLMDLoadP2P(c LLMDLoadP2PConfig) (*LLMDLoadP2PPolicy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	base, err := NewLLMDLoad(c.Placement)
	if err != nil {
		return nil, err
	}
	return &LLMDLoadP2PPolicy{LLMDLoadPolicy: base, p2pRule: p2pRule{c.Source}}, nil
}

// Name is LLMDLoadP2P.
func (p *LLMDLoadP2PPolicy) Name() string { return LLMDLoadP2P }

// Pick places as llm-d-load does and names the source.
func (p *LLMDLoadP2PPolicy) Pick(req *Request, cands []Candidate, rnd uint64, now time.Time) Choice {
	eps := P2PPerTier(cands, req.BlockSize)
	ch := p.LLMDLoadPolicy.Pick(req, cands, rnd, now)
	p.name(req.ID, eps, cands, &ch)
	return ch
}

// DynamoHintConfig is the dynamo+hint arm's: Dynamo's placement (the hint
// has no threshold).
type DynamoHintConfig struct {
	Placement DynamoConfig
}

// DefaultDynamoHintConfig is Dynamo's default cost (DefaultDynamoConfig).
func DefaultDynamoHintConfig() DynamoHintConfig {
	return DynamoHintConfig{Placement: DefaultDynamoConfig()}
}

// Validate reports the placement's problems.
func (c DynamoHintConfig) Validate() error { return armConfigError(DynamoHint, c.Placement.Validate()) }

// dynamoHintStream is XORed into Pick's rnd to seed the hint's tie-break,
// so its draws do not repeat the placement's (which start from rnd).
const dynamoHintStream = 0x68696e74 // "hint"

// DynamoHintPolicy is dynamo+hint: DynamoPolicy's placement, unchanged
// (its cost gives no credit for a pullable prefix), then Dynamo's KV hint
// (DEP ai-dynamo/dynamo#14780; PRs #11695, #13134): among the healthy
// candidates other than the chosen one, the one whose prefix is longest
// and longer than the chosen one's own is named, with no threshold; ties
// are broken uniformly at random (reservoir sampling over candidate
// order).
//
// Substitutions [inference, peer-policies.md §4]: a candidate's prefix as
// a source is its CPU-tier run in Candidate.Matched (the only tier vLLM's
// P2P tier serves), where Dynamo's radix index counts every tier; the
// target's own prefix is its longest run on any tier. Every healthy
// candidate counts as advertising the capability (the engines run the P2P
// tier). The hint travels as Choice.Source, which the picker turns into
// remote_kv_source, in place of kv_hint's kv.fetch action. The tie-break
// draws from Rand seeded with Pick's rnd XOR a constant, apart from the
// placement's draws.
type DynamoHintPolicy struct {
	*DynamoPolicy
}

// NewDynamoHint returns the arm, or c's problems.
func NewDynamoHint(c DynamoHintConfig) (*DynamoHintPolicy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	base, err := NewDynamo(c.Placement)
	if err != nil {
		return nil, err
	}
	return &DynamoHintPolicy{DynamoPolicy: base}, nil
}

// Name is DynamoHint.
func (p *DynamoHintPolicy) Name() string { return DynamoHint }

// Pick places as Dynamo does and attaches the hint.
func (p *DynamoHintPolicy) Pick(req *Request, cands []Candidate, rnd uint64, now time.Time) Choice {
	ch := p.DynamoPolicy.Pick(req, cands, rnd, now)
	if ch.Index >= 0 {
		ch.Source = dynamoHintSource(cands, ch.Index, NewRand(rnd^dynamoHintStream))
	}
	return ch
}

// dynamoHintSource is the healthy candidate other than target with the
// longest CPU-tier run, if it is longer than target's longest run on any
// tier; ties drawn uniformly from r. "" for none.
func dynamoHintSource(cands []Candidate, target int, r *Rand) string {
	own := 0
	for _, t := range tier.All() {
		own = max(own, cands[target].Matched[t])
	}
	best, ties := -1, 0
	for i, c := range cands {
		n := c.Matched[tier.CPU]
		switch {
		case i == target || !c.Healthy || n <= own:
		case best < 0 || n > cands[best].Matched[tier.CPU]:
			best, ties = i, 1
		case n == cands[best].Matched[tier.CPU]:
			ties++
			if r.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 {
		return ""
	}
	return cands[best].ID
}

// armConfigError names the arm whose configuration errs are about.
func armConfigError(arm string, errs ...error) error {
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s config: %w", arm, err)
	}
	return nil
}
