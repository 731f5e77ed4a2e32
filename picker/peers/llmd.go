package peers

import (
	"cmp"
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/internal/tier"
)

// The reasons llm-d's policies give (Choice.Reason).
const (
	llmdReasonSticky      = "sticky"       // the affinity filter kept the sticky endpoints
	llmdReasonGateBroken  = "gate_broken"  // sticky, but the load gate opened the set to all
	llmdReasonNoSticky    = "no_sticky"    // nobody sticky, or the filter is off (threshold 0)
	llmdReasonSingle      = "single"       // one healthy candidate
	llmdReasonExplore     = "explore"      // the exploration draw opened the set to all
	llmdReasonNoneHealthy = "none_healthy" // nothing to choose
	llmdReasonPrefix      = "prefix"       // precise: the chosen endpoint holds some of the prompt
	llmdReasonLoad        = "load"         // precise: it holds none; the load scorers decided (llm-d-load: always)
)

// LLMDConfig tunes the "sticky until saturated" profile. Start from
// DefaultLLMDConfig: a zero field is invalid where zero has no meaning,
// and Validate says which.
type LLMDConfig struct {
	// AffinityThreshold is the hit ratio M/T from which an endpoint is
	// sticky (0.80). 0 turns the filter off: every healthy candidate
	// is scored.
	AffinityThreshold float64
	// ExplorationProbability is the chance that a pick ignores
	// stickiness (0).
	ExplorationProbability float64
	// MaxTTFTPenaltyMs is how much longer, in estimated TTFT, the least
	// loaded sticky endpoint may be than the least loaded other one
	// before stickiness breaks (18000). 0: it never breaks.
	MaxTTFTPenaltyMs float64
	// PeakPrefillThroughput is the tokens per second that turn in-flight
	// tokens into an estimated TTFT (15928).
	PeakPrefillThroughput float64
	// TokenLoadWeight is the token-load scorer's weight (1).
	TokenLoadWeight float64
	// TokenLoadCap is the in-flight plus uncached tokens at which the
	// token-load score reaches 0 (4,194,304).
	TokenLoadCap float64
	// DefaultBlockSize is the block size when the engines' is unknown
	// (16); MinBlockSize is the least block size hashed (64).
	DefaultBlockSize, MinBlockSize int
	// MaxPrefixTokens bounds the hashed prefix: at most MaxPrefixTokens/B
	// blocks (the guide's 40960; the plugin's own default is 131072).
	MaxPrefixTokens int
	// LRUCapacity is an endpoint's modelled cache size in blocks when it
	// has not reported its KV cache size (31,250).
	LRUCapacity int
}

// DefaultLLMDConfig is llm-d's default profile as its guide configures
// it (optimized-baseline): the plugins' defaults, but for the approximate
// producer's maxPrefixTokensToMatch, 40960 (the plugin's is 131072). The
// guide's filter values are those of the earlier token-form interface
// (maxTokensInFlightPenalty 286720, maxTTFTPenaltyMs 0); the time form's
// defaults, kept here, give the same τ = 15928 tok/s × 18 s to within 16
// tokens (copying maxTTFTPenaltyMs 0 alone would never break stickiness).
func DefaultLLMDConfig() LLMDConfig {
	return LLMDConfig{
		AffinityThreshold:      0.80,
		ExplorationProbability: 0,
		MaxTTFTPenaltyMs:       18000,
		PeakPrefillThroughput:  15928,
		TokenLoadWeight:        1,
		TokenLoadCap:           4194304,
		DefaultBlockSize:       16,
		MinBlockSize:           64,
		MaxPrefixTokens:        40960,
		LRUCapacity:            31250,
	}
}

