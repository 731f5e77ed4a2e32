package peers

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"
)

// SGLangConfig holds the parameters of SMG's cache_aware policy; the
// defaults are its CLI's (DefaultSGLangConfig).
type SGLangConfig struct {
	// CacheThreshold is the match rate (matched characters / input
	// characters) a request must exceed to follow the cache.
	CacheThreshold float64
	// BalanceAbsThreshold and BalanceRelThreshold are the spill gate: a
	// cache-chosen worker whose load exceeds both the mean load plus
	// BalanceAbsThreshold and BalanceRelThreshold times the mean gives
	// way to the min-load worker.
	BalanceAbsThreshold int
	BalanceRelThreshold float64
	// EvictionInterval is how often the trees are brought back under
	// MaxTreeSize.
	EvictionInterval time.Duration
	// MaxTreeSize is each model's character budget, shared by its tenants.
	MaxTreeSize int
}

// DefaultSGLangConfig is SMG's CLI defaults.
func DefaultSGLangConfig() SGLangConfig {
	return SGLangConfig{
		CacheThreshold:      0.3,
		BalanceAbsThreshold: 64,
		BalanceRelThreshold: 1.5,
		EvictionInterval:    120 * time.Second,
		MaxTreeSize:         1 << 26, // 67,108,864 characters
	}
}

// Validate reports what makes c unusable; the zero value is.
func (c SGLangConfig) Validate() error {
	var errs []error
	if !(c.CacheThreshold >= 0 && c.CacheThreshold <= 1) {
		errs = append(errs, fmt.Errorf("sglang: cache threshold %v is not in [0, 1]", c.CacheThreshold))
	}
	if c.BalanceAbsThreshold < 0 {
		errs = append(errs, fmt.Errorf("sglang: balance abs threshold %d is negative", c.BalanceAbsThreshold))
	}
	if !(c.BalanceRelThreshold > 0) || math.IsInf(c.BalanceRelThreshold, 0) {
		errs = append(errs, fmt.Errorf("sglang: balance rel threshold %v is not a positive number", c.BalanceRelThreshold))
	}
	if c.EvictionInterval <= 0 {
		errs = append(errs, fmt.Errorf("sglang: eviction interval %v is not positive", c.EvictionInterval))
	}
	if c.MaxTreeSize <= 0 {
		errs = append(errs, fmt.Errorf("sglang: max tree size %d is not positive", c.MaxTreeSize))
	}
	return errors.Join(errs...)
}

// SGLangPolicy is SMG's cache_aware policy in HTTP mode (the "SMG today"
// algorithm of shared/docs/peer-policies.md §3.2), as a Policy named
// SGLang.
//
// Pick, over the healthy candidates: match req.Text in the model's tree;
// if the match rate exceeds CacheThreshold and a healthy tenant owns the
// deepest matched node, take the least loaded such tenant (uniform random
// ties, drawn from Pick's rnd) — "cache_hit" — unless the spill gate
// sends the request to the min-load worker — "spill". Otherwise the
// min-load worker — "min_load": the lexicographic minimum of (load,
// processed count, candidate index). No healthy candidate: Index -1,
// "none_healthy". Scores are each candidate's load (in-flight requests;
// a cost, lower better), 0 for unhealthy ones.
//
// Dispatched books the request (load +1) and inserts req.Text under the
// endpoint; Done unbooks it (load -1, processed +1). Every
// EvictionInterval (checked at Pick and Dispatched) each model's tree
// loses its globally least recently used tenant leaves until it holds at
// most MaxTreeSize characters.
//
// Substitutions, against SMG:
//   - HTTP mode only: the tree holds request text (req.Text, which the
//     caller builds as SMG's HTTP mode does: chat contents joined with
//     spaces). SMG's gRPC mode (token-ID trees, 16-token pages) and its
//     event-driven mode (KV events into a positional indexer) are not
//     implemented.
//   - A character is a Go rune; text that is not valid UTF-8 is read with
//     each invalid byte as one U+FFFD.
//   - Load is this policy's own in-flight bookings (Dispatched to Done),
//     SMG's per-worker counter, as the gateway would hold it.
//   - The processed count, the min-load tie-break after load, grows at
//     Done: a request counts as processed once it is answered, failed or
//     abandoned.
//   - One tree per model (req.Model), as SMG keeps one per model; its
//     budget counts each tenant's characters (a node shared by k tenants
//     counts k times), kept per tenant so the total needs no walk.
//   - Eviction runs inside Pick and Dispatched, at the first call at
//     least EvictionInterval after the previous run (the first call
//     starts the clock), where SMG runs a background timer.
//   - SMG's KV-usage triggers (balance and overload token-usage
//     thresholds) are disabled, as in its defaults (1.0); so are overlap
//     decay and selection temperature (0).
//   - The text is inserted at Dispatched, not at selection: in this
//     lifecycle Dispatched follows Pick at once for the chosen endpoint.
type SGLangPolicy struct {
	cfg       SGLangConfig
	trees     map[string]*charTree // by model
	load      map[string]int       // in-flight, by endpoint
	processed map[string]uint64    // finished, by endpoint
	bookings  map[Ticket]string    // endpoint, by ticket
	next      Ticket
	started   bool      // lastEvict is set
	lastEvict time.Time // the last eviction run, or the first call
}

// NewSGLang builds the policy; it refuses an invalid c.
func NewSGLang(c SGLangConfig) (*SGLangPolicy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &SGLangPolicy{
		cfg:       c,
		trees:     map[string]*charTree{},
		load:      map[string]int{},
		processed: map[string]uint64{},
		bookings:  map[Ticket]string{},
	}, nil
}

