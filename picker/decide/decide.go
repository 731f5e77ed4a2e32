package decide

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/inflight"
	"github.com/kvroute/kvroute/picker/predict"
	"github.com/kvroute/kvroute/picker/score"
)

// Config tunes the decision. Start from DefaultConfig: a zero field is
// invalid, not a default, and Validate says which.
type Config struct {
	Score score.Config
	// Health holds the limits endpoint health is judged by (staleness,
	// the sidecar grace period).
	Health fleet.HealthConfig
	// Predict is the TTFT model's learning; its prior prices a group
	// nothing has been learned of yet.
	Predict predict.Config
	// Pulls lets precise name a KV source: an endpoint whose CPU tier
	// holds more of the prefix than the candidate does, for the candidate
	// to pull from (vLLM's P2P tier), when the model prices the pull below
	// recomputing. Both must run the P2P tier (Snapshot.Sources). Default
	// true; off, precise places as if no engine could pull.
	Pulls bool
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Score: score.DefaultConfig(), Health: fleet.DefaultHealthConfig(), Predict: predict.DefaultConfig(), Pulls: true}
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Score.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Health.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Predict.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Request is a prepared request, as the decision needs it.
type Request struct {
	score.Request
	// Policy is the policy in force: the configured one, or prefix-hash
	// when the request's tokens could not be had in time. "" is the
	// configured one.
	Policy score.Policy
	// BlockSize is the identity group's block size (0: unknown; then
	// nothing is matched).
	BlockSize int
	// Exclude are endpoints this request already tried.
	Exclude map[string]bool
}

// Snapshot is the fleet as the decision sees it.
type Snapshot struct {
	// Roster is the request's identity group, in a stable order: the
	// fleet's roster of the group (fleet.Roster), shared with every other
	// decision reading it, or the part of it a request may use
	// (Roster.Only). The decision reads its endpoints' briefs; nothing
	// here modifies it.
	Roster *fleet.Roster
	// Endpoints are the group as values, for a snapshot made by hand
	// (tests, tools): read only when Roster is nil.
	Endpoints []fleet.Endpoint
	// Matched is, per tier and endpoint URL, how many leading blocks of
	// the request's chain the endpoint holds (nil maps, absent keys:
	// none).
	Matched [tier.Count]map[string]int
	// InFlight is, per endpoint URL, the picks its last load report does
	// not cover, and the carried picks before their first output token,
	// this picker's and those the other pickers shared (absent: none).
	InFlight map[string]inflight.Pending
	// Model is the group's TTFT fit (nil: Config.Predict's prior);
	// Learned, per endpoint URL, its speed factor and the uncached prompt
	// assumed for a request waiting there that this picker did not send
	// (absent: speed 1 and MeanTokens). Factors, when not nil, are the
	// same for every endpoint of the group, index for index (what the
	// router gives: no lookup by URL); Learned is then not read.
	Model      *predict.Coefficients
	Learned    map[string]predict.Endpoint
	Factors    []predict.Endpoint
	MeanTokens float64
	// Sources are the endpoints (URL) that run vLLM's P2P tier: they may
	// pull a prefix from one another's CPU tiers (absent: not). Nil with a
	// Roster: the roster's briefs say (fleet.Brief.P2P).
	Sources map[string]bool
	// Scratch, when not nil, is the memory the decision's per-endpoint
	// work reuses (the caller's: one decision at a time); nil, fresh
	// memory. Either way the decision is the same, and nothing it returns
	// points into Scratch.
	Scratch *Scratch
}

// Scratch is memory a decision's per-endpoint work reuses (Snapshot.Scratch):
// a shell deciding often keeps a few, one per decision under way, so that
// a decision at 1,000 endpoints does not allocate its working set (some
// 170 KB) each time. The zero value is ready.
type Scratch struct {
	cands  []score.Candidate
	states []fleet.HealthState
	score  score.Scratch
}

// Group is s's endpoints: the roster's, or pointers to Endpoints when
// there is no roster. Read only.
func (s *Snapshot) Group() []*fleet.Endpoint {
	if s.Roster != nil {
		return s.Roster.Endpoints
	}
	if s.Endpoints == nil {
		return nil
	}
	out := make([]*fleet.Endpoint, len(s.Endpoints))
	for i := range s.Endpoints {
		out[i] = &s.Endpoints[i]
	}
	return out
}