// Validate reports every field out of range.
func (c LLMDConfig) Validate() error {
	err := errors.Join(
		llmdInRange("AffinityThreshold", c.AffinityThreshold, 0, 1),
		llmdInRange("ExplorationProbability", c.ExplorationProbability, 0, 1),
		llmdInRange("MaxTTFTPenaltyMs", c.MaxTTFTPenaltyMs, 0, math.MaxFloat64),
		llmdPositive("PeakPrefillThroughput", c.PeakPrefillThroughput),
		llmdPositive("TokenLoadWeight", c.TokenLoadWeight),
		llmdPositive("TokenLoadCap", c.TokenLoadCap),
		llmdPositiveInt("DefaultBlockSize", c.DefaultBlockSize),
		llmdPositiveInt("MinBlockSize", c.MinBlockSize),
		llmdPositiveInt("LRUCapacity", c.LRUCapacity),
	)
	if c.MaxPrefixTokens < max(c.MinBlockSize, 1) {
		err = errors.Join(err, fmt.Errorf("MaxPrefixTokens %d: want at least MinBlockSize (%d)", c.MaxPrefixTokens, c.MinBlockSize))
	}
	return llmdConfigError(LLMD, err)
}

// LLMDPolicy is llm-d's default scheduling profile since 2026-08,
// "sticky until saturated" (shared/docs/peer-policies.md §1.2): the
// approximate prefix producer and the inflight-load producer feed the
// prefix-cache-affinity filter, then the token-load scorer (weight 1),
// then the max-score picker.
//
//   - Approximate producer: the prompt's tokens are cut into blocks of B
//     tokens, the last partial block included, B being the engines'
//     block size (16 when unknown) raised to at least 64; at most
//     40960/B blocks are hashed (the guide's bound), in a chain seeded
//     with the model and the cache salt. A pick walks the blocks from
//     the first and stops at the first that no endpoint holds; an
//     endpoint's M is how many of the walked blocks it holds, T the
//     blocks hashed, hit = M/T. At Dispatched every block joins the
//     chosen endpoint's LRU, in order, block 0 first (upstream's indexer
//     order), so within one request block 0 ends the least recently used
//     and leaves first.
//   - Inflight-load producer: at Dispatched the chosen endpoint books
//     uncachedReq = max(0, (T−M)·B) + max(0, L−T·B) tokens (L the prompt
//     tokens) and one request. The tokens are released at FirstChunk (the
//     first streamed chunk, whatever it carries: on /v1/responses that is
//     response.created, before prefill, as upstream), or at Done for a
//     request that had none (non-streaming); the request at Done.
//     FirstToken does nothing.
//   - Filter, among the healthy candidates: all of them when there is at
//     most one, when the threshold is 0, or with the exploration
//     probability; else the sticky ones (hit ≥ 0.80), unless there are
//     none (all), or the least loaded sticky one's estimated TTFT
//     (in-flight tokens / 15928 tok/s) exceeds the least loaded other
//     one's by more than 18 s (all: about 286,704 tokens of difference).
//     The peak and the 18 s are per run (SetLoadGate): llm-d calls them
//     hardware constants, to be measured per engine (CalibratedPeak).
//   - Token-load scorer: x = in-flight tokens + uncachedReq, score
//     1 − min(1, x/4,194,304); the picker shuffles the set, stable-sorts
//     it by score, highest first, and takes the top: ties are random.
//
// Choice.Scores holds each candidate's total score (weight × score),
// higher better; 0 for unhealthy and filtered-out candidates.
//
// Substitutions (what kvroute gives in place of llm-d's inputs):
//   - The hash is XXH3-64 (github.com/zeebo/xxh3) where llm-d uses
//     xxhash, and the seed's encoding of model and salt is kvroute's
//     (length-prefixed): blocks are only ever compared for equality, so
//     the behaviour is the same.
//   - Tokens are Request.Tokens; with none, the request has no blocks and
//     L = 0: no affinity, no tokens booked, the load decides.
//   - B is Request.BlockSize, the engines' block size, for autoTune's
//     per-endpoint reported block size; 16 when it is 0.
//   - An endpoint's LRU capacity is the last Candidate.NumGPUBlocks Pick
//     saw for it (autoTune's reported KV block count), else 31,250; it is
//     fixed when the LRU is created, on the endpoint's first Dispatched.
//     The update is synchronous, at Dispatched; upstream's is
//     asynchronous.
//   - Departed endpoints are purged when the caller calls Forget, not by
//     a sweep every 2 minutes.
//   - The first streamed chunk is FirstChunk; end of stream is Done,
//     which also covers failed and abandoned requests.
//   - Only Healthy candidates are filtered and scored (llm-d schedules
//     among its ready pods); the walk still counts every endpoint the
//     model holds, as llm-d's indexer does.
//   - One prompt per request (llm-d hashes each of a request's prompts).
//   - Dispatched recomputes the chosen endpoint's match against the
//     model before adding the blocks, where llm-d keeps the one its
//     scheduling cycle computed: the same figure when, as the picker
//     does, the caller calls Dispatched right after Pick.
//   - Exploration and the shuffle draw from Rand seeded with Pick's rnd;
//     the exploration draw is made only when its probability is above 0.
//   - addEstimatedOutputTokens is not offered: it is off by default.
type LLMDPolicy struct {
	cfg       LLMDConfig
	caches    map[string]*llmdLRU  // the producer's model of each endpoint's cache
	gpuBlocks map[string]int       // the last NumGPUBlocks seen per endpoint
	load      map[string]*llmdLoad // the inflight-load producer's counters
	bookings  map[Ticket]*llmdBooking
	last      Ticket
}