// Name is SGLang.
func (p *SGLangPolicy) Name() string { return SGLang }

// Pick chooses among cands for req (see the type's doc).
func (p *SGLangPolicy) Pick(req *Request, cands []Candidate, rnd uint64, now time.Time) Choice {
	p.maybeEvict(now)
	scores := make([]float64, len(cands))
	healthy := 0
	for i, c := range cands {
		if c.Healthy {
			scores[i] = float64(p.load[c.ID])
			healthy++
		}
	}
	if healthy == 0 {
		return Choice{Index: -1, Reason: "none_healthy", Scores: scores}
	}
	if sel := p.cacheChoice(req, cands, rnd); sel >= 0 {
		if p.spills(cands, sel) {
			return Choice{Index: p.minLoad(cands), Reason: "spill", Scores: scores}
		}
		return Choice{Index: sel, Reason: "cache_hit", Scores: scores}
	}
	return Choice{Index: p.minLoad(cands), Reason: "min_load", Scores: scores}
}

// cacheChoice is the least loaded healthy tenant of the deepest node
// req.Text matches (random ties), when the match rate exceeds the
// threshold; -1 otherwise.
func (p *SGLangPolicy) cacheChoice(req *Request, cands []Candidate, rnd uint64) int {
	tree := p.trees[req.Model]
	if tree == nil {
		return -1
	}
	text := sglText(req.Text)
	inputRunes := utf8.RuneCountInString(text)
	if inputRunes == 0 {
		return -1
	}
	matched, tenants := tree.Match(text)
	if float64(matched)/float64(inputRunes) <= p.cfg.CacheThreshold {
		return -1
	}
	var owners []int
	least := math.MaxInt
	for i, c := range cands {
		if c.Healthy && slices.Contains(tenants, c.ID) {
			owners = append(owners, i)
			least = min(least, p.load[c.ID])
		}
	}
	ties := slices.DeleteFunc(owners, func(i int) bool { return p.load[cands[i].ID] > least })
	if len(ties) == 0 {
		return -1
	}
	return ties[NewRand(rnd).IntN(len(ties))]
}

// spills reports whether the spill gate refuses cands[sel]: its load
// exceeds both BalanceRelThreshold times the healthy candidates' mean
// load and that mean plus BalanceAbsThreshold.
func (p *SGLangPolicy) spills(cands []Candidate, sel int) bool {
	sum, n := 0, 0
	for _, c := range cands {
		if c.Healthy {
			sum += p.load[c.ID]
			n++
		}
	}
	mean := float64(sum) / float64(n)
	l := float64(p.load[cands[sel].ID])
	return l > p.cfg.BalanceRelThreshold*mean && l > mean+float64(p.cfg.BalanceAbsThreshold)
}

// minLoad is the healthy candidate with the least (load, processed count,
// index); there is one.
func (p *SGLangPolicy) minLoad(cands []Candidate) int {
	best := -1
	for i, c := range cands {
		if c.Healthy && (best < 0 || p.lessLoaded(c.ID, cands[best].ID)) {
			best = i
		}
	}
	return best
}

// lessLoaded orders endpoints by load, then processed count (the index
// decides the rest: minLoad keeps the first).
func (p *SGLangPolicy) lessLoaded(a, b string) bool {
	if p.load[a] != p.load[b] {
		return p.load[a] < p.load[b]
	}
	return p.processed[a] < p.processed[b]
}

// Dispatched books req on endpoint and inserts its text there.
func (p *SGLangPolicy) Dispatched(req *Request, endpoint string, now time.Time) Ticket {
	p.maybeEvict(now)
	p.load[endpoint]++
	p.next++
	p.bookings[p.next] = endpoint
	if text := sglText(req.Text); text != "" {
		tree := p.trees[req.Model]
		if tree == nil {
			tree = newCharTree()
			p.trees[req.Model] = tree
		}
		tree.Insert(text, endpoint, now.UnixNano())
	}
	return p.next
}

// FirstChunk does nothing: SMG's load counts the whole request.
func (p *SGLangPolicy) FirstChunk(Ticket, time.Time) {}

// FirstToken does nothing: SMG's load counts the whole request.
func (p *SGLangPolicy) FirstToken(Ticket, time.Time) {}

// Done ends the booking: load -1, processed +1. An unknown (or already
// ended, or forgotten) ticket is ignored.
func (p *SGLangPolicy) Done(t Ticket, _ time.Time) {
	endpoint, ok := p.bookings[t]
	if !ok {
		return
	}
	delete(p.bookings, t)
	if p.load[endpoint]--; p.load[endpoint] <= 0 {
		delete(p.load, endpoint)
	}
	p.processed[endpoint]++
}

// Forget drops endpoint from every tree, its counters and its bookings.
func (p *SGLangPolicy) Forget(endpoint string) {
	for model, tree := range p.trees {
		tree.Remove(endpoint)
		if tree.Total() == 0 {
			delete(p.trees, model)
		}
	}
	for t, e := range p.bookings {
		if e == endpoint {
			delete(p.bookings, t)
		}
	}
	delete(p.load, endpoint)
	delete(p.processed, endpoint)
}

// maybeEvict brings every model's tree under budget when an interval has
// passed since the last run.
func (p *SGLangPolicy) maybeEvict(now time.Time) {
	if !p.started {
		p.started, p.lastEvict = true, now
		return
	}
	if now.Sub(p.lastEvict) < p.cfg.EvictionInterval {
		return
	}
	p.lastEvict = now
	for model, tree := range p.trees {
		tree.Evict(p.cfg.MaxTreeSize)
		if tree.Total() == 0 {
			delete(p.trees, model)
		}
	}
}
