package lab

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/localfleet"
	"github.com/kvroute/kvroute/picker/peers"
	"github.com/kvroute/kvroute/picker/render"
	"github.com/kvroute/kvroute/sidecar/index"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/sched"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
)

// engine is one simulated engine: the scheduler core stepping on the
// virtual clock, and its sidecar's cores (shared by every picker).
type engine struct {
	url     string
	core    *sched.Scheduler
	sidecar *localfleet.Sidecar
	busy    bool // a step is under way or scheduled
	ticking bool // a summary tick is scheduled
	phase   time.Duration
	flights map[sched.ID]*flight
	served  int
	load    sched.Load // the last finished step's, as the engine publishes it
	// stats are the engine's own request figures as its /metrics has them
	// after its last finished step: cumulative, on the virtual clock.
	stats fleet.EngineStats
}

// count adds a finished step to e's request figures, as the engine's
// /metrics counts it: the prompts it admitted, each first token's TTFT,
// and each finished request's queue and prefill times.
func (e *engine) count(st sched.Step) {
	s := &e.stats
	s.PromptTokens += float64(st.PromptTokens)
	s.CachedTokens += float64(st.CachedTokens)
	for _, u := range st.Updates {
		if u.First {
			s.TTFTSeconds += u.TTFT.Seconds()
			s.TTFTCount++
		}
		if u.Finish != "" {
			s.QueueSeconds += u.Queued.Seconds()
			s.QueueCount++
			s.PrefillSeconds += u.Prefill.Seconds()
			s.PrefillCount++
		}
	}
}

// pickerNode is one picker: the real router over its own in-process
// fleet state, with its own bookings.
type pickerNode struct {
	router *picker.Router
	fleet  *localfleet.Fleet
	name   string
	// flushing: a batch of this picker's booking changes is due to go to
	// the other pickers (shared).
	flushing bool
}

// renderer renders as the engines do, in process: every engine of the
// lab's fleet runs the same configuration, so one front end serves. The
// engine the request then goes to parses the same body to the same
// generation, so the run keeps it (run.keep) rather than parse it twice.
// The router may render concurrently (a conversation's anchor beside its
// whole body), so the run keeps only the render of the body being
// decided, under a lock.
type renderer struct{ r *run }

func (rd renderer) Render(_ context.Context, _ string, kind intake.Kind, body []byte) (render.Rendered, error) {
	g, err := rd.r.prepare(pathOf(kind), body)
	if err != nil {
		return render.Rendered{}, &render.RefusedError{Status: enginesim.StatusOf(err), Body: []byte(err.Error())}
	}
	rd.r.keep(body, g)
	return render.Rendered{TokenIDs: g.Prompt, CacheSalt: g.Salt, Via: "lab"}, nil
}

// maxRenders bounds the renders a run remembers (a 6,000-token prompt's
// generation is ≈ 24 KB).
const maxRenders = 2048

// renderKey names a body on a path: its 128-bit hash.
type renderKey xxh3.Uint128

// prepare is the engine front end's Prepare, remembered for the run: a
// body's generation is a pure function of its bytes, and a conversation's
// anchor is rendered again at every turn. Safe for the router's
// concurrent renders.
func (r *run) prepare(path string, body []byte) (*enginesim.Generation, error) {
	k := renderKey(xxh3.Hash128Seed(body, uint64(len(path))*0x9e3779b97f4a7c15^xxh3.HashString(path)))
	r.mu.Lock()
	g, ok := r.renders[k]
	r.mu.Unlock()
	if ok {
		return g, nil
	}
	gen, err := r.front.Prepare(path, body)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if len(r.renders) >= maxRenders {
		clear(r.renders) // bounded: a conversation's anchor comes back soon, or not at all
	}
	r.renders[k] = &gen
	r.mu.Unlock()
	return &gen, nil
}

// pathOf is the generate path of a request kind.
func pathOf(k intake.Kind) string {
	switch k {
	case intake.Chat:
		return "/v1/chat/completions"
	case intake.Responses:
		return "/v1/responses"
	}
	return "/v1/completions"
}

// kindOf is the request kind of a generate path.
func kindOf(path string) (intake.Kind, error) {
	switch path {
	case "/v1/chat/completions":
		return intake.Chat, nil
	case "/v1/completions":
		return intake.Completion, nil
	case "/v1/responses":
		return intake.Responses, nil
	}
	return 0, fmt.Errorf("lab: no generate path %q", path)
}