// llmdLoad is an endpoint's in-flight bookings.
type llmdLoad struct{ tokens, requests int }

// llmdBooking is one dispatched request's share of its endpoint's load.
type llmdBooking struct {
	endpoint string
	tokens   int  // its uncached tokens
	released bool // its tokens are released (FirstChunk, or Done)
}

// NewLLMD returns the policy with empty state, or c's problems.
func NewLLMD(c LLMDConfig) (*LLMDPolicy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &LLMDPolicy{
		cfg:       c,
		caches:    map[string]*llmdLRU{},
		gpuBlocks: map[string]int{},
		load:      map[string]*llmdLoad{},
		bookings:  map[Ticket]*llmdBooking{},
	}, nil
}

// Name is LLMD.
func (p *LLMDPolicy) Name() string { return LLMD }

// Pick filters, scores and picks among the healthy candidates.
func (p *LLMDPolicy) Pick(req *Request, cands []Candidate, rnd uint64, _ time.Time) Choice {
	ch, _, _ := p.pick(req, cands, rnd)
	return ch
}

// pick is Pick, with the prompt as the approximate producer cut it and
// each endpoint's match in its model (what the arm with KV pulls reads;
// nil when no candidate is healthy).
func (p *LLMDPolicy) pick(req *Request, cands []Candidate, rnd uint64) (Choice, llmdPrompt, map[string]int) {
	p.remember(cands)
	ch := Choice{Index: -1, Reason: llmdReasonNoneHealthy, Scores: make([]float64, len(cands))}
	healthy := llmdHealthy(cands)
	if len(healthy) == 0 {
		return ch, llmdPrompt{}, nil
	}
	pr := p.cfg.prompt(req)
	matched := p.matches(pr.hashes)
	r := NewRand(rnd)
	set, reason := p.filter(healthy, cands, pr, matched, r)
	for _, i := range set {
		ch.Scores[i] = p.score(cands[i].ID, pr.uncached(matched[cands[i].ID]))
	}
	ch.Index, ch.Reason = llmdMaxScore(set, ch.Scores, r), reason
	return ch, pr, matched
}

// remember keeps each candidate's reported KV cache size, for the
// capacity of an LRU created later.
func (p *LLMDPolicy) remember(cands []Candidate) {
	for _, c := range cands {
		if c.NumGPUBlocks > 0 {
			p.gpuBlocks[c.ID] = c.NumGPUBlocks
		}
	}
}

