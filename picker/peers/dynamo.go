package peers

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/tier"
)

// DynamoConfig holds the weights of Dynamo's default cost and its
// selection, with KvRouterConfig::default's values in DefaultDynamoConfig.
// The zero value is invalid (StaleAfter must be positive).
type DynamoConfig struct {
	// OverlapCredit is c (overlap_score_credit): the prefill blocks a
	// device-cached block saves. Default 1.
	OverlapCredit float64
	// OverlapCreditDecay (overlap_score_credit_decay) shrinks c on workers
	// with more active prefill than the least loaded one. Default 0 (off).
	OverlapCreditDecay float64
	// PrefillLoadScale is ρ (prefill_load_scale). Default 1.
	PrefillLoadScale float64
	// HostCredit and DiskCredit credit a block held in CPU memory or on
	// storage (and not on a faster tier). Defaults 0.75 and 0.25.
	HostCredit, DiskCredit float64
	// ActiveRequestWeight is κ (decode_active_request_weight), the cost
	// of each active request. Default 0.
	ActiveRequestWeight float64
	// Temperature is router_temperature: 0 picks the cheapest, above 0
	// samples by a softmax of the normalised costs. Default 0.
	Temperature float64
	// StaleAfter is how long a booking may live before it is dropped as
	// stale (a Done that never came). Default 3600 s.
	StaleAfter time.Duration
}

// DefaultDynamoConfig returns KvRouterConfig::default's values.
func DefaultDynamoConfig() DynamoConfig {
	return DynamoConfig{
		OverlapCredit:    1,
		PrefillLoadScale: 1,
		HostCredit:       0.75,
		DiskCredit:       0.25,
		StaleAfter:       3600 * time.Second,
	}
}

// Validate checks c: every weight finite and not negative, and StaleAfter
// positive.
func (c DynamoConfig) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"overlap credit", c.OverlapCredit},
		{"overlap credit decay", c.OverlapCreditDecay},
		{"prefill load scale", c.PrefillLoadScale},
		{"host credit", c.HostCredit},
		{"disk credit", c.DiskCredit},
		{"active request weight", c.ActiveRequestWeight},
		{"temperature", c.Temperature},
	} {
		if !(f.v >= 0 && !math.IsInf(f.v, 1)) {
			errs = append(errs, fmt.Errorf("dynamo %s %v: want a finite value of at least 0", f.name, f.v))
		}
	}
	if c.StaleAfter <= 0 {
		errs = append(errs, fmt.Errorf("dynamo stale booking age %v: want more than 0", c.StaleAfter))
	}
	return errors.Join(errs...)
}