// roster is s's roster, made from Endpoints when there is none.
func (s *Snapshot) roster() *fleet.Roster {
	if s.Roster != nil {
		return s.Roster
	}
	return fleet.NewRoster(s.Group())
}

// p2p reports whether the i-th endpoint of r (s's roster) runs vLLM's
// P2P tier.
func (s *Snapshot) p2p(r *fleet.Roster, i int) bool {
	if s.Sources == nil && s.Roster != nil {
		return r.Briefs[i].P2P
	}
	return s.Sources[r.Briefs[i].URL]
}

// factor is the learned factors of the i-th endpoint, url, and whether
// any are (Learned's absent).
func (s *Snapshot) factor(i int, url string) (predict.Endpoint, bool) {
	if s.Factors != nil {
		return s.Factors[i], true
	}
	l, ok := s.Learned[url]
	return l, ok
}

// Decision is the choice, its reason and its explanation.
type Decision struct {
	// Endpoint is the chosen endpoint's URL; "" when no endpoint is
	// routable.
	Endpoint string
	Policy   score.Policy
	Reason   score.Reason
	// MatchedTokens and MatchedBlocks are what the chosen endpoint holds
	// of the prefix on GPU.
	MatchedTokens, MatchedBlocks int
	// Cached are the credited cached tokens (all tiers, weighted);
	// Uncached the prompt tokens left to prefill, what the in-flight
	// ledger records.
	Cached, Uncached float64
	// AnotherHeldMore: a routable endpoint held a longer GPU prefix than
	// the chosen one (a load override, or an excluded retry).
	AnotherHeldMore bool
	// LoadOnly: the chosen endpoint's cache is unknown (its health is
	// load-only): it got no cache credit and nothing is predicted.
	LoadOnly bool
	// Override is set when the best-cached candidate was skipped for load.
	Override *score.Override
	// Source is the endpoint (URL) the chosen one should pull the prefix
	// from, out of that endpoint's CPU tier (vLLM's P2P tier): "" when
	// the prefix is local, cheaper recomputed, or no endpoint holds more.
	// It is always another endpoint of the request's identity group, and
	// the request's own salt is in every key it matched on.
	// SourceTokens is how many prompt tokens the pull is expected to
	// bring (the source's CPU prefix beyond what the chosen one holds).
	Source       string
	SourceTokens int
	// Plan is where the chosen endpoint is expected to find the prompt's
	// tokens: its GPU cache, its CPU tier (loaded back), the source's CPU
	// tier (pulled), or nowhere (recomputed). They add up to the prompt.
	Plan Placement
	// Predicted is the chosen endpoint's predicted TTFT, by term, and
	// Features what it was predicted from (what the model learns from
	// when the first token comes).
	Predicted predict.Terms
	Features  predict.Features
	// Explain is every candidate as the decision saw it, in snapshot order.
	Explain []score.Explain
}

// Placement splits a prompt's tokens by where an endpoint gets their KV.
type Placement struct {
	GPU, CPU, Pulled, Recompute int
}

// OK reports whether an endpoint was chosen.
func (d *Decision) OK() bool { return d.Endpoint != "" }

// Decide chooses an endpoint for req among snap's at now.
func Decide(cfg *Config, req Request, snap Snapshot, now time.Time) Decision {
	sc := cfg.Score
	if req.Policy != "" {
		sc.Policy = req.Policy
	}
	p := cfg.pass(req, &snap, now)
	cands := p.candidates()
	for i := range cands { // the URLs' hashes, made with the roster, for the weights
		cands[i].IDHash = p.ro.Briefs[i].Hash
	}
	var ss *score.Scratch
	if snap.Scratch != nil {
		ss = &snap.Scratch.score
	}
	sd := score.DecideWith(&sc, req.Request, cands, ss)
	d := Decision{Policy: sc.Policy, Reason: sd.Reason, Override: sd.Override, Explain: sd.Explain}
	if sd.Index < 0 {
		return d
	}
	chosen := cands[sd.Index]
	var o option
	p.candidate(sd.Index, &chosen, &o) // the chosen one's option, again: the same
	d.Endpoint = chosen.ID
	d.Features, d.Predicted, d.Plan = o.f, o.terms, o.plan
	if o.source != "" {
		d.Source, d.SourceTokens = o.source, o.plan.Pulled
	}
	d.LoadOnly = o.state == fleet.LoadOnly
	d.MatchedTokens = chosen.Matched[tier.GPU]
	if req.BlockSize > 0 {
		d.MatchedBlocks = d.MatchedTokens / req.BlockSize
	}
	d.Cached = sd.Cached
	d.Uncached = float64(req.PromptTokens) - sd.Cached
	if d.Source != "" { // pulled tokens are not prefilled
		d.Uncached = float64(d.Plan.Recompute)
	}
	for _, c := range cands {
		if c.Healthy && c.Matched[tier.GPU] > chosen.Matched[tier.GPU] {
			d.AnotherHeldMore = true
		}
	}
	return d
}