// filter is the prefix-cache-affinity filter: the candidates to score,
// and why.
func (p *LLMDPolicy) filter(healthy []int, cands []Candidate, pr llmdPrompt, matched map[string]int, r *Rand) ([]int, string) {
	c := p.cfg
	switch {
	case len(healthy) <= 1:
		return healthy, llmdReasonSingle
	case c.AffinityThreshold <= 0:
		return healthy, llmdReasonNoSticky
	case c.ExplorationProbability > 0 && llmdFloat(r) < c.ExplorationProbability:
		return healthy, llmdReasonExplore
	}
	var sticky, rest []int
	for _, i := range healthy {
		if pr.hit(matched[cands[i].ID]) >= c.AffinityThreshold {
			sticky = append(sticky, i)
		} else {
			rest = append(rest, i)
		}
	}
	if len(sticky) == 0 {
		return healthy, llmdReasonNoSticky
	}
	if c.MaxTTFTPenaltyMs > 0 && len(rest) > 0 && p.minTTFT(sticky, cands)-p.minTTFT(rest, cands) > c.MaxTTFTPenaltyMs {
		return healthy, llmdReasonGateBroken
	}
	return sticky, llmdReasonSticky
}

// minTTFT is the least estimated TTFT, in ms, among set: its in-flight
// tokens at the peak prefill throughput.
func (p *LLMDPolicy) minTTFT(set []int, cands []Candidate) float64 {
	least := math.Inf(1)
	for _, i := range set {
		least = min(least, float64(p.inflightTokens(cands[i].ID))/p.cfg.PeakPrefillThroughput*1000)
	}
	return least
}

// score is the token-load scorer's weighted score for an endpoint that
// would take uncached more tokens.
func (p *LLMDPolicy) score(endpoint string, uncached int) float64 {
	x := float64(p.inflightTokens(endpoint) + uncached)
	return p.cfg.TokenLoadWeight * llmdClamp(1-min(1, x/p.cfg.TokenLoadCap))
}

// InflightTokens is the endpoint's booked tokens not yet released: the
// inflight-load producer's token counter.
func (p *LLMDPolicy) InflightTokens(endpoint string) int { return p.inflightTokens(endpoint) }

// SetLoadGate sets the affinity filter's load gate for the rest of the
// run: the peak prefill throughput (tokens/s) that turns in-flight tokens
// into an estimated TTFT, and the TTFT penalty (ms) past which stickiness
// breaks (0: never), τ = peak × penalty. The state is kept; an invalid
// value changes nothing.
func (p *LLMDPolicy) SetLoadGate(peakPrefillThroughput, maxTTFTPenaltyMs float64) error {
	c := p.cfg
	c.PeakPrefillThroughput, c.MaxTTFTPenaltyMs = peakPrefillThroughput, maxTTFTPenaltyMs
	if err := c.Validate(); err != nil {
		return err
	}
	p.cfg = c
	return nil
}

// LoadGate is the affinity filter's load gate as set: the peak prefill
// throughput (tokens/s) and the TTFT penalty (ms).
func (p *LLMDPolicy) LoadGate() (peakPrefillThroughput, maxTTFTPenaltyMs float64) {
	return p.cfg.PeakPrefillThroughput, p.cfg.MaxTTFTPenaltyMs
}

// inflightTokens is the endpoint's booked tokens not yet released.
func (p *LLMDPolicy) inflightTokens(endpoint string) int {
	if l, ok := p.load[endpoint]; ok {
		return l.tokens
	}
	return 0
}

// Dispatched adds the request's blocks to the endpoint's LRU and books
// its uncached tokens and one request there.
func (p *LLMDPolicy) Dispatched(req *Request, endpoint string, _ time.Time) Ticket {
	pr := p.cfg.prompt(req)
	tokens := pr.uncached(p.matches(pr.hashes)[endpoint]) // the match the pick saw
	p.cache(endpoint).addAll(pr.hashes)
	l := p.load[endpoint]
	if l == nil {
		l = &llmdLoad{}
		p.load[endpoint] = l
	}
	l.tokens += tokens
	l.requests++
	p.last++
	p.bookings[p.last] = &llmdBooking{endpoint: endpoint, tokens: tokens}
	return p.last
}