// DynamoPolicy is NVIDIA Dynamo's KV router with its default cost
// (shared/docs/peer-policies.md §2). For worker w, lower is better:
//
//	raw    = (A_w + L)/B
//	credit = c_eff·O_dev + h·O_host + d·O_disk
//	cost   = ρ·max(0, raw − credit) + (D_w + N_w) + κ·R_w
//
// (c_eff = c unless the credit decay is on; h = 0.75 and d = 0.25 by
// default). With the defaults and only a device overlap O this is
// (A_w + L − O·B)/B + D_w + N_w: the blocks left to prefill plus the
// blocks to decode over. L is the prompt's tokens, B the block size,
// O_dev, O_host and O_disk the leading prompt blocks w holds, per
// tier; A_w the booked prefill tokens of w's requests whose first token
// has not come, D_w the distinct prompt blocks of w's booked requests,
// N_w this request's prompt blocks not among them, R_w w's booked
// requests. Its bookings are its own routing decisions: Dispatched adds
// L − O_dev·B (at least 0) to A_w, which FirstToken — the first output
// token, as mark_prefill_completed — (or Done, when no first token came)
// removes; FirstChunk, a streamed answer's first chunk, does nothing: on
// /v1/responses it is response.created, sent before prefill. The
// prompt's blocks join D_w, reference
// counted across requests, until Done; a booking older than StaleAfter
// is dropped at the next Pick or Dispatched, in dispatch order (if now
// ever goes back, an old booking waits behind a fresher one). Output
// blocks are not tracked (router_track_output_blocks is off by default).
//
// Selection: at temperature 0 the cheapest, exact ties broken uniformly
// at random (reservoir sampling); above 0 a draw with p ∝ exp(−(cost −
// min)/((max − min)·T)), uniform when every cost is equal. With no
// overlap anywhere (a cold prefix) the least loaded wins. Reasons:
// "overlap" when the chosen holds a leading block on some tier, "cold"
// otherwise, "none_healthy" when none is healthy. Choice.Scores are the
// costs (0 for unhealthy candidates).
//
// Substitutions, where kvroute's fleet differs from Dynamo's:
//   - O per tier comes from Candidate.Matched, kvroute's fleet index
//     built from the engines' KV events, whose tiers are matched
//     independently: O_dev = Matched[GPU], O_host = max(0, Matched[CPU] −
//     Matched[GPU]), O_disk = max(0, Matched[Storage] − max(Matched[GPU],
//     Matched[CPU])), so a block is credited once, at its fastest tier.
//     Dynamo's indexer finds them in its own radix tree; there is no
//     shared tier here (its credit is 0 by default).
//   - The O_dev booked at Dispatched is the one the last Pick saw for the
//     endpoint, when that Pick was for the same request (the same
//     *Request, or one with equal model, salt, prompt length and keys);
//     otherwise the whole prompt is booked as prefill.
//   - A_w never decays: Dynamo decays it only with an AIC model, which
//     is not configured by default and has no counterpart here.
//   - The busy-threshold filters (active decode blocks, active prefill
//     tokens) and the queue threshold are off by default and are not
//     implemented.
//   - B is the engines' block size, Request.BlockSize (taken as 1 if not
//     positive); L is Request.PromptTokens (0 when the tokens are not
//     known).
//   - The credit decay, c_eff = c/(1 + decay·((A_w − min A)/B)/blocks),
//     takes min A over the healthy candidates and blocks = ⌈L/B⌉ (at
//     least 1).
type DynamoPolicy struct {
	cfg      DynamoConfig
	workers  map[string]*dynamoWorker
	bookings map[Ticket]*dynamoBooking
	order    []Ticket // tickets in dispatch order, for expiry; done ones linger
	next     Ticket
	last     dynamoLastPick
}

// dynamoWorker is one endpoint's bookings.
type dynamoWorker struct {
	prefill int                  // A_w, tokens
	blocks  map[blockkey.Key]int // D_w: booked prompt blocks, reference counted
	tickets map[Ticket]struct{}  // R_w
}

// dynamoBooking is one dispatched request.
type dynamoBooking struct {
	endpoint string
	prefill  int // its share of A_w; 0 once its first token came
	keys     []blockkey.Key
	at       time.Time
}

// dynamoLastPick is what the last Pick saw, for Dispatched's booking.
type dynamoLastPick struct {
	req *Request
	dev map[string]int // device overlap blocks by candidate
}

// NewDynamo returns Dynamo's policy with config c, or c's error.
func NewDynamo(c DynamoConfig) (*DynamoPolicy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &DynamoPolicy{cfg: c, workers: map[string]*dynamoWorker{}, bookings: map[Ticket]*dynamoBooking{}}, nil
}

// Name is Dynamo.
func (p *DynamoPolicy) Name() string { return Dynamo }

// Pick chooses the cheapest healthy candidate (or samples one, at a
// temperature above 0).
func (p *DynamoPolicy) Pick(req *Request, cands []Candidate, rnd uint64, now time.Time) Choice {
	p.expire(now)
	p.remember(req, cands)
	costs := p.costs(req, cands)
	r := NewRand(rnd)
	var i int
	if p.cfg.Temperature > 0 {
		i = dynamoSample(costs, cands, p.cfg.Temperature, r)
	} else {
		i = dynamoArgmin(costs, cands, r)
	}
	return Choice{Index: i, Reason: dynamoReason(cands, i), Scores: costs}
}