// Candidates is the scoring input: per endpoint of the snapshot, its
// matched tokens per tier (none for a load-only endpoint: its cache is
// unknown), its load and this picker's picks in flight, whether it may be
// chosen (routable, not excluded), and the request's predicted TTFT
// there.
func Candidates(cfg *Config, req Request, snap Snapshot, now time.Time) []score.Candidate {
	snap.Scratch = nil // the candidates are the caller's to keep
	return cfg.pass(req, &snap, now).candidates()
}

// pass is one decision's reading of its snapshot: the roster, and what
// every candidate's pricing shares.
type pass struct {
	cfg     *Config
	req     *Request
	snap    *Snapshot
	ro      *fleet.Roster
	coef    predict.Coefficients // the group's fit, or the prior
	sources []source             // the CPU tiers pulls may come from (precise with Pulls)
	states  []fleet.HealthState  // each endpoint's at the decision's now
	// matched and pending are the snapshot's Matched and InFlight by
	// endpoint index, in a group large enough (spreadFrom) that looking
	// them up by URL for every endpoint costs more than placing their
	// entries once (nil: looked up in the map).
	matched [tier.Count][]int
	pending []inflight.Pending
}

// scratch is a slice of n elements: field's of s, grown if it must be
// (its old contents left for the caller to overwrite), or new when s is
// nil.
func scratch[V any](s *Scratch, field func(*Scratch) *[]V, n int) []V {
	if s == nil {
		return make([]V, n)
	}
	f := field(s)
	if cap(*f) < n {
		*f = make([]V, n)
	}
	return (*f)[:n]
}

// spreadFrom is the group size from which a snapshot's sparse maps (not
// empty) are placed by index: a lookup by URL per endpoint costs a hash,
// or up to 8 string compares in a small map, where placing the map's
// few entries once costs a search each and a slice of the group's size.
const spreadFrom = 64

// spread places m's values at their URLs' indexes in r (zero elsewhere;
// a URL r does not hold is not placed).
func spread[V any](r *fleet.Roster, m map[string]V) []V {
	out := make([]V, len(r.Briefs))
	for url, v := range m {
		if i, ok := r.Index(url); ok {
			out[i] = v
		}
	}
	return out
}

// matchedAt is Matched[t] of the i-th endpoint, url.
func (p *pass) matchedAt(t tier.Tier, i int, url string) int {
	if p.matched[t] != nil {
		return p.matched[t][i]
	}
	return p.snap.Matched[t][url]
}

// pendingAt is InFlight of the i-th endpoint, url.
func (p *pass) pendingAt(i int, url string) inflight.Pending {
	if p.pending != nil {
		return p.pending[i]
	}
	return p.snap.InFlight[url]
}

func (cfg *Config) pass(req Request, snap *Snapshot, now time.Time) *pass {
	p := &pass{cfg: cfg, req: &req, snap: snap, ro: snap.roster(), coef: predict.Coefficients(cfg.Predict.Prior)}
	if snap.Model != nil {
		p.coef = *snap.Model
	}
	p.states = scratch(snap.Scratch, func(s *Scratch) *[]fleet.HealthState { return &s.states }, len(p.ro.Briefs))
	for i := range p.ro.Briefs {
		p.states[i] = p.ro.Briefs[i].StateAt(now, cfg.Health)
	}
	if len(p.ro.Briefs) >= spreadFrom {
		for _, t := range tier.All() {
			if m := snap.Matched[t]; len(m) > 0 {
				p.matched[t] = spread(p.ro, m)
			}
		}
		if len(snap.InFlight) > 0 {
			p.pending = spread(p.ro, snap.InFlight)
		}
	}
	if cfg.Pulls && req.Policy == score.Precise || cfg.Pulls && req.Policy == "" && cfg.Score.Policy == score.Precise {
		p.sources = p.pullSources()
	}
	return p
}