// cache is the endpoint's LRU, created at its capacity when new.
func (p *LLMDPolicy) cache(endpoint string) *llmdLRU {
	if l, ok := p.caches[endpoint]; ok {
		return l
	}
	capacity := p.cfg.LRUCapacity
	if n := p.gpuBlocks[endpoint]; n > 0 {
		capacity = n
	}
	l := newLLMDLRU(capacity)
	p.caches[endpoint] = l
	return l
}

// FirstChunk releases the booking's tokens: the first streamed chunk
// came (as the producer counts it, prefill done, whatever the chunk).
func (p *LLMDPolicy) FirstChunk(t Ticket, _ time.Time) {
	if b, ok := p.bookings[t]; ok {
		p.release(b)
	}
}

// FirstToken does nothing: llm-d's producer listens to the first chunk.
func (p *LLMDPolicy) FirstToken(Ticket, time.Time) {}

// Done releases the booking's tokens, if FirstChunk did not, and its
// request.
func (p *LLMDPolicy) Done(t Ticket, _ time.Time) {
	b, ok := p.bookings[t]
	if !ok {
		return
	}
	p.release(b)
	if l, ok := p.load[b.endpoint]; ok {
		l.requests--
	}
	delete(p.bookings, t)
}

// release gives back a booking's tokens, once.
func (p *LLMDPolicy) release(b *llmdBooking) {
	if b.released {
		return
	}
	b.released = true
	if l, ok := p.load[b.endpoint]; ok {
		l.tokens -= b.tokens
	}
}

// Forget drops the endpoint's LRU, its reported size, its counters and
// its bookings (whose FirstChunk and Done then do nothing).
func (p *LLMDPolicy) Forget(endpoint string) {
	delete(p.caches, endpoint)
	delete(p.gpuBlocks, endpoint)
	delete(p.load, endpoint)
	for t, b := range p.bookings {
		if b.endpoint == endpoint {
			delete(p.bookings, t)
		}
	}
}

// matches walks the blocks from the first and stops at the first that no
// endpoint holds: each endpoint's count of the walked blocks it holds.
func (p *LLMDPolicy) matches(hashes []uint64) map[string]int {
	m := map[string]int{}
	for _, h := range hashes {
		held := false
		for id, l := range p.caches {
			if l.has(h) {
				m[id]++
				held = true
			}
		}
		if !held {
			break
		}
	}
	return m
}

// llmdPrompt is a request as the approximate producer sees it.
type llmdPrompt struct {
	hashes    []uint64 // the chained block hashes: T = len(hashes)
	blockSize int      // B
	tokens    int      // L
}

// prompt cuts the request's tokens into blocks and hashes them.
func (c LLMDConfig) prompt(req *Request) llmdPrompt {
	b := req.BlockSize
	if b <= 0 {
		b = c.DefaultBlockSize
	}
	b = max(b, c.MinBlockSize)
	return llmdPrompt{hashes: llmdHashes(req, b, c.MaxPrefixTokens/b), blockSize: b, tokens: req.PromptTokens()}
}

// hit is M/T, 0 when there are no blocks.
func (pr llmdPrompt) hit(m int) float64 {
	if len(pr.hashes) == 0 {
		return 0
	}
	return float64(m) / float64(len(pr.hashes))
}

// uncached is the inflight-load producer's estimate of the tokens an
// endpoint holding m blocks must prefill: the missing blocks in full,
// and the tokens beyond the hashed blocks.
func (pr llmdPrompt) uncached(m int) int {
	t, b := len(pr.hashes), pr.blockSize
	return max(0, (t-m)*b) + max(0, pr.tokens-t*b)
}