// Dispatched books req on endpoint with the device overlap the last Pick
// saw there.
func (p *DynamoPolicy) Dispatched(req *Request, endpoint string, now time.Time) Ticket {
	p.expire(now)
	return p.book(req, endpoint, p.pickedOverlap(req, endpoint), now)
}

// FirstChunk does nothing: A_w ends at the first output token.
func (p *DynamoPolicy) FirstChunk(Ticket, time.Time) {}

// ActivePrefill is A_w: the endpoint's booked prefill tokens whose first
// output token has not come.
func (p *DynamoPolicy) ActivePrefill(endpoint string) int { return p.workers[endpoint].activePrefill() }

// FirstToken ends the booking's prefill: its tokens leave A_w.
func (p *DynamoPolicy) FirstToken(t Ticket, now time.Time) {
	b := p.bookings[t]
	if b == nil {
		return
	}
	if w := p.workers[b.endpoint]; w != nil {
		w.prefill -= b.prefill
	}
	b.prefill = 0
}

// Done ends the booking: its prefill (if FirstToken never came) and its
// blocks are released.
func (p *DynamoPolicy) Done(t Ticket, now time.Time) { p.release(t) }

// Forget drops endpoint's bookings.
func (p *DynamoPolicy) Forget(endpoint string) {
	w := p.workers[endpoint]
	if w == nil {
		return
	}
	for t := range w.tickets {
		delete(p.bookings, t)
	}
	delete(p.workers, endpoint)
}

// costs is each candidate's cost, 0 for unhealthy ones.
func (p *DynamoPolicy) costs(req *Request, cands []Candidate) []float64 {
	keys := dynamoDistinct(req.Keys)
	minA := p.minPrefill(cands)
	costs := make([]float64, len(cands))
	for i := range cands {
		if cands[i].Healthy {
			costs[i] = p.cost(req, keys, &cands[i], minA)
		}
	}
	return costs
}

// cost is c's cost for req, whose distinct prompt blocks are keys.
func (p *DynamoPolicy) cost(req *Request, keys []blockkey.Key, c *Candidate, minA int) float64 {
	b := float64(dynamoBlockSize(req))
	w := p.workers[c.ID]
	a := w.activePrefill()
	raw := float64(a+req.PromptTokens()) / b
	dev, host, disk := dynamoTierOverlap(c.Matched)
	credit := p.credit(req, a, minA)*float64(dev) + p.cfg.HostCredit*float64(host) + p.cfg.DiskCredit*float64(disk)
	prefill := p.cfg.PrefillLoadScale * math.Max(0, raw-credit)
	decode := float64(w.activeBlocks() + w.newBlocks(keys))
	return prefill + decode + p.cfg.ActiveRequestWeight*float64(w.requests())
}

// credit is c_eff for a worker with a active prefill tokens, when the
// least among the candidates is minA.
func (p *DynamoPolicy) credit(req *Request, a, minA int) float64 {
	if p.cfg.OverlapCreditDecay == 0 {
		return p.cfg.OverlapCredit
	}
	b := dynamoBlockSize(req)
	blocks := max(1, (req.PromptTokens()+b-1)/b)
	excess := float64(a-minA) / float64(b) / float64(blocks)
	return p.cfg.OverlapCredit / (1 + p.cfg.OverlapCreditDecay*excess)
}

// minPrefill is the least A_w among the healthy candidates (0 if none).
func (p *DynamoPolicy) minPrefill(cands []Candidate) int {
	least, seen := 0, false
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		a := p.workers[cands[i].ID].activePrefill()
		if !seen || a < least {
			least, seen = a, true
		}
	}
	return least
}