// candidates is Candidates: one per endpoint of the roster, in its order.
func (p *pass) candidates() []score.Candidate {
	out := scratch(p.snap.Scratch, func(s *Scratch) *[]score.Candidate { return &s.cands }, len(p.ro.Briefs))
	var o option // each one's, not kept
	for i := range out {
		p.candidate(i, &out[i], &o)
	}
	return out
}

// candidate fills c, the i-th endpoint's candidate, and o, its option:
// how the request is served there, and priced.
func (p *pass) candidate(i int, c *score.Candidate, o *option) {
	b, st, snap, req := &p.ro.Briefs[i], p.states[i], p.snap, p.req
	*c = score.Candidate{ID: b.URL, Healthy: st.Routable() && !req.Exclude[b.URL]}
	if st == fleet.Cached { // load-only endpoints get no cache credit
		for _, t := range tier.All() {
			c.Matched[t] = p.matchedAt(t, i, b.URL) * req.BlockSize
		}
	}
	if b.HasLoad {
		c.Waiting, c.Running, c.KVUsage = b.Waiting, b.Running, b.KVCacheUsage
	}
	pend := p.pendingAt(i, b.URL)
	c.Sent, c.SentTokens = pend.Count, pend.Tokens
	l, learned := snap.factor(i, b.URL)
	p.cfg.features(o, req, snap, c, pend, l, learned)
	o.speed = speedOf(l, learned)
	o.terms = p.coef.Terms(o.f, o.speed)
	o.state = st
	if st == fleet.Cached && p.sources != nil && snap.p2p(p.ro, i) {
		*o = p.bestPull(*o)
	}
	c.Ahead = o.f.Ahead
	c.Predicted = o.terms.Total()
}

// option is one way to serve a request on an endpoint: where its prompt's
// KV comes from (Plan; Source when pulled), what the model is given of it
// and what it predicts.
type option struct {
	endpoint string
	f        predict.Features
	terms    predict.Terms
	plan     Placement
	source   string
	state    fleet.HealthState // the endpoint's, at the decision's now
	speed    float64           // its learned speed factor (1: the group's curve)
}

// source is an endpoint whose CPU tier may serve a pull: how many leading
// prompt tokens it holds there, and this picker's pulls from it in
// flight.
type source struct {
	url    string
	tokens int
	pulls  int
}

// pullSources are the endpoints that may serve req's prefix from their
// CPU tier: they run the P2P tier, their cache is known (a load-only
// endpoint's is not) and hold some of the prefix there. Only their CPU
// tier counts: vLLM's P2P tier serves nothing else, and never touches the
// source's GPU, so a busy or excluded source serves all the same.
func (p *pass) pullSources() []source {
	if len(p.snap.Matched[tier.CPU]) == 0 {
		return nil
	}
	var out []source
	for i := range p.ro.Briefs {
		url := p.ro.Briefs[i].URL
		n := p.matchedAt(tier.CPU, i, url) * p.req.BlockSize
		if n <= 0 || !p.snap.p2p(p.ro, i) || p.states[i] != fleet.Cached {
			continue
		}
		out = append(out, source{url: url, tokens: n, pulls: p.pendingAt(i, url).PullsOut})
	}
	return out
}

// bestPull is local, or a pull from one of sources if the model prices
// it faster: the source's CPU prefix beyond what the endpoint holds
// arrives over the link (shared with the pulls in flight from that
// source), and only the rest is prefilled. A tie keeps the endpoint's own
// cache; among sources, the one with fewer pulls in flight, then the
// first in snapshot order.
func (p *pass) bestPull(local option) option {
	req, sources := p.req, p.sources
	best := local
	held := local.plan.GPU + local.plan.CPU
	limit := req.PromptTokens - 1 // the engine computes at least the last token
	if req.BlockSize > 0 {
		limit = limit / req.BlockSize * req.BlockSize
	}
	for _, s := range sources {
		n := min(s.tokens, limit)
		if s.url == local.endpoint || n <= held {
			continue
		}
		o := local
		o.source = s.url
		o.plan.Pulled, o.plan.Recompute = n-held, req.PromptTokens-n
		o.f.Tail, o.f.Context = float64(o.plan.Recompute), float64(n)
		o.f.Pulls, o.f.Pulled = 1, float64(n-held)*float64(1+s.pulls)
		o.terms = p.coef.Terms(o.f, local.speed)
		if o.terms.Total() < best.terms.Total() {
			best = o
		}
	}
	return best
}