// llmdHashes is the chain of the request's block hashes, blocks of b
// tokens, the last partial block included, at most limit of them: block
// 0 chains from a seed of the model and cache salt, block i from block
// i−1's hash.
func llmdHashes(req *Request, b, limit int) []uint64 {
	n := min((len(req.Tokens)+b-1)/b, limit)
	hashes := make([]uint64, n)
	prev := llmdSeed(req.Model, req.CacheSalt)
	buf := make([]byte, 8+4*b)
	for i := range n {
		block := req.Tokens[i*b : min((i+1)*b, len(req.Tokens))]
		binary.LittleEndian.PutUint64(buf, prev)
		for j, tok := range block {
			binary.LittleEndian.PutUint32(buf[8+4*j:], tok)
		}
		prev = xxh3.Hash(buf[:8+4*len(block)])
		hashes[i] = prev
	}
	return hashes
}

// llmdSeed hashes the model and the cache salt, each length-prefixed so
// that no two pairs share an encoding.
func llmdSeed(model, salt string) uint64 {
	buf := make([]byte, 0, 16+len(model)+len(salt))
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(model)))
	buf = append(buf, model...)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(salt)))
	buf = append(buf, salt...)
	return xxh3.Hash(buf)
}

// llmdLRU is the approximate producer's model of one endpoint's cache: a
// set of block hashes of bounded size, the least recently added evicted.
type llmdLRU struct {
	capacity int
	order    *list.List // of uint64, the most recent first
	at       map[uint64]*list.Element
}

func newLLMDLRU(capacity int) *llmdLRU {
	return &llmdLRU{capacity: capacity, order: list.New(), at: map[uint64]*list.Element{}}
}

// has reports whether h is held (a look-up does not refresh it).
func (l *llmdLRU) has(h uint64) bool {
	_, ok := l.at[h]
	return ok
}

// addAll adds a request's blocks in order, block 0 first, as upstream's
// indexer does: within the request, block 0 ends the least recent, the
// last block the most recent.
func (l *llmdLRU) addAll(hashes []uint64) {
	for _, h := range hashes {
		l.add(h)
	}
}

// add makes h the most recent, evicting the least recent at capacity.
func (l *llmdLRU) add(h uint64) {
	if e, ok := l.at[h]; ok {
		l.order.MoveToFront(e)
		return
	}
	l.at[h] = l.order.PushFront(h)
	if l.order.Len() > l.capacity {
		oldest := l.order.Back()
		l.order.Remove(oldest)
		delete(l.at, oldest.Value.(uint64))
	}
}

// LLMDPreciseConfig tunes the precise-prefix-cache profile. Start from
// DefaultLLMDPreciseConfig; Validate says what is wrong.
type LLMDPreciseConfig struct {
	// The scorers' weights: precise-prefix-cache-scorer (2),
	// kv-cache-utilization-scorer (1), queue-scorer (1).
	PrefixWeight, KVUtilizationWeight, QueueWeight float64
	// GPUWeight and CPUWeight are what a matched block adds on each tier
	// (1.0, 0.8).
	GPUWeight, CPUWeight float64
	// DefaultBlockSize is the block size when the engines' is unknown
	// (16, llm-d's token processor default).
	DefaultBlockSize int
}

// DefaultLLMDPreciseConfig is the current precise well-lit path's.
func DefaultLLMDPreciseConfig() LLMDPreciseConfig {
	return LLMDPreciseConfig{
		PrefixWeight:        2,
		KVUtilizationWeight: 1,
		QueueWeight:         1,
		GPUWeight:           1.0,
		CPUWeight:           0.8,
		DefaultBlockSize:    16,
	}
}

// Validate reports every field out of range.
func (c LLMDPreciseConfig) Validate() error {
	err := errors.Join(
		llmdInRange("PrefixWeight", c.PrefixWeight, 0, math.MaxFloat64),
		llmdInRange("KVUtilizationWeight", c.KVUtilizationWeight, 0, math.MaxFloat64),
		llmdInRange("QueueWeight", c.QueueWeight, 0, math.MaxFloat64),
		llmdPositive("GPUWeight", c.GPUWeight),
		llmdInRange("CPUWeight", c.CPUWeight, 0, math.MaxFloat64),
		llmdPositiveInt("DefaultBlockSize", c.DefaultBlockSize),
	)
	if !(c.PrefixWeight+c.KVUtilizationWeight+c.QueueWeight > 0) {
		err = errors.Join(err, errors.New("every scorer's weight is 0"))
	}
	return llmdConfigError(LLMDPrecise, err)
}