// remember keeps each candidate's device overlap for req's Dispatched.
func (p *DynamoPolicy) remember(req *Request, cands []Candidate) {
	dev := make(map[string]int, len(cands))
	for i := range cands {
		dev[cands[i].ID] = max(0, cands[i].Matched[tier.GPU])
	}
	p.last = dynamoLastPick{req: req, dev: dev}
}

// pickedOverlap is the device overlap the last Pick saw on endpoint, if
// it was for req; 0 otherwise.
func (p *DynamoPolicy) pickedOverlap(req *Request, endpoint string) int {
	if !dynamoSameRequest(p.last.req, req) {
		return 0
	}
	return p.last.dev[endpoint]
}

// book records req on endpoint with dev device-cached leading blocks.
func (p *DynamoPolicy) book(req *Request, endpoint string, dev int, now time.Time) Ticket {
	p.next++
	t := p.next
	b := &dynamoBooking{
		endpoint: endpoint,
		prefill:  dynamoUncached(req, dev),
		keys:     dynamoDistinct(req.Keys),
		at:       now,
	}
	w := p.worker(endpoint)
	w.prefill += b.prefill
	for _, k := range b.keys {
		w.blocks[k]++
	}
	w.tickets[t] = struct{}{}
	p.bookings[t] = b
	p.order = append(p.order, t)
	return t
}

// worker is endpoint's bookings, made if none.
func (p *DynamoPolicy) worker(endpoint string) *dynamoWorker {
	w := p.workers[endpoint]
	if w == nil {
		w = &dynamoWorker{blocks: map[blockkey.Key]int{}, tickets: map[Ticket]struct{}{}}
		p.workers[endpoint] = w
	}
	return w
}

// release drops booking t and what it holds of its worker.
func (p *DynamoPolicy) release(t Ticket) {
	b := p.bookings[t]
	if b == nil {
		return
	}
	delete(p.bookings, t)
	w := p.workers[b.endpoint]
	if w == nil {
		return
	}
	w.prefill -= b.prefill
	for _, k := range b.keys {
		if w.blocks[k]--; w.blocks[k] <= 0 {
			delete(w.blocks, k)
		}
	}
	delete(w.tickets, t)
	if len(w.tickets) == 0 {
		delete(p.workers, b.endpoint)
	}
}

// expire drops the bookings older than StaleAfter at now, oldest
// dispatched first, stopping at the first one still fresh.
func (p *DynamoPolicy) expire(now time.Time) {
	for len(p.order) > 0 {
		t := p.order[0]
		if b := p.bookings[t]; b != nil {
			if now.Sub(b.at) <= p.cfg.StaleAfter {
				break
			}
			p.release(t)
		}
		p.order = p.order[1:]
	}
	if len(p.order) > 2*len(p.bookings)+64 {
		p.order = slices.DeleteFunc(p.order, func(t Ticket) bool { return p.bookings[t] == nil })
	}
}

// activePrefill is A_w (0 for a worker with no bookings).
func (w *dynamoWorker) activePrefill() int {
	if w == nil {
		return 0
	}
	return w.prefill
}

// activeBlocks is D_w.
func (w *dynamoWorker) activeBlocks() int {
	if w == nil {
		return 0
	}
	return len(w.blocks)
}

// newBlocks is N_w: how many of keys (distinct) are not active on w.
func (w *dynamoWorker) newBlocks(keys []blockkey.Key) int {
	if w == nil {
		return len(keys)
	}
	n := 0
	for _, k := range keys {
		if w.blocks[k] == 0 {
			n++
		}
	}
	return n
}

// requests is R_w.
func (w *dynamoWorker) requests() int {
	if w == nil {
		return 0
	}
	return len(w.tickets)
}

