package picker

import (
	"context"
	"maps"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/pickapi"
	"github.com/kvroute/kvroute/picker/score"
)

// Route places a request of kind (intake.Any: told by its fields). It
// blocks: it renders the request's tokens (bounded by the render timeout
// and ctx) and, with opt.Admit, waits in the admission queue while the
// request's model group is saturated (with opt.AdmitNow it is refused
// then instead). Then it decides and books, which
// never block. It is the five steps below in order, with the metrics
// recorded once from what they return.
func (r *Router) Route(ctx context.Context, kind intake.Kind, body []byte, opt PickOptions) (*Pick, error) {
	p, err := r.Prepare(ctx, kind, body)
	switch {
	case err == nil && opt.Admit:
		var leave func()
		if leave, err = r.Admit(ctx, p, opt); err == nil {
			defer leave() // once the pick is booked, the next waiter may go
		}
	case err == nil && opt.AdmitNow:
		err = r.admit.check(p.group, p.req.Model, p.endpoints(), opt.Fairness, p.req.CacheSalt)
	}
	var pick *Pick
	var d decide.Decision
	if err == nil {
		now := r.now()
		pick, d, err = r.decide(p, r.Snapshot(p, opt, now), opt, now)
		if err == nil {
			r.Book(pick, opt, now)
		}
	}
	r.m.observe(&p.notes, &d, pick)
	return pick, err
}

// Prepare is a route's first step, its I/O: parse the body, resolve the
// model to its identity group, and (unless the request goes by load
// only) get its exact tokens from an engine of the group and key them.
// It blocks on the render call, bounded by the render timeout and ctx.
// An error is a refusal for the client; the Prepared, returned with it
// too (never nil), carries what the metrics count of it.
func (r *Router) Prepare(ctx context.Context, kind intake.Kind, body []byte) (*Prepared, error) {
	p := &Prepared{body: body, kind: kind}
	return p, r.prepare(ctx, p)
}

// Admit is a route's admission step: while p's model group is saturated
// it waits in the queue under opt.Fairness (blocking, bounded by the
// queue's timeout and ctx), or is refused. On success the caller calls
// leave once its pick is booked, so the next waiter decides knowing it.
func (r *Router) Admit(ctx context.Context, p *Prepared, opt PickOptions) (leave func(), err error) {
	ahead := false
	if r.prio != nil && opt.Priority == nil {
		// The key's standing is charged here, once: the decision's
		// priority reads it (priorityOf).
		key, _ := fairnessKey(opt.Fairness, p.req.CacheSalt)
		st := r.prio.charge(p.group, key, admissionCost(p), r.now())
		p.standing, ahead = &st, st.Ahead
	}
	leave, p.waited, err = r.admit.enter(ctx, p.group, p.req.Model, p.endpoints(), opt.Fairness, p.req.CacheSalt, admissionCost(p), ahead)
	switch {
	case err == nil:
		if p.waited > 0 {
			p.ro = r.groupRoster(p.group) // the fleet moved on while it waited
		}
	case ctx.Err() != nil:
		err = clientGone()
	}
	return leave, err
}

// Snapshot is what the decision sees of p's identity group at now: its
// endpoints (only opt.Only's, when set), what each holds of the request's
// chain per tier, and this picker's picks in flight. It reads the fleet
// and the bookings and never blocks on I/O.
func (r *Router) Snapshot(p *Prepared, opt PickOptions, now time.Time) decide.Snapshot {
	p.dreq.Exclude = opt.Exclude
	p.dreq.SLO = opt.SLO.Seconds()
	p.dreq.Terse = !opt.Explain         // nobody reads an explanation unasked
	if opt.Only != nil && p.ro != nil { // a new roster: the fleet's is shared
		p.ro = p.ro.Only(opt.Only)
	}
	return r.snapshot(p, now)
}

// snapshot is Snapshot over p's endpoints as they are.
func (r *Router) snapshot(p *Prepared, now time.Time) decide.Snapshot {
	// Sources stays nil: the roster's briefs say which endpoints run
	// vLLM's P2P tier (may pull and be pulled from).
	s := decide.Snapshot{Roster: p.ro}
	if len(p.chain) > 0 {
		for _, t := range tier.All() {
			s.Matched[t] = r.fleet.Match(p.group, t, p.chain)
		}
	}
	s.InFlight = r.bookings.pending(p.ro, now)
	if len(p.chain) > 0 && r.precise(p) {
		// A prefix this picker's requests are prefilling there now will
		// be cached by the time this one runs behind them: siblings of a
		// new prefix find it before any KV event says so.
		for url, n := range r.bookings.held(p.ro, p.heldKeys()) {
			if s.Matched[tier.GPU] == nil {
				s.Matched[tier.GPU] = map[string]int{}
			}
			s.Matched[tier.GPU][url] = max(s.Matched[tier.GPU][url], n)
		}
	}
	r.learn.into(&s, p.group)
	return s
}

// Decide is a route's decision over snap at now: refused (shed) when
// opt.ShedWaiting finds every candidate queuing; else kvroute's decision
// (picker/decide) or, in a comparison run, the peer's policy (which books
// its own choice as the peer's system does); with opt.Fallbacks, the
// endpoints ranked after the chosen one. It never blocks. The pick is not
// booked yet: Book does that.
func (r *Router) Decide(p *Prepared, snap decide.Snapshot, opt PickOptions, now time.Time) (*Pick, error) {
	pick, _, err := r.decide(p, snap, opt, now)
	return pick, err
}

