package lab

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/predict"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/sched"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
	"github.com/kvroute/kvroute/test/workload"
)

// Outcome is one request as the client saw it, in simulated time.
type Outcome struct {
	Conversation int `json:"conversation"`
	Turn         int `json:"turn"`
	Step         int `json:"step,omitempty"`
	// Tenant is the request's tenant (its fairness key), when it has one.
	Tenant       string `json:"tenant,omitempty"`
	Path         string `json:"path"`
	Picker       int    `json:"picker"`
	Endpoint     string `json:"endpoint,omitempty"`
	PrevEndpoint string `json:"prev_endpoint,omitempty"`
	// Status is the answer's HTTP status (200, or the refusal's).
	Status       int           `json:"status"`
	PromptTokens int           `json:"prompt_tokens"`
	CachedTokens int           `json:"cached_tokens"`
	Start        time.Duration `json:"start_ns"`
	TTFT         time.Duration `json:"ttft_ns"` // to the first output token at the client
	End          time.Duration `json:"end_ns"`
	// PredictedTTFT is what precise predicted, from the dispatch to the
	// first output token at the picker, and DispatchTTFT what that came
	// to (0: nothing predicted: another policy, or a load-only endpoint).
	PredictedTTFT time.Duration `json:"predicted_ttft_ns,omitempty"`
	DispatchTTFT  time.Duration `json:"dispatch_ttft_ns,omitempty"`
	// Where the prompt's KV came from, as the engine reported it with the
	// first token (CachedTokens is their sum): its GPU prefix cache, its
	// own CPU tier (loaded back) and a peer's CPU tier (pulled); the rest
	// was recomputed. Source is the engine the picker named to pull from
	// ("" none) and PulledBytes the bytes that pull moved.
	GPUHitTokens int    `json:"gpu_hit_tokens,omitempty"`
	CPUHitTokens int    `json:"cpu_hit_tokens,omitempty"`
	PulledTokens int    `json:"pulled_tokens,omitempty"`
	Source       string `json:"kv_source,omitempty"`
	PulledBytes  int64  `json:"pulled_bytes,omitempty"`
}

// OK: the request completed.
func (o *Outcome) OK() bool { return o.Status == http.StatusOK }

// run is one lab run: a fleet, a plan, the virtual clock.
type run struct {
	cfg         Config
	seed        uint64
	sim         sim
	rng         *rand.Rand // the Service's spread over the pickers
	lossRNG     *rand.Rand // which batches of bookings are lost (Config.BookingLoss)
	front       *enginesim.Front
	maxModelLen int
	engines     []*engine
	byURL       map[string]*engine
	// bySource finds an engine by its advertised KV source (its P2P side
	// channel); links are the pulls' network, shared by every engine.
	bySource        map[string]*engine
	links           transfer.Links
	latency         profile.Profile
	kvBytesPerToken float64
	blockSize       int // the engines' KV block, in tokens
	pickers         []*pickerNode
	sessions        []*session
	active          int // sessions not over
	inflight        int
	nextID          sched.ID
	outcomes        []*Outcome
	last            map[int]lastTurn // conversation → its latest answered turn
	resyncs         int
	err             error
	// deciding is the body being decided; rendered its generation, once
	// the picker's render made it (keep).
	mu       sync.Mutex
	deciding []byte
	rendered *enginesim.Generation
	renders  map[renderKey]*enginesim.Generation // every body rendered (prepare)
}

// keep keeps g, the render of body, when body is the one being decided.
func (r *run) keep(body []byte, g *enginesim.Generation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(body) > 0 && len(body) == len(r.deciding) && &body[0] == &r.deciding[0] {
		r.rendered = g
	}
}

type lastTurn struct {
	turn     int
	endpoint string
}

// session is a planned session as the run drives it.
type session struct {
	idx     int
	s       workload.Session
	turn    int // the turn of the request in flight or last answered
	over    bool
	waiters []waiter
}