// dynamoTierOverlap splits per-tier matches into blocks credited at
// each tier: the device's, then the host's beyond them, then the disk's
// beyond both.
func dynamoTierOverlap(m [tier.Count]int) (dev, host, disk int) {
	dev = max(0, m[tier.GPU])
	host = max(0, m[tier.CPU]-dev)
	disk = max(0, m[tier.Storage]-max(dev, m[tier.CPU]))
	return dev, host, disk
}

// dynamoUncached is L − dev·B, at least 0: the prompt tokens left to
// prefill past dev device-cached blocks.
func dynamoUncached(req *Request, dev int) int {
	l := req.PromptTokens()
	return max(0, l-min(dev, l)*dynamoBlockSize(req))
}

// dynamoBlockSize is req's block size, at least 1.
func dynamoBlockSize(req *Request) int { return max(1, req.BlockSize) }

// dynamoDistinct is keys without repeats, in order.
func dynamoDistinct(keys []blockkey.Key) []blockkey.Key {
	seen := make(map[blockkey.Key]struct{}, len(keys))
	out := make([]blockkey.Key, 0, len(keys))
	for _, k := range keys {
		if _, ok := seen[k]; !ok {
			seen[k] = struct{}{}
			out = append(out, k)
		}
	}
	return out
}

// dynamoSameRequest reports whether a and b are the same request: the
// same pointer, or equal model, salt, prompt length and block keys.
func dynamoSameRequest(a, b *Request) bool {
	if a == nil || b == nil {
		return false
	}
	return a == b || a.Model == b.Model && a.CacheSalt == b.CacheSalt && a.BlockSize == b.BlockSize &&
		a.PromptTokens() == b.PromptTokens() && slices.Equal(a.Keys, b.Keys)
}

// dynamoArgmin is the healthy candidate of least cost, exact ties broken
// uniformly by reservoir sampling; -1 if none is healthy.
func dynamoArgmin(costs []float64, cands []Candidate, r *Rand) int {
	best, ties := -1, 0
	for i := range cands {
		switch {
		case !cands[i].Healthy:
		case best < 0 || costs[i] < costs[best]:
			best, ties = i, 1
		case costs[i] == costs[best]:
			ties++
			if r.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// dynamoSample draws a healthy candidate with p ∝ exp(−z/T), z the cost
// normalised to 0..1 over the healthy ones; uniform when all are equal.
// -1 if none is healthy.
func dynamoSample(costs []float64, cands []Candidate, temp float64, r *Rand) int {
	lo, hi, n := dynamoRange(costs, cands)
	if n == 0 {
		return -1
	}
	weights := make([]float64, len(cands))
	total := 0.0
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		weights[i] = 1
		if hi > lo {
			weights[i] = math.Exp(-((costs[i] - lo) / (hi - lo)) / temp)
		}
		total += weights[i]
	}
	return dynamoDraw(weights, cands, total, r)
}

// dynamoRange is the least and greatest healthy cost, and how many
// candidates are healthy.
func dynamoRange(costs []float64, cands []Candidate) (lo, hi float64, n int) {
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		if n == 0 || costs[i] < lo {
			lo = costs[i]
		}
		if n == 0 || costs[i] > hi {
			hi = costs[i]
		}
		n++
	}
	return lo, hi, n
}

// dynamoDraw picks index i with probability weights[i]/total among the
// healthy candidates (the last healthy one if rounding runs past the end).
func dynamoDraw(weights []float64, cands []Candidate, total float64, r *Rand) int {
	u := float64(r.Uint64()>>11) / (1 << 53) * total
	last := -1
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		last = i
		if u < weights[i] {
			return i
		}
		u -= weights[i]
	}
	return last
}

// dynamoReason names the rule that chose index i.
func dynamoReason(cands []Candidate, i int) string {
	if i < 0 {
		return "none_healthy"
	}
	if slices.Max(cands[i].Matched[:]) > 0 {
		return "overlap"
	}
	return "cold"
}