// engineConfig is the lab's engine configuration, as the bench sizes its
// engines: the profile's latency and chunk budget, n blocks (the
// scenario's capacity, not the profile's), context as long as the cache
// less a block (at most 32,768) unless set.
func engineConfig(prof string, blocks, maxModelLen int) (enginesim.Config, error) {
	ecfg := enginesim.DefaultConfig()
	if prof != "" {
		p, err := profile.Named(prof)
		if err != nil {
			return ecfg, err
		}
		ecfg.Sim.Latency, ecfg.MaxNumBatchedTokens = p, p.MaxNumBatchedTokens
	}
	ecfg.NumGPUBlocks = blocks
	ecfg.MaxModelLen = maxModelLen
	if ecfg.MaxModelLen == 0 {
		ecfg.MaxModelLen = min(32768, (blocks-1)*ecfg.BlockSize)
	}
	ecfg.EnablePromptTokensDetails = true
	return ecfg, nil
}

// build makes the fleet: n engines with their sidecars, and m pickers
// each following every sidecar.
func (r *run) build(n, blocks, cpuBlocks, maxModelLen int, prof string) error {
	ecfg, err := engineConfig(prof, blocks, maxModelLen)
	if err != nil {
		return err
	}
	front, err := enginesim.NewFront(ecfg)
	if err != nil {
		return err
	}
	r.front, r.maxModelLen = front, ecfg.MaxModelLen
	scfg := front.Sched()
	scfg.Cache.EmitEvents = true
	if r.cfg.EnginePriority {
		scfg.Policy = sched.PolicyPriority
	}
	if cpuBlocks > 0 {
		// vLLM's OffloadingConnector with the CPU spec and its P2P tier,
		// at its defaults: an offload block of one GPU block, prompt
		// blocks only, LRU, placeholder CPU events.
		scfg.Cache.CPUBlocks, scfg.Cache.OffloadBlocks, scfg.Cache.OffloadPromptOnly, scfg.Cache.SelfDescribing = cpuBlocks, 1, true, false
	}
	r.latency, r.kvBytesPerToken, r.blockSize = scfg.Latency, scfg.Latency.KVBytesPerToken, scfg.Cache.BlockSize
	params := summary.ForCapacity(cmp.Or(r.cfg.Capacity, index.DefaultCapacity))
	now := r.sim.clock()
	for i := 0; i < n; i++ {
		core, err := sched.New(scfg)
		if err != nil {
			return err
		}
		url := engineURL(i)
		if r.cfg.EngineURLs != nil {
			url = r.cfg.EngineURLs[i]
		}
		id := fleet.Identity{Endpoint: url, Model: ecfg.Model, BlockSize: ecfg.BlockSize, NumGPUBlocks: ecfg.NumGPUBlocks,
			HashAlgo: ecfg.HashAlgo, KeyFormat: blockkey.FormatV1, TokenizerFingerprint: "lab"}
		if cpuBlocks > 0 { // its P2P side channel, as its sidecar's --p2p-port advertises it
			id.KVSource = fmt.Sprintf("engine-%04d:5710", i)
		}
		sc, err := localfleet.NewSidecar(id, params)
		if err != nil {
			return err
		}
		e := &engine{url: url, core: core, sidecar: sc, flights: map[sched.ID]*flight{}, stats: fleet.EngineStats{Have: true},
			phase: time.Duration(i) * r.cfg.Delays.LoadPeriod / time.Duration(n)}
		r.engines = append(r.engines, e)
		r.byURL[url] = e
		if id.KVSource != "" {
			r.bySource[id.KVSource] = e
		}
	}
	for k := 0; k < r.cfg.Pickers; k++ {
		p, err := r.newPicker(params, k)
		if err != nil {
			return err
		}
		for _, e := range r.engines {
			if err := p.fleet.Register(e.sidecar.Identity(), now); err != nil {
				return err
			}
		}
		r.pickers = append(r.pickers, p)
	}
	if r.shared() {
		for _, p := range r.pickers {
			p.router.ShareBookings(true)
		}
	}
	return nil
}

// shared reports whether the run's pickers exchange their bookings.
func (r *run) shared() bool { return r.cfg.Pickers > 1 && !r.cfg.Isolated }