// LLMDPrecisePolicy is llm-d's precise-prefix-cache well-lit path as its
// current guide configures it (shared/docs/peer-policies.md §1.1):
// total = 2·prefix + 1·(1 − KV usage) + 1·queue over the healthy
// candidates, and the max-score picker (random ties).
//
//   - prefix = M/T: M = int(the weighted sum of the leading blocks the
//     endpoint holds, a GPU block adding 1.0 and a CPU block 0.8),
//     truncated; T the prompt's full blocks; 0 when T = 0.
//   - queue = (q_max − q)/(q_max − q_min) over the healthy candidates'
//     waiting requests; 1 for all when they are equal.
//   - Each score is clamped to [0, 1] before it is weighted.
//
// Choice.Scores holds each candidate's total, higher better; 0 for
// unhealthy ones. Choice.Reason is "prefix" when the chosen endpoint
// holds some of the prompt, "load" when it holds none (the load scorers
// decided), "none_healthy" when nothing is healthy.
//
// The policy keeps no state of its own: like llm-d's precise producer
// (speculative indexing off, its default) it learns only from the
// engines' KV events, here kvroute's fleet index.
//
// Substitutions:
//   - The index is kvroute's fleet index built from the engines' KV
//     events, as Candidate.Matched, in place of llm-d-kv-cache's own.
//     Matched gives each tier's leading run separately, so the weighted
//     run is taken as the GPU run at 1.0, then the CPU run's blocks past
//     it at 0.8: M = int(Matched[GPU]·1.0 + max(0, Matched[CPU] −
//     Matched[GPU])·0.8), summed block by block as llm-d does. The
//     storage tier, which llm-d's weights do not name, is ignored.
//   - B is the engines' block size (Request.BlockSize; 16 when unknown),
//     the size of the blocks their KV events name, where the guide
//     configures 64.
//   - T counts full blocks only, floor(L/B), as llm-d's token processor
//     does (it makes no partial block); with no tokens, T is the number
//     of Request.Keys.
//   - decode-filter is a no-op here: kvroute's fleet has no
//     prefill/decode disaggregation.
//   - Waiting and KV usage are as last scraped by kvroute, not every
//     50 ms.
//   - Ties draw from Rand seeded with Pick's rnd.
type LLMDPrecisePolicy struct {
	cfg  LLMDPreciseConfig
	last Ticket
}

// NewLLMDPrecise returns the policy, or c's problems.
func NewLLMDPrecise(c LLMDPreciseConfig) (*LLMDPrecisePolicy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &LLMDPrecisePolicy{cfg: c}, nil
}

// Name is LLMDPrecise.
func (p *LLMDPrecisePolicy) Name() string { return LLMDPrecise }

// Pick scores the healthy candidates and picks the highest.
func (p *LLMDPrecisePolicy) Pick(req *Request, cands []Candidate, rnd uint64, _ time.Time) Choice {
	ch := Choice{Index: -1, Reason: llmdReasonNoneHealthy, Scores: make([]float64, len(cands))}
	healthy := llmdHealthy(cands)
	if len(healthy) == 0 {
		return ch
	}
	total := p.totalBlocks(req)
	queue := llmdQueueScores(cands, healthy)
	for k, i := range healthy {
		ch.Scores[i] = p.cfg.PrefixWeight*llmdClamp(p.prefix(cands[i].Matched, total)) +
			p.cfg.KVUtilizationWeight*llmdClamp(1-cands[i].KVUsage) +
			p.cfg.QueueWeight*llmdClamp(queue[k])
	}
	ch.Index, ch.Reason = llmdMaxScore(healthy, ch.Scores, NewRand(rnd)), llmdReasonLoad
	if p.prefix(cands[ch.Index].Matched, total) > 0 {
		ch.Reason = llmdReasonPrefix
	}
	return ch
}

