package picker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
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
	t      peers.Ticket
	ok     bool
	stream bool // the request asked for a stream: its first chunk is FirstChunk
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
// fleet index's for the chosen endpoint, whatever the policy. A peer
// arm's KV source (peers.Choice.Source) becomes the decision's Source
// when it is a healthy candidate other than the chosen one (peerSource).
func (r *Router) peerDecide(p *Prepared, snap decide.Snapshot, now time.Time) (decide.Decision, peerTicket) {
	bs := p.dreq.BlockSize
	cands := decide.Candidates(&r.dcfg, p.dreq, snap, now)
	eps := snap.Group()
	pc := make([]peers.Candidate, len(cands))
	for i, c := range cands {
		e := eps[i]
		pc[i] = peers.Candidate{ID: c.ID, Healthy: c.Healthy, Waiting: e.Load.Waiting, KVUsage: e.Load.KVCacheUsage, NumGPUBlocks: e.Info.NumGPUBlocks}
		if bs > 0 {
			for _, t := range tier.All() {
				pc[i].Matched[t] = c.Matched[t] / bs
			}
		}
	}
	req := &peers.Request{Model: modelOf(p.endpoints()), CacheSalt: p.req.CacheSalt, Tokens: p.tokens, BlockSize: bs, Keys: p.chain, Stream: p.req.Stream}
	if r.cfg.Score.Policy == score.SGLang {
		req.Text = intake.Text(p.kind, p.body)
		if p.req.Kind == intake.Responses { // as told: the decision API's kind is Any
			req.Text = peers.SGLangResponsesText(p.body) // SMG's own: no function calls or outputs
		}
	}
	var ch peers.Choice
	var ticket peerTicket
	r.bookings.withPeer(func(pp *peerPolicy) {
		pp.forgetGone(p.group, eps)
		rnd := pp.rng.Uint64()
		req.ID = peerRequestID(rnd)
		ch = pp.policy.Pick(req, pc, rnd, now)
		if ch.Index >= 0 {
			ticket = peerTicket{t: pp.policy.Dispatched(req, pc[ch.Index].ID, now), ok: true, stream: req.Stream}
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
	d.LoadOnly = eps[ch.Index].StateAt(now, r.dcfg.Health) == fleet.LoadOnly
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
	if j, tokens, ok := peerSource(cands, ch); ok {
		d.Source, d.SourceTokens = cands[j].ID, tokens
		d.Explain[j].Why = "not chosen: the KV source (" + string(r.cfg.Score.Policy) + ")"
	}
	return d, ticket
}

// peerRequestID is the request id a peer policy sees (peers.Request.ID,
// which llm-d's p2p-source-producer hashes for its sampling coordinate):
// the pick's draw from the policy's seeded random source, in hex. The
// decision has no request id of its own (the x-request-id stays with the
// HTTP layer); like one, this differs per request, and a seeded run
// reproduces it.
func peerRequestID(rnd uint64) string { return strconv.FormatUint(rnd, 16) }

// peerSource is the candidate a peer arm's choice names as its KV source
// (peers.Choice.Source), when it is a healthy candidate of the group
// other than the chosen one, and the prompt tokens the pull is expected
// to bring as kvroute's fleet index has them: the source's CPU-tier run
// beyond the chosen one's longest run on any tier, at least 0 (an arm
// working from its own model, llm-d+p2p's, may name a source the index
// says lacks the blocks: the pull would miss).
func peerSource(cands []score.Candidate, ch peers.Choice) (j, tokens int, ok bool) {
	if ch.Source == "" || ch.Index < 0 || ch.Index >= len(cands) {
		return 0, 0, false
	}
	j = slices.IndexFunc(cands, func(c score.Candidate) bool { return c.ID == ch.Source })
	if j < 0 || j == ch.Index || !cands[j].Healthy {
		return 0, 0, false
	}
	local := 0
	for _, m := range cands[ch.Index].Matched {
		local = max(local, m)
	}
	return j, max(0, cands[j].Matched[tier.CPU]-local), true
}

// forgetGone tells the policy of endpoints no longer in the group (a
// peer purges departed pods). Called under the router's lock.
func (pp *peerPolicy) forgetGone(group string, eps []*fleet.Endpoint) {
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

// firstToken is FirstToken at the router's now, from the proxy and the
// endpoint picker: the TTFT model learns only from a streamed answer,
// whose first output chunk is its first token; a whole answer's first
// byte comes after its last token.
func (r *Router) firstToken(p *Pick, streamed bool) {
	now := r.now()
	r.bookings.peerFirstToken(p, now)
	r.bookings.firstToken(p)
	if streamed {
		r.learnTTFT(p, now)
	}
}

// firstChunk is FirstChunk at the router's now: the proxy's and the endpoint picker's, at
// the answer's first byte.
func (r *Router) firstChunk(p *Pick) { r.FirstChunk(p, r.now()) }

func modelOf(eps []*fleet.Endpoint) string {
	if len(eps) == 0 {
		return ""
	}
	return eps[0].Info.Model
}

// peerDone ends a pick's peer booking: the decision API's, whose request
// the picker never sees (a peer policy books it and lets it go at once).
func (r *Router) peerDone(p *Pick) { r.bookings.peerDone(p, r.now()) }

// FirstChunk is the first chunk of p's answer reaching the client at now
// (for a stream, its first SSE chunk, whatever event it carries; for a
// whole answer, its first byte). It ends p's prefill in kvroute's own
// bookings — the prefill tokens in flight that admission and kvroute's
// policies count (inflight.Bookings.FirstByte) — and, when the request
// streams, gives its peer policy the first-chunk signal: llm-d's
// inflight-load producer releases the request's tokens (peers.Policy
// FirstChunk). It does not end Dynamo's A_w: FirstToken does. The proxy
// and the endpoint picker call it at the answer's first byte; a caller
// that runs engines in virtual time calls it when the first chunk would
// reach the client: on chat and completion streams at the engine's first
// output token (then FirstToken), on /v1/responses streams when the
// engine takes the request (response.created goes out before it is
// scheduled), on a whole answer at its end (before Done). Idempotent per
// pick; Done ends whatever it did not.
func (r *Router) FirstChunk(p *Pick, now time.Time) {
	r.prefillDone(p)
	if p.peer.stream {
		r.bookings.peerFirstChunk(p, now)
	}
}

// FirstToken is the engine's first output token for p at now: the
// prefill is done as the peers count it. It gives p's peer policy the
// first-token signal (peers.Policy FirstToken): Dynamo's active prefill
// tokens A_w end. It ends p's wait for a first token in kvroute's own
// bookings (the queue the TTFT model prices; its prefill tokens for
// admission end at FirstChunk, llm-d's tokens too). The proxy and the
// endpoint picker call it at the
// chunk that carries the first output (outputWatch): on chat and
// completion streams the first chunk, on /v1/responses streams the first
// event after the opening ones, on a whole answer its first byte; a
// caller that runs engines in virtual time calls it at the engine's
// first output token. Idempotent per pick.
//
// For a pick precise predicted, it is also the observation the TTFT model
// learns from: the time from the booking to now, against the prediction
// (once per pick; Pick.ObservedTTFT holds it after).
func (r *Router) FirstToken(p *Pick, now time.Time) {
	r.bookings.peerFirstToken(p, now)
	r.bookings.firstToken(p)
	r.learnTTFT(p, now)
}

// learnTTFT teaches p's group's model its TTFT at now, once.
func (r *Router) learnTTFT(p *Pick, now time.Time) {
	if !p.predicted || p.dispatched.IsZero() {
		return
	}
	p.predicted = false
	p.ObservedTTFT = now.Sub(p.dispatched)
	observed := p.ObservedTTFT.Seconds()
	if !(observed > 0) {
		return
	}
	predicted := r.learn.observe(p.group, p.Endpoint, p.features, p.ObservedTTFT)
	r.m.ttftError.Observe(math.Abs(predicted-observed) / observed)
	r.m.ttftObserved.Observe(observed)
	r.m.ttftPredicted.Observe(predicted)
}

// SetLLMDLoadGate sets the llm-d policy's load gate (the
// prefix-cache-affinity filter's; llm-d+p2p's too, whose placement is
// llm-d's: the lab's calibrated runs of that arm) for the rest of the
// router's life: the
// peak prefill throughput in tokens per second and the TTFT penalty past
// which stickiness breaks (0: never), τ = peak × maxPenalty. The policy's
// state is kept. An error when the router does not run llm-d or a value
// is out of range. kvroute picker sets it from --llmd-peak-prefill-
// throughput and --llmd-max-ttft-penalty, kvroute bench from its
// calibration probe.
func (r *Router) SetLLMDLoadGate(peak float64, maxPenalty time.Duration) error {
	err := fmt.Errorf("the llm-d load gate: the router runs %s, not %s or %s", r.cfg.Score.Policy, peers.LLMD, peers.LLMDP2P)
	r.bookings.withPeer(func(pp *peerPolicy) {
		if pp == nil {
			return
		}
		if l, ok := pp.policy.(llmdLoadGate); ok {
			err = l.SetLoadGate(peak, float64(maxPenalty)/float64(time.Millisecond))
		}
	})
	return err
}

// llmdLoadGate is a policy with llm-d's load gate: llm-d's and its arm
// with KV pulls (llm-d+p2p), whose placement it is.
type llmdLoadGate interface {
	SetLoadGate(peakPrefillThroughput, maxTTFTPenaltyMs float64) error
}

// SetMinCachedTokenDelta sets the router's peer arm's source threshold
// (llm-d's p2p-source-producer's minCachedTokenDelta, in tokens, at least
// 1) for the rest of the router's life, so a run can hold the arm at the
// upstream value or at the crossover measured on its engines
// (peers.CalibratedMinCachedTokenDelta). The policy's state is kept. An
// error when the router does not run an arm with such a threshold
// (llm-d-precise+p2p, llm-d+p2p, llm-d-load+p2p) or the value is out of
// range.
func (r *Router) SetMinCachedTokenDelta(tokens int) error {
	err := fmt.Errorf("the p2p source threshold: the router runs %s, not %s, %s or %s", r.cfg.Score.Policy, peers.LLMDPreciseP2P, peers.LLMDP2P, peers.LLMDLoadP2P)
	r.bookings.withPeer(func(pp *peerPolicy) {
		if pp == nil {
			return
		}
		if a, ok := pp.policy.(peers.SourceThreshold); ok {
			err = a.SetMinCachedTokenDelta(tokens)
		}
	})
	return err
}

// WithPeerPolicy runs f on the router's peer policy under the router's
// lock, for a look at its state (tests, the lab); nil when kvroute's own
// policies route. f must not keep the policy nor call the router.
func (r *Router) WithPeerPolicy(f func(peers.Policy)) {
	r.bookings.withPeer(func(pp *peerPolicy) {
		if pp == nil {
			f(nil)
			return
		}
		f(pp.policy)
	})
}

// outputWatch finds the first output token in an answer as it streams,
// for FirstToken. On a /v1/responses stream it reads the SSE events and
// fires at the first whose type is not an opening one: response.created,
// response.in_progress and response.queued come before prefill, and
// response.output_item.added and response.content_part.added precede the
// first delta (vLLM sends the pair with the first output token itself,
// the simulated engine with the opening events), so the first
// response.output_text.delta (or reasoning, or function-call arguments,
// or a terminal event) fires it. On any other answer it fires at the
// first byte: a chat or completion stream's first chunk carries the first
// token, a whole answer comes after it.
type outputWatch struct {
	responses bool   // an SSE Responses stream: wait past the opening events
	fired     bool   // the first output was seen
	named     bool   // the current event had an event: line
	over      bool   // the current line is past the bound: skipped
	line      []byte // the current line, until its newline
}

// outputLineLimit bounds a line outputWatch holds (a data line without an
// event: line before it, whose type it must parse).
const outputLineLimit = 4 << 20

func newOutputWatch(kind intake.Kind, sse bool) *outputWatch {
	return &outputWatch{responses: sse && kind == intake.Responses}
}

// see reads the answer's next chunk: true once, at the chunk holding the
// first output.
func (w *outputWatch) see(chunk []byte) bool {
	if w == nil || w.fired || len(chunk) == 0 {
		return false
	}
	w.fired = !w.responses || w.scan(chunk)
	return w.fired
}

// scan reads chunk's lines: true at the first line showing an event that
// is not an opening one.
func (w *outputWatch) scan(chunk []byte) bool {
	for len(chunk) > 0 {
		i := bytes.IndexByte(chunk, '\n')
		if i < 0 {
			if !w.over && len(w.line)+len(chunk) <= outputLineLimit {
				w.line = append(w.line, chunk...)
			} else {
				w.line, w.over = w.line[:0], true
			}
			return false
		}
		line := chunk[:i]
		if len(w.line) > 0 {
			line = append(w.line, line...)
		}
		skip := w.over
		w.line, w.over, chunk = w.line[:0], false, chunk[i+1:]
		if !skip && w.output(bytes.TrimRight(line, "\r")) {
			return true
		}
	}
	return false
}

// output reads one SSE line: true when it shows a non-opening event.
func (w *outputWatch) output(l []byte) bool {
	name, value, _ := bytes.Cut(l, []byte(":"))
	value = bytes.TrimSpace(value)
	switch {
	case len(l) == 0: // the event is dispatched
		w.named = false
	case string(name) == "event":
		w.named = true
		return !openingEvent(value)
	case string(name) == "data" && !w.named:
		var ev struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(value, &ev) != nil || ev.Type == "" {
			return true // not an opening event: whatever it is, output or an end
		}
		return !openingEvent([]byte(ev.Type))
	}
	return false
}

// openingEvent reports whether a Responses stream event of type t comes
// before the first output token.
func openingEvent(t []byte) bool {
	switch string(t) {
	case "response.created", "response.in_progress", "response.queued",
		"response.output_item.added", "response.content_part.added":
		return true
	}
	return false
}