// bookingsChanged is p's shell noticing a change to its bookings: the
// next batch goes to the other pickers Delays.BookingFlush later, with
// every change made by then, as kvroute picker's flush does.
func (r *run) bookingsChanged(p *pickerNode) {
	if !r.shared() || p.flushing {
		return
	}
	p.flushing = true
	r.sim.after(r.cfg.Delays.BookingFlush, func() { r.flushBookings(p) })
}

// flushBookings sends p's booking changes to every other picker, a hop
// away; each batch is lost with Config.BookingLoss's chance. When p's
// journal overflowed, its live bookings go instead (the stream's resend).
func (r *run) flushBookings(p *pickerNode) {
	p.flushing = false
	ops, overflow := p.router.TakeBookings(r.sim.clock())
	if overflow {
		ops = p.router.LiveBookings()
	}
	if len(ops) == 0 {
		return
	}
	for _, q := range r.pickers {
		if q == p || (r.cfg.BookingLoss > 0 && r.lossRNG.Float64() < r.cfg.BookingLoss) {
			continue
		}
		r.sim.after(r.cfg.Delays.Hop, func() { q.router.ApplyBookings(p.name, ops, r.sim.clock()) })
	}
}

// newPicker is picker k: a router as kvroute picker runs it, over an
// in-process fleet on the virtual clock, rendering in process; admission
// off (policy comparisons run without it).
func (r *run) newPicker(params summary.Params, k int) (*pickerNode, error) {
	lcfg := localfleet.DefaultConfig()
	lcfg.Params, lcfg.Clock = params, r.sim.clock
	lf, err := localfleet.New(lcfg)
	if err != nil {
		return nil, err
	}
	pcfg := picker.DefaultConfig()
	pcfg.Score.Policy = r.cfg.Policy
	pcfg.Clock, pcfg.Renderer, pcfg.AccessLog = r.sim.clock, renderer{r}, 0
	// Renders are in process and instant in virtual time: no wall-clock
	// timeout may change a decision (a starved machine would).
	pcfg.TokenizeTimeout = 24 * time.Hour
	pcfg.PolicySeed = r.seed + uint64(k)*1009 // picker 0 draws as the bench's picker does (--policy-seed = the seed)
	pcfg.Admission.MaxWaiting, pcfg.Admission.MaxKVUsage, pcfg.Admission.MaxPrefillTokens = 0, 0, 0
	if r.cfg.NoPulls {
		pcfg.Pulls = false
	}
	pcfg.EnginePriority = r.cfg.EnginePriority && !r.cfg.Policy.IsPeer()
	if r.cfg.Tune != nil {
		r.cfg.Tune(&pcfg)
	}
	lcfg.Health = pcfg.Health
	router, err := picker.NewRouter(pcfg, lf, zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		return nil, err
	}
	if r.cfg.LLMDPeak > 0 {
		if err := router.SetLLMDLoadGate(r.cfg.LLMDPeak, peers.CalibrationTMax); err != nil {
			return nil, err
		}
	}
	return &pickerNode{router: router, fleet: lf, name: fmt.Sprintf("picker-%d", k)}, nil
}

// kick starts e stepping if it is idle.
func (r *run) kick(e *engine) {
	if !e.busy {
		e.busy = true
		r.sim.after(0, func() { r.step(e) })
	}
}

// step runs one engine step at now; its outcome lands at its end, when
// the next step starts.
func (r *run) step(e *engine) {
	st := e.core.Step(r.sim.now)
	for _, lk := range st.Lookups {
		r.sim.at(lk.At, func() { r.lookup(e, lk) })
	}
	if st.Scheduled == 0 && st.Duration == 0 {
		// Nothing to compute; a step may still have looked up a peer,
		// stored pulled blocks or counted pulls. Requests waiting for KV
		// wake the engine when ready.
		r.stepped(e, st)
		e.busy = false
		r.wake(e, st.NextReady)
		return
	}
	r.sim.after(st.Duration, func() {
		r.stepped(e, st)
		r.step(e)
	})
}

// wake kicks e at simulated time at (none when at is 0: nothing waits
// for KV), or at once when that has passed.
func (r *run) wake(e *engine, at time.Duration) {
	if at <= 0 {
		return
	}
	r.sim.at(max(at, r.sim.now), func() { r.kick(e) })
}

