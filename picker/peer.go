package picker

import (
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/peers"
	"github.com/kvroute/kvroute/picker/score"
)

// peerPolicy is a peer's routing policy (picker/peers) run as a
// comparison baseline, with the random source its tie-breaks draw from.
// Both are used under the router's lock.
type peerPolicy struct {
	policy peers.Policy
	rng    *rand.Rand
	known  map[string]map[string]bool // group → endpoints seen, to tell the policy of those that left
}

// peerTicket is a pick's booking with the peer policy.
type peerTicket struct {
	t  peers.Ticket
	ok bool
}

func newPeerPolicy(name string, seed uint64) (*peerPolicy, error) {
	p, err := peers.New(name)
	if err != nil {
		return nil, err
	}
	return &peerPolicy{policy: p, rng: rand.New(rand.NewPCG(seed, 0x6b76726f757465)), known: map[string]map[string]bool{}}, nil
}

// peerDecide is Decide's counterpart for a peer policy: the same
// candidates (health, the fleet index's matches, the engines' load), the
// peer's choice, and the booking it makes of it. The decision's figures
// (matched tokens, the prediction the outcome metrics judge) are the
// fleet index's for the chosen endpoint, whatever the policy.
func (r *Router) peerDecide(p *Prepared, snap decide.Snapshot, now time.Time) (decide.Decision, peerTicket) {
	bs := p.dreq.BlockSize
	cands := decide.Candidates(&r.dcfg, p.dreq, snap, now)
	pc := make([]peers.Candidate, len(cands))
	for i, c := range cands {
		e := &snap.Endpoints[i]
		pc[i] = peers.Candidate{ID: c.ID, Healthy: c.Healthy, Waiting: e.Load.Waiting, KVUsage: e.Load.KVCacheUsage, NumGPUBlocks: e.Info.NumGPUBlocks}
		if bs > 0 {
			for _, t := range tier.All() {
				pc[i].Matched[t] = c.Matched[t] / bs
			}
		}
	}
	req := &peers.Request{Model: modelOf(p.eps), CacheSalt: p.req.CacheSalt, Tokens: p.tokens, BlockSize: bs, Keys: p.chain, Stream: p.req.Stream}
	if r.cfg.Score.Policy == score.SGLang {
		req.Text = intake.Text(p.kind, p.body)
	}
	var ch peers.Choice
	var ticket peerTicket
	r.bookings.withPeer(func(pp *peerPolicy) {
		pp.forgetGone(p.group, snap.Endpoints)
		ch = pp.policy.Pick(req, pc, pp.rng.Uint64(), now)
		if ch.Index >= 0 {
			ticket = peerTicket{t: pp.policy.Dispatched(req, pc[ch.Index].ID, now), ok: true}
		}
	})
	d := decide.Decision{Policy: r.cfg.Score.Policy, Reason: score.Reason(ch.Reason)}
	d.Explain = make([]score.Explain, len(cands))
	for i, c := range cands {
		d.Explain[i] = score.Explain{ID: c.ID, Matched: c.Matched, Cached: float64(c.Matched[tier.GPU]), InFlight: float64(c.Sent), Why: "not chosen"}
		if i < len(ch.Scores) {
			d.Explain[i].Cost = ch.Scores[i]
		}
		if !c.Healthy {
			d.Explain[i].Why = "unhealthy"
		}
	}
	if ch.Index < 0 {
		d.Reason = score.ReasonNoneHealthy
		return d, ticket
	}
	chosen := cands[ch.Index]
	d.Explain[ch.Index].Why = "chosen: " + string(r.cfg.Score.Policy) + " " + ch.Reason
	d.Endpoint = chosen.ID
	d.LoadOnly = snap.Endpoints[ch.Index].HealthAt(now, r.dcfg.Health).State == fleet.LoadOnly
	d.MatchedTokens = chosen.Matched[tier.GPU]
	if bs > 0 {
		d.MatchedBlocks = d.MatchedTokens / bs
	}
	d.Cached = float64(d.MatchedTokens)
	d.Uncached = float64(p.dreq.PromptTokens) - d.Cached
	for _, c := range cands {
		if c.Healthy && c.Matched[tier.GPU] > chosen.Matched[tier.GPU] {
			d.AnotherHeldMore = true
		}
	}
	return d, ticket
}

// forgetGone tells the policy of endpoints no longer in the group (a
// peer purges departed pods). Called under the router's lock.
func (pp *peerPolicy) forgetGone(group string, eps []fleet.Endpoint) {
	now := make(map[string]bool, len(eps))
	for _, e := range eps {
		now[e.URL] = true
	}
	for url := range pp.known[group] {
		if !now[url] {
			pp.policy.Forget(url)
		}
	}
	pp.known[group] = now
}

// peerFirstToken marks a pick's first streamed chunk for its peer
// policy's booking.
func (r *Router) peerFirstToken(p *Pick) { r.bookings.peerFirstToken(p, r.now()) }

func modelOf(eps []fleet.Endpoint) string {
	if len(eps) == 0 {
		return ""
	}
	return eps[0].Info.Model
}

// peerDone ends a pick's peer booking: the decision API's, whose request
// the picker never sees (a peer policy books it and lets it go at once).
func (r *Router) peerDone(p *Pick) { r.bookings.peerDone(p, r.now()) }