// features are what the TTFT model needs of req on c, served from c's
// own caches: the tail past its longest matched prefix (any tier), the
// part of that prefix it loads back from a lower tier (beyond its GPU
// prefix), the work queued ahead — this picker's carried picks before
// their first output token (or, for picks it does not carry, the
// unreported ones' aged tokens), plus the requests the engine reports
// waiting beyond this picker's, at the mean uncached prompt learned for
// the endpoint (until one is, this request's prompt) — and the decodes
// running there.
func (cfg *Config) features(o *option, req *Request, snap *Snapshot, c *score.Candidate, p inflight.Pending, l predict.Endpoint, learned bool) {
	matched := 0
	for _, m := range c.Matched {
		matched = max(matched, m)
	}
	matched = min(matched, req.PromptTokens)
	gpu := min(c.Matched[tier.GPU], matched)
	mean := snap.MeanTokens
	if mean <= 0 { // nothing learned yet: as long as this one
		mean = float64(req.PromptTokens)
	}
	if learned && l.MeanTokens > 0 {
		mean = l.MeanTokens
	}
	others := max(0, c.Waiting-float64(max(0, p.AwaitCount-p.Count)))
	*o = option{
		endpoint: c.ID,
		plan:     Placement{GPU: gpu, CPU: matched - gpu, Recompute: req.PromptTokens - matched},
		f: predict.Features{
			Tail:    float64(req.PromptTokens - matched),
			Context: float64(matched),
			Loaded:  float64(matched - gpu),
			Ahead:   max(p.AwaitTokens, p.Tokens) + others*mean,
			Queued:  float64(max(p.AwaitCount, p.Count)) + others,
			KVUsage: c.KVUsage,
			Running: c.Running + float64(p.Count),
		},
	}
}

// speedOf is an endpoint's speed factor from its learned factors: 1
// unless one was learned.
func speedOf(l predict.Endpoint, learned bool) float64 {
	if learned && l.Speed > 0 {
		return l.Speed
	}
	return 1
}

// RenderOrder orders the engines that may render a request's tokens:
// the routable endpoints (cached or load-only: both answer; a draining
// engine is going away), least loaded
// first (by the last report), ties by URL. RenderOrderOf is the same
// over a roster.
func RenderOrder(cfg *Config, eps []fleet.Endpoint, now time.Time) []string {
	ptrs := make([]*fleet.Endpoint, len(eps))
	for i := range eps {
		ptrs[i] = &eps[i]
	}
	return RenderOrderOf(cfg, fleet.NewRoster(ptrs), now)
}

// RenderOrderOf is RenderOrder over a roster (nil: none).
func RenderOrderOf(cfg *Config, r *fleet.Roster, now time.Time) []string {
	if r == nil {
		return []string{}
	}
	var ok []*fleet.Brief
	for i := range r.Briefs {
		if b := &r.Briefs[i]; b.StateAt(now, cfg.Health).Routable() {
			ok = append(ok, b)
		}
	}
	load := func(b *fleet.Brief) float64 { return b.Waiting + b.Running }
	sort.SliceStable(ok, func(i, j int) bool {
		if load(ok[i]) != load(ok[j]) {
			return load(ok[i]) < load(ok[j])
		}
		return ok[i].URL < ok[j].URL
	})
	out := make([]string, len(ok))
	for i, e := range ok {
		out[i] = e.URL
	}
	return out
}

// String is a one-line summary of d, for logs and test failures.
func (d Decision) String() string {
	if !d.OK() {
		return fmt.Sprintf("none (%s, %s)", d.Policy, d.Reason)
	}
	return fmt.Sprintf("%s (%s, %s, %d tokens matched)", d.Endpoint, d.Policy, d.Reason, d.MatchedTokens)
}

// Saturated reports whether every routable endpoint of snap (none
// excluded by req) has at least waiting requests queued at now: its
// engine's last reported waiting requests plus this picker's picks that
// report does not cover. False when none is routable (that is no
// endpoint, not overload) or waiting is not positive.
func Saturated(cfg *Config, req Request, snap Snapshot, now time.Time, waiting float64) bool {
	if !(waiting > 0) {
		return false
	}
	routable := 0
	ro := snap.roster()
	for i := range ro.Briefs {
		b := &ro.Briefs[i]
		if !b.StateAt(now, cfg.Health).Routable() || req.Exclude[b.URL] {
			continue
		}
		routable++
		queued := float64(snap.InFlight[b.URL].Count)
		if b.HasLoad {
			queued += b.Waiting
		}
		if queued < waiting {
			return false
		}
	}
	return routable > 0
}