// lookup answers e's lookup of a peer at the time it can be used, as the
// P2P tier's side channel does: the source answers from its CPU tier as
// it is then (vLLM's source never touches its GPU), the blocks it holds
// travel over the links (their bandwidth shared with the pulls running
// on either end; a pair's first pull pays the connection), and a pull
// that would outlast vLLM's 30 s load timeout fails into a recompute.
// A source that is gone answers nothing.
func (r *run) lookup(e *engine, lk sched.Lookup) {
	now := r.sim.now
	blocks := 0
	src := r.byURL[lk.Source]
	if src != nil {
		blocks = src.core.ServeLookup(lk.Hashes)
	}
	ready, failed := now, false
	if blocks > 0 {
		end, _ := r.links.Start(src.url, e.url, blocks*r.blockSize, now, r.latency)
		if end-now > transfer.PullTimeout {
			ready, failed, blocks = now+transfer.PullTimeout, true, 0
		} else {
			ready = end
		}
	}
	if err := e.core.Resolve(lk.ID, blocks, ready, failed); err != nil && !errors.Is(err, sched.ErrNoLookup) {
		r.fail(fmt.Errorf("%s: resolve: %w", e.url, err))
	}
	r.wake(e, ready)
}

// stepped publishes a step's events to the sidecar and its tokens to the
// pickers and clients, as the engine does at the step's end.
func (r *run) stepped(e *engine, st sched.Step) {
	e.load = st.Load
	e.count(st)
	if len(st.Events) > 0 {
		b := kvevents.Batch{TS: r.sim.now.Seconds(), Events: st.Events}
		r.sim.after(r.cfg.Delays.EventToIndex, func() {
			if err := e.sidecar.Apply(&b, r.sim.clock()); err != nil {
				r.fail(fmt.Errorf("%s: sidecar: %w", e.url, err))
			}
			r.tick(e)
		})
	}
	for _, u := range st.Updates {
		f := e.flights[u.ID]
		if f == nil {
			continue
		}
		r.token(f, u)
		if u.Finish != "" {
			delete(e.flights, u.ID)
		}
	}
}

// tick sends e's summary changes at its sidecar's next delta tick.
func (r *run) tick(e *engine) {
	if e.ticking {
		return
	}
	e.ticking = true
	di := r.cfg.Delays.DeltaInterval
	next := (r.sim.now/di + 1) * di
	r.sim.at(next, func() {
		e.ticking = false
		ups := e.sidecar.Take()
		if len(ups) == 0 {
			return
		}
		r.sim.after(r.cfg.Delays.SummaryToPicker, func() {
			for _, p := range r.pickers {
				r.receive(p, e, ups)
			}
		})
	})
}

// receive hands a picker's fleet a sidecar's updates; one out of order
// is followed by the sidecar's snapshots, as a restarted stream is.
func (r *run) receive(p *pickerNode, e *engine, ups []localfleet.Update) {
	now := r.sim.clock()
	for _, u := range ups {
		if err := p.fleet.Receive(u, now); err != nil {
			r.resyncs++
			for _, s := range e.sidecar.Snapshots() {
				if err := p.fleet.Receive(s, now); err != nil {
					r.fail(fmt.Errorf("%s: resync: %w", e.url, err))
				}
			}
			return
		}
	}
}

// reportLoads gives every picker each engine's load and request figures,
// every LoadPeriod (each engine at its own phase), while the run is live.
func (r *run) reportLoads(e *engine) {
	l := e.load // the engine's /metrics: its last finished step, not the core mid-step
	load := fleet.Load{Waiting: float64(l.Waiting), Running: float64(l.Running), KVCacheUsage: l.KVUsage, Engine: e.stats}
	r.sim.after(r.cfg.Delays.SummaryToPicker, func() {
		for _, p := range r.pickers {
			p.fleet.SetLoad(e.url, load, r.sim.clock())
		}
	})
	if r.live() {
		r.sim.after(r.cfg.Delays.LoadPeriod, func() { r.reportLoads(e) })
	}
}

// engineURL names engine i. The scheme is no network's: nothing in the
// lab dials an engine.
func engineURL(i int) string { return fmt.Sprintf("lab://engine-%04d", i) }