// totalBlocks is T: the prompt's full blocks at the engines' block size.
func (p *LLMDPrecisePolicy) totalBlocks(req *Request) int {
	if req.PromptTokens() == 0 {
		return len(req.Keys)
	}
	b := req.BlockSize
	if b <= 0 {
		b = p.cfg.DefaultBlockSize
	}
	return req.PromptTokens() / b
}

// prefix is the precise prefix score M/T of an endpoint holding matched.
func (p *LLMDPrecisePolicy) prefix(matched [tier.Count]int, total int) float64 {
	if total <= 0 {
		return 0
	}
	gpu, cpu := min(matched[tier.GPU], total), min(matched[tier.CPU], total) // a run is at most the prompt
	sum := 0.0
	for range gpu {
		sum += p.cfg.GPUWeight
	}
	for range max(0, cpu-gpu) {
		sum += p.cfg.CPUWeight
	}
	return float64(int(sum)) / float64(total)
}

// llmdQueueScores is the queue scorer over the healthy candidates, in
// healthy's order: min-max of their waiting requests, 1 for all when
// they are equal.
func llmdQueueScores(cands []Candidate, healthy []int) []float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, i := range healthy {
		lo, hi = min(lo, cands[i].Waiting), max(hi, cands[i].Waiting)
	}
	scores := make([]float64, len(healthy))
	for k, i := range healthy {
		scores[k] = 1
		if hi > lo {
			scores[k] = (hi - cands[i].Waiting) / (hi - lo)
		}
	}
	return scores
}

// Dispatched books nothing: the policy learns from KV events only.
func (p *LLMDPrecisePolicy) Dispatched(_ *Request, _ string, _ time.Time) Ticket {
	p.last++
	return p.last
}

// FirstChunk does nothing.
func (p *LLMDPrecisePolicy) FirstChunk(Ticket, time.Time) {}

// FirstToken does nothing.
func (p *LLMDPrecisePolicy) FirstToken(Ticket, time.Time) {}

// Done does nothing.
func (p *LLMDPrecisePolicy) Done(Ticket, time.Time) {}

// Forget does nothing: the policy holds nothing of an endpoint.
func (p *LLMDPrecisePolicy) Forget(string) {}

// llmdHealthy lists the healthy candidates' indices.
func llmdHealthy(cands []Candidate) []int {
	var out []int
	for i, c := range cands {
		if c.Healthy {
			out = append(out, i)
		}
	}
	return out
}

// llmdMaxScore is the max-score picker: it shuffles set, stable-sorts it
// by score, highest first, and returns the top.
func llmdMaxScore(set []int, scores []float64, r *Rand) int {
	order := slices.Clone(set)
	r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(scores[b], scores[a]) })
	return order[0]
}

// llmdFloat draws a value in [0, 1).
func llmdFloat(r *Rand) float64 { return float64(r.Uint64()>>11) / (1 << 53) }

// llmdClamp is clamp(s, 0, 1), NaN counting as 0.
func llmdClamp(s float64) float64 {
	if !(s > 0) {
		return 0
	}
	return min(s, 1)
}

// llmdConfigError names the policy whose configuration err is about.
func llmdConfigError(policy string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s config: %w", policy, err)
}

func llmdInRange(name string, v, lo, hi float64) error {
	if !(v >= lo && v <= hi) {
		return fmt.Errorf("%s %v: want %v to %v", name, v, lo, hi)
	}
	return nil
}

func llmdPositive(name string, v float64) error {
	if !(v > 0 && v <= math.MaxFloat64) {
		return fmt.Errorf("%s %v: want a positive, finite value", name, v)
	}
	return nil
}

func llmdPositiveInt(name string, v int) error {
	if v <= 0 {
		return fmt.Errorf("%s %d: want a positive value", name, v)
	}
	return nil
}