type waiter struct{ session, turn int }

// flight is one request between its send and its end.
type flight struct {
	sess   *session
	req    workload.Request
	kind   intake.Kind
	out    *Outcome
	picker *pickerNode
	pick   *picker.Pick
	tokens []uint32
	gen    *enginesim.Generation // the body as the engine parses it, once rendered
}

func (r *run) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *run) live() bool { return r.active > 0 || r.inflight > 0 }

// Run runs scenario s's plan for o through the fleet cfg describes, in
// virtual time, and returns every request's outcome in the order they
// were sent. An error means the run failed (a component refused what it
// must accept, or the horizon passed).
func Run(cfg Config, s workload.Scenario, o workload.Options) ([]Outcome, error) {
	out, _, err := runWith(cfg, s, o, nil)
	return out, err
}

// RunLearned is Run, with what the first picker's TTFT models learned by
// the end of the run, by identity group.
func RunLearned(cfg Config, s workload.Scenario, o workload.Options) ([]Outcome, map[string]predict.State, error) {
	return runWith(cfg, s, o, nil)
}

// runWith is RunLearned; watch, when not nil, is given the run once its
// fleet is built and before anything happens, to schedule on its clock
// what a test inspects.
func runWith(cfg Config, s workload.Scenario, o workload.Options, watch func(*run)) ([]Outcome, map[string]predict.State, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	f := s.Fleet()
	n, blocks := cfg.Engines, cfg.GPUBlocks
	if n == 0 {
		n = f.Engines
	}
	if blocks == 0 {
		blocks = f.GPUBlocks
	}
	maxLen := cfg.MaxModelLen
	if maxLen == 0 {
		maxLen = f.MaxModelLen
	}
	r := &run{cfg: cfg, seed: o.Seed, byURL: map[string]*engine{}, bySource: map[string]*engine{}, last: map[int]lastTurn{}, renders: map[renderKey]*enginesim.Generation{},
		sim: sim{base: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		rng: rand.New(rand.NewPCG(o.Seed, 0x6c6162)), lossRNG: rand.New(rand.NewPCG(o.Seed, 0x6c6f7373))}
	cpu := cfg.CPUBlocks
	if cpu == 0 {
		cpu = f.CPUBlocks
	}
	prof := cmp.Or(cfg.Profile, f.Profile)
	if err := r.build(n, blocks, cpu, maxLen, prof); err != nil {
		return nil, nil, err
	}
	defer func() {
		for _, p := range r.pickers {
			p.router.Close()
		}
	}()
	o.MaxModelLen = r.maxModelLen
	plan, err := s.Plan(o)
	if err != nil {
		return nil, nil, err
	}
	if watch != nil {
		watch(r)
	}
	r.start(plan)
	for _, e := range r.engines {
		r.sim.at(e.phase, func() { r.reportLoads(e) })
	}
	if !r.sim.run(cfg.Horizon) {
		return nil, nil, fmt.Errorf("lab: the run passed its horizon of %v of simulated time with %d sessions going", cfg.Horizon, r.active)
	}
	if r.err != nil {
		return nil, nil, r.err
	}
	if r.inflight > 0 {
		return nil, nil, fmt.Errorf("lab: %d requests never finished", r.inflight)
	}
	out := make([]Outcome, len(r.outcomes))
	for i, o := range r.outcomes {
		out[i] = *o
	}
	return out, r.pickers[0].router.TTFTModels(), nil
}

// start schedules the plan's sessions.
func (r *run) start(plan workload.Plan) {
	for i, p := range plan.Sessions {
		r.sessions = append(r.sessions, &session{idx: i, s: p.Session})
	}
	r.active = len(r.sessions)
	for i, p := range plan.Sessions {
		s := r.sessions[i]
		if p.After != nil && p.After.Session >= 0 && p.After.Session < len(r.sessions) && p.After.Session != i {
			parent := r.sessions[p.After.Session]
			parent.waiters = append(parent.waiters, waiter{session: i, turn: p.After.Turn})
			continue
		}
		r.sim.at(p.Start, func() { r.next(s, nil) })
	}
}

// next hands s the answer to its last request (nil before the first) and
// sends what it asks next, after its wait.
func (r *run) next(s *session, prev *workload.Answer) {
	req, wait, done := s.s.Next(prev)
	if prev != nil {
		r.release(s, false)
	}
	if done {
		s.over = true
		r.active--
		r.release(s, true)
		return
	}
	r.sim.after(wait, func() { r.send(s, req) })
}

// release starts the sessions waiting on s's turns answered so far (all
// of them when s is over).
func (r *run) release(s *session, all bool) {
	kept := s.waiters[:0]
	for _, w := range s.waiters {
		if all || w.turn <= s.turn {
			b := r.sessions[w.session]
			r.sim.after(0, func() { r.next(b, nil) })
			continue
		}
		kept = append(kept, w)
	}
	s.waiters = kept
}

// send sends a session's request through a picker chosen at random.
func (r *run) send(s *session, req workload.Request) {
	s.turn = req.Turn
	o := &Outcome{Conversation: req.Conversation, Turn: req.Turn, Step: req.Step, Tenant: req.Tenant, Path: req.Path, Start: r.sim.now, PrevEndpoint: req.Prev}
	if o.PrevEndpoint == "" && req.Turn > 1 {
		o.PrevEndpoint = r.last[req.Conversation].endpoint
	}
	o.Picker = r.rng.IntN(len(r.pickers))
	r.outcomes = append(r.outcomes, o)
	r.inflight++
	f := &flight{sess: s, req: req, out: o, picker: r.pickers[o.Picker]}
	kind, err := kindOf(req.Path)
	if err != nil {
		r.fail(err)
		r.answer(f, http.StatusNotFound)
		return
	}
	f.kind = kind
	r.sim.after(r.cfg.Delays.Render, func() { r.decide(f) })
}

// decide is the picker's route, its five steps at one virtual instant
// (the render's time was the wait before it).
func (r *run) decide(f *flight) {
	rt := f.picker.router
	now := r.sim.clock()
	// The tenant is the request's fairness key, as x-kvroute-tenant makes
	// it (the lab runs no admission: only --engine-priority reads it).
	opt := picker.PickOptions{Carried: true, Fairness: picker.Fairness{Tenant: f.req.Tenant}}
	r.mu.Lock()
	r.deciding, r.rendered = f.req.Body, nil
	r.mu.Unlock()
	p, err := rt.Prepare(context.Background(), f.kind, f.req.Body)
	r.mu.Lock()
	f.gen, r.deciding, r.rendered = r.rendered, nil, nil
	r.mu.Unlock()
	if err != nil {
		r.answer(f, statusOf(err))
		return
	}
	pick, err := rt.Decide(p, rt.Snapshot(p, opt, now), opt, now)
	if err != nil {
		r.answer(f, statusOf(err))
		return
	}
	rt.Book(pick, opt, now)
	r.bookingsChanged(f.picker)
	f.pick = pick
	e := r.byURL[pick.Endpoint]
	if e == nil {
		r.fail(fmt.Errorf("lab: the picker chose %q, no engine of the fleet", pick.Endpoint))
		r.answer(f, http.StatusBadGateway)
		return
	}
	f.out.Endpoint = e.url
	r.sim.after(r.cfg.Delays.Hop, func() { r.arrive(e, f) })
}

// arrive puts f in engine e, as the engine's HTTP front end does.
func (r *run) arrive(e *engine, f *flight) {
	g := f.gen
	if g == nil {
		var err error
		if g, err = r.prepare(f.req.Path, f.req.Body); err != nil {
			r.back(f, func() { r.done(f, enginesim.StatusOf(err)) })
			return
		}
	}
	r.nextID++
	id := r.nextID
	// The proxy's remote_kv_source, as the engine's connector reads it:
	// the source engine's side channel (here, its name).
	source := ""
	if f.pick != nil && f.pick.KVSource != "" {
		if src := r.bySource[f.pick.KVSource]; src != nil && src != e {
			source = src.url
			f.out.Source = src.url
		}
	}
	priority := 0 // the proxy sets the pick's priority in the body it forwards
	if f.pick != nil && f.pick.Priority != nil {
		priority = *f.pick.Priority
	}
	if err := e.core.Add(sched.Request{ID: id, Prompt: g.Prompt, LoRA: g.LoRA, LoraID: g.LoraID, Salt: g.Salt,
		MaxTokens: g.MaxTokens, IgnoreEOS: g.IgnoreEOS, Source: source, Priority: priority}, r.sim.now); err != nil {
		r.back(f, func() { r.done(f, http.StatusBadRequest) })
		return
	}
	e.flights[id] = f
	e.served++
	f.out.PromptTokens = len(g.Prompt)
	if f.kind == intake.Responses {
		// response.created goes out at once: the picker's first byte.
		r.back(f, func() {
			f.picker.router.FirstChunk(f.pick, r.sim.clock())
			r.bookingsChanged(f.picker)
		})
	}
	r.kick(e)
}

// back runs fn when what the engine sent now reaches the picker (and the
// client: the client's own hop to the picker is not modelled).
func (r *run) back(f *flight, fn func()) { r.sim.after(r.cfg.Delays.Hop, fn) }

// token is one output token of f from its engine's step.
func (r *run) token(f *flight, u sched.Update) {
	f.tokens = append(f.tokens, u.Token)
	if u.First {
		f.out.CachedTokens = u.CachedTokens
		f.out.GPUHitTokens, f.out.CPUHitTokens, f.out.PulledTokens = u.GPUHitTokens, u.CPUHitTokens, u.PulledTokens
		f.out.PulledBytes = int64(float64(u.PulledTokens) * r.kvBytesPerToken)
		r.back(f, func() {
			now := r.sim.clock()
			f.out.TTFT = r.sim.now - f.out.Start
			if f.kind != intake.Responses {
				f.picker.router.FirstChunk(f.pick, now)
			}
			f.picker.router.FirstToken(f.pick, now)
			r.bookingsChanged(f.picker)
			if f.pick.PredictedTTFTMs > 0 {
				f.out.PredictedTTFT = time.Duration(f.pick.PredictedTTFTMs * float64(time.Millisecond))
				f.out.DispatchTTFT = f.pick.ObservedTTFT
			}
		})
	}
	if u.Finish != "" {
		r.back(f, func() { r.done(f, http.StatusOK) })
	}
}

// done ends f at the picker and answers its client.
func (r *run) done(f *flight, status int) {
	if f.pick != nil {
		f.picker.router.Done(f.pick)
		r.bookingsChanged(f.picker)
	}
	r.answer(f, status)
}

// answer ends f for its client with status and hands its session the
// answer.
func (r *run) answer(f *flight, status int) {
	o := f.out
	o.Status, o.End = status, r.sim.now
	if o.TTFT == 0 && status == http.StatusOK {
		o.TTFT = o.End - o.Start
	}
	r.inflight--
	a := &workload.Answer{Endpoint: o.Endpoint, PromptTokens: o.PromptTokens, OK: status == http.StatusOK}
	if a.OK {
		a.Text = enginesim.Text(f.tokens)
		if lt := r.last[o.Conversation]; o.Turn > lt.turn {
			r.last[o.Conversation] = lastTurn{turn: o.Turn, endpoint: o.Endpoint}
		}
	}
	r.next(f.sess, a)
}

// statusOf is a refusal's HTTP status.
func statusOf(err error) int {
	var ie *intake.Error
	if errors.As(err, &ie) {
		return ie.Status
	}
	return http.StatusInternalServerError
}