func (r *Router) decide(p *Prepared, snap decide.Snapshot, opt PickOptions, now time.Time) (*Pick, decide.Decision, error) {
	var d decide.Decision
	var ticket peerTicket
	switch {
	case decide.Saturated(&r.dcfg, p.dreq, snap, now, opt.ShedWaiting):
		p.notes.refused = "shed"
		return nil, d, overloaded(p.req.Model, opt.ShedWaiting)
	case r.bookings.peer != nil && p.dreq.Policy == "":
		d, ticket = r.peerDecide(p, snap, now)
	default:
		d = r.decideIn(p.dreq, snap, now)
	}
	if !d.OK() {
		return nil, d, noEndpoints(p.req.Model)
	}
	pick := &Pick{Answer: pickapi.Answer{Model: p.req.Model, Policy: string(d.Policy), Reason: string(d.Reason), PromptTokens: p.dreq.PromptTokens,
		Endpoint: d.Endpoint, EndpointID: endpointID(d.Endpoint), MatchedTokens: d.MatchedTokens, MatchedBlocks: d.MatchedBlocks},
		blockSize: p.dreq.BlockSize, anotherHeldMore: d.AnotherHeldMore, loadOnly: d.LoadOnly, kind: p.req.Kind, uncached: d.Uncached,
		waited: p.waited, peer: ticket, group: p.group}
	r.priorityOf(pick, p, opt, now)
	if pick.source, pick.sourceDropped = sourceOf(&d, snap.Group()); pick.sourceDropped != "" {
		r.log.Debug("the decision's KV source is not named", zap.String("endpoint", d.Endpoint), zap.String("source", d.Source),
			zap.String("reason", pick.sourceDropped))
	}
	pick.KVSource, pick.KVSourceTokens = pick.source.addr, pick.source.tokens
	pick.expectCached = d.MatchedTokens + pick.source.tokens // a peer's: its GPU match and its pull
	if pl := d.Plan; pl != (decide.Placement{}) {
		pick.expectCached = pl.GPU + pl.CPU
		if pick.source.url != "" {
			pick.expectCached += pl.Pulled
		}
	}
	if r.precise(p) {
		pick.chain = p.heldKeys()
	}
	if d.Policy == score.Precise && !d.LoadOnly && p.dreq.Policy == "" && r.bookings.peer == nil {
		pick.PredictedTTFTMs = d.Predicted.Total() * 1000
		pick.features, pick.predicted = d.Features, true
	}
	if opt.Fallbacks > 0 {
		pick.fallbacks = r.rankFallbacks(p, d, snap, opt, now)
	}
	if !opt.CacheOff {
		pick.PrefixHash = p.prefixHash
	}
	if opt.Explain {
		for _, k := range p.chain {
			pick.Keys = append(pick.Keys, k.String())
		}
		for _, e := range d.Explain {
			pick.Candidates = append(pick.Candidates, Candidate{Endpoint: e.ID, MatchedTokens: e.Matched[tier.GPU],
				CPUTokens: e.Matched[tier.CPU], StorageTokens: e.Matched[tier.Storage], InFlight: e.InFlight,
				Cost: e.Cost, PredictedTTFTMs: e.Predicted * 1000, UnderCap: e.UnderCap, Why: e.Why})
		}
	}
	return pick, d, nil
}

// rankFallbacks is the same decision over the same snapshot, without the
// endpoints ranked so far: the order the proxy's retries would take.
func (r *Router) rankFallbacks(p *Prepared, d decide.Decision, snap decide.Snapshot, opt PickOptions, now time.Time) []fallback {
	var out []fallback
	dreq := p.dreq
	dreq.Exclude = maps.Clone(opt.Exclude)
	if dreq.Exclude == nil {
		dreq.Exclude = map[string]bool{}
	}
	for next := d; len(out) < opt.Fallbacks; {
		dreq.Exclude[next.Endpoint] = true
		if next = r.decideIn(dreq, snap, now); !next.OK() {
			break
		}
		out = append(out, fallback{endpoint: next.Endpoint, matched: next.MatchedTokens, expectCached: next.Plan.GPU + next.Plan.CPU, uncached: next.Uncached,
			anotherHeldMore: next.AnotherHeldMore, loadOnly: next.LoadOnly})
	}
	return out
}

// Book is a route's last step: the pick counts in flight from now on
// (the decisions after it see it; a carried one's uncached tokens count
// as prefill until its first byte). It never blocks on I/O.
func (r *Router) Book(pick *Pick, opt PickOptions, now time.Time) {
	r.bookings.book(pick, pick.uncached, opt.Carried, now)
	pick.dispatched = now
}

// heldKeys is p's chain as the bookings hold it, converted once for the
// snapshot and the booking.
func (p *Prepared) heldKeys() []uint64 {
	if p.keys == nil && len(p.chain) > 0 {
		p.keys = make([]uint64, len(p.chain))
		for i, k := range p.chain {
			p.keys[i] = uint64(k)
		}
	}
	return p.keys
}

// precise reports whether kvroute's precise policy decides p (not a
// peer's, nor another policy named for it).
func (r *Router) precise(p *Prepared) bool {
	pol := p.dreq.Policy
	if pol == "" {
		pol = r.dcfg.Score.Policy
	}
	return pol == score.Precise && r.bookings.peer == nil
}
