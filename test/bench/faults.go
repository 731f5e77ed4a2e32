package bench

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
	"github.com/kvroute/kvroute/test/workload"
)

// The faults scenario's orchestration: its options, the run (the process
// fleet, the client and its view of the pickers, the load) and the fault
// matrix's schedule. How each fault is injected is faultinject.go's; what
// is measured and reported, faultfigures.go's; the pure rules they apply,
// faultrules.go's.

// FaultNames are the faults of the faults scenario, in schedule order.
var FaultNames = []string{"engine-sigkill", "engine-sigstop", "reset-prefix-cache", "event-loss", "sidecar-sigkill",
	"picker-sigterm", "picker-sigkill", "gossip-partition"}

// FaultsOptions shape `kvroute bench --scenario faults`. Zero fields take
// the defaults in brackets.
type FaultsOptions struct {
	// Bin is the kvroute binary the fleet's processes run [the running
	// binary, os.Executable()].
	Bin string
	// Faults are the faults to inject, in FaultNames' order [all]; an
	// empty, non-nil list injects none (a steady run of the same fleet).
	Faults []string
	// Engines [4, at least 4] and Pickers [2, at least 2].
	Engines, Pickers int
	GPUBlocks        int // KV blocks per engine [1024]
	// Sessions are the agent sessions running at once, each followed by a
	// new one when it ends [8].
	Sessions int
	// Warmup is the load before the first fault, Gap the load between a
	// fault's end and the next fault, and after the last one, in scenario
	// time [40 s, 45 s]. The hit-rate windows before and after a fault are
	// 30 s, or Gap or Warmup when shorter.
	Warmup, Gap time.Duration
	// DrainDelay is the pickers' --drain-delay (wall time) [2 s].
	DrainDelay time.Duration
	// Duration, when set, runs the load for this long (wall time) in all:
	// after the schedule the load goes on until then, and faults not
	// reached by then are left out.
	Duration time.Duration
	// LogDir holds every process's output [a temporary directory, removed
	// unless the run fails].
	LogDir string
}

func (o FaultsOptions) withDefaults() (FaultsOptions, error) {
	o.Engines, o.Pickers = cmp.Or(o.Engines, 4), cmp.Or(o.Pickers, 2)
	o.GPUBlocks, o.Sessions = cmp.Or(o.GPUBlocks, 1024), cmp.Or(o.Sessions, 8)
	o.Warmup, o.Gap = cmp.Or(o.Warmup, 40*time.Second), cmp.Or(o.Gap, 45*time.Second)
	o.DrainDelay = cmp.Or(o.DrainDelay, 2*time.Second)
	if o.Faults == nil {
		o.Faults = FaultNames
	}
	for _, f := range o.Faults {
		if !slices.Contains(FaultNames, f) {
			return o, fmt.Errorf("fault %q: want %s", f, strings.Join(FaultNames, ", "))
		}
	}
	if o.Engines < 4 || o.Pickers < 2 || o.Sessions < 1 || o.GPUBlocks < 64 || o.Warmup < 0 || o.Gap <= 0 || o.Duration < 0 {
		return o, fmt.Errorf("faults scenario: want ≥ 4 engines, ≥ 2 pickers, ≥ 1 session, ≥ 64 blocks, positive windows (%+v)", o)
	}
	if o.Bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return o, fmt.Errorf("faults scenario: the kvroute binary: %w", err)
		}
		o.Bin = exe
	}
	return o, nil
}

// faultLoad is the faults scenario's load: Sessions agent sessions of the
// demo's shape (agentic-pressure's session model without branches), each
// followed by a new one, until stop.
func faultLoad(engines int) AgenticPressure {
	a := Demo()
	a.Label, a.Engines, a.BranchPercent = "faults", engines, -1
	return a.withDefaults()
}

// pickerPool spreads requests over pickers round-robin, as a Service
// does, among those whose /readyz (on their admin port) answered 200 to
// the last probe (all when none did).
type pickerPool struct {
	bases   []string
	admins  []string // each picker's admin surface, where /readyz is
	ready   []atomic.Bool
	rr      atomic.Uint64
	refused atomic.Int64
}

func newPickerPool(bases, admins []string) *pickerPool {
	p := &pickerPool{bases: bases, admins: admins, ready: make([]atomic.Bool, len(bases))}
	for i := range p.ready {
		p.ready[i].Store(true)
	}
	return p
}

func (p *pickerPool) next() string {
	n := uint64(len(p.bases))
	start := p.rr.Add(1)
	for k := uint64(0); k < n; k++ {
		if i := (start + k) % n; p.ready[i].Load() {
			return p.bases[i]
		}
	}
	return p.bases[start%n]
}

// inRotation is nil once base is out of the rotation (its last probe
// failed).
func (p *pickerPool) inRotation(base string) error {
	for i, b := range p.bases {
		if b == base && p.ready[i].Load() {
			return fmt.Errorf("%s still in rotation", base)
		}
	}
	return nil
}

// probe is the Service's readiness probe: every 200 ms, each picker's
// /readyz, until ctx ends.
func (p *pickerPool) probe(ctx context.Context) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		for i, a := range p.admins {
			p.ready[i].Store(httpOK(ctx, a+"/readyz") == nil)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunFaults runs the faults scenario: a fleet of real processes (4
// engines, a sidecar each, 2 pickers, gossip), agentic load spread over
// both pickers, and the faults injected one after another.
func RunFaults(ctx context.Context, o Options, fo FaultsOptions) (*Results, error) {
	fo, err := fo.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.Engines > 0 {
		fo.Engines = max(4, o.Engines)
	}
	if o.GPUBlocks > 0 {
		fo.GPUBlocks = o.GPUBlocks
	}
	scale := o.TimeScale
	if scale <= 0 {
		scale = 1
	}
	keepLogs := fo.LogDir != ""
	if fo.LogDir == "" {
		if fo.LogDir, err = os.MkdirTemp("", "kvroute-faults-"); err != nil {
			return nil, err
		}
	}
	mml := min(32768, (fo.GPUBlocks-1)*16)
	f, err := startProcFleet(ctx, procFleetConfig{Bin: fo.Bin, Engines: fo.Engines, Pickers: fo.Pickers, GPUBlocks: fo.GPUBlocks,
		MaxModelLen: mml, TimeScale: o.TimeScale, DrainDelay: fo.DrainDelay, LogDir: fo.LogDir, Ready: 60 * time.Second})
	if err != nil {
		return nil, err
	}
	failed := true
	defer func() {
		f.Close()
		if !failed && !keepLogs {
			os.RemoveAll(fo.LogDir)
		}
	}()
	r := newFaultRun(ctx, o, fo, f, scale, mml)
	defer r.stopBG()
	r.watch(o.SampleEvery)
	r.startLoad(ctx, o.Seed)
	faults, skipped, runErr := r.schedule(ctx)
	run := r.stop()
	if runErr != nil {
		return nil, fmt.Errorf("%w (process logs in %s)", runErr, fo.LogDir)
	}
	run.faults, run.skipped = faults, skipped
	res := faultResults(o.Seed, fo, run, min(30*time.Second, fo.Gap, cmp.Or(fo.Warmup, fo.Gap)))
	failed = false
	return res, nil
}

// faultRun is one run of the faults scenario on its process fleet: the
// client spreading the load over the pickers, the background work
// watching the fleet (the client's readiness probes, the outcome
// counters, the resource samples) and the load's sessions.
type faultRun struct {
	fo     FaultsOptions
	f      *procFleet
	client *Client
	load   AgenticPressure
	scale  float64
	start  time.Time // the load's start: scenario time 0

	bg        context.Context // the background work's, cancelled by stopBG
	stopBG    context.CancelFunc
	bgWG      sync.WaitGroup
	counters  *outcomeCounters
	resources chan *ResourceReport

	stopAt   atomic.Int64 // when the sessions stop (Unix ns)
	loadWG   sync.WaitGroup
	outMu    sync.Mutex
	outcomes []Outcome
}

// newFaultRun sets up the client over f's pickers (progress reported to
// o.Progress) and starts its readiness probes.
func newFaultRun(ctx context.Context, o Options, fo FaultsOptions, f *procFleet, scale float64, maxModelLen int) *faultRun {
	var bases, admins []string
	for _, p := range f.pickers {
		bases, admins = append(bases, p.url), append(admins, p.admin)
	}
	r := &faultRun{fo: fo, f: f, client: NewClient(""), load: faultLoad(fo.Engines), scale: scale}
	r.client.pool = newPickerPool(bases, admins)
	r.client.TimeScale, r.client.MaxModelLen = scale, maxModelLen
	var done atomic.Int64
	if o.Progress != nil {
		r.client.done = func() { o.Progress("faults", int(done.Add(1))) }
	}
	r.bg, r.stopBG = context.WithCancel(ctx)
	r.bgWG.Add(1)
	go func() { defer r.bgWG.Done(); r.client.pool.probe(r.bg) }()
	return r
}

// watch starts the clock (start) and the background sampling: the
// pickers' outcome counters every second, the processes' resources
// every sampleEvery (resourcePeriod).
func (r *faultRun) watch(sampleEvery time.Duration) {
	r.start = time.Now()
	r.counters = newOutcomeCounters(r.f.pickers, func(t time.Time) float64 { return t.Sub(r.start).Seconds() / r.scale })
	r.bgWG.Add(1)
	go func() { defer r.bgWG.Done(); r.counters.run(r.bg) }()
	var comps []resourceSource
	for i, p := range r.f.pickers {
		comps = append(comps, resourceSource{name: fmt.Sprint("picker-", i), kind: "picker", pid: p.p.pid, metrics: p.admin + "/metrics"})
	}
	for i, e := range r.f.engines {
		comps = append(comps, resourceSource{name: fmt.Sprint("sidecar-", i), kind: "sidecar", pid: e.sidecar.pid, metrics: e.sidecarDebug + "/metrics"})
	}
	r.resources = make(chan *ResourceReport, 1)
	go func() { r.resources <- sampleResources(r.bg, comps, r.start, resourcePeriod(sampleEvery)) }()
}

// startLoad starts fo.Sessions agent sessions at once, each followed by a
// new one when it ends, until stopAt (a day away until stop sets it).
func (r *faultRun) startLoad(ctx context.Context, seed uint64) {
	r.stopAt.Store(r.start.Add(24 * time.Hour).UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	types, _ := r.load.plan(rng)
	salts := make([]string, r.load.Tenants)
	for t := range salts {
		salts[t] = fmt.Sprintf("tenant-%d-%016x", t, rng.Uint64())
	}
	for w := 0; w < r.fo.Sessions; w++ {
		r.loadWG.Add(1)
		seed := rng.Uint64()
		go func() {
			defer r.loadWG.Done()
			wr := rand.New(rand.NewPCG(seed, uint64(w)))
			for k := 0; time.Now().UnixNano() < r.stopAt.Load() && ctx.Err() == nil; k++ {
				if k == 0 && !r.client.Wait(ctx, time.Duration(wr.Int64N(int64(r.load.Start)+1))) {
					return
				}
				outs := runFaultSession(ctx, r.client, r.load, types, salts, wr, w*100000+k, &r.stopAt)
				r.outMu.Lock()
				r.outcomes = append(r.outcomes, outs...)
				r.outMu.Unlock()
			}
		}()
	}
}

// schedule is the fault matrix: the warmup, then each fault in turn —
// injected, held, undone, and followed by a gap of load — skipping
// those that would end past fo.Duration, then the load until
// fo.Duration.
func (r *faultRun) schedule(ctx context.Context) (faults []injected, skipped []string, err error) {
	fo, client := r.fo, r.client
	if !client.Wait(ctx, fo.Warmup) {
		return faults, skipped, ctx.Err()
	}
	for _, name := range fo.Faults {
		if fo.Duration > 0 && time.Since(r.start)+client.Wall(fo.Gap) > fo.Duration {
			skipped = append(skipped, name)
			continue
		}
		in, err := inject(ctx, r.f, client, name)
		if err != nil {
			return faults, skipped, fmt.Errorf("fault %s: %w", name, err)
		}
		faults = append(faults, in)
		if !client.WaitUntil(ctx, in.restored.Add(client.Wall(fo.Gap))) {
			return faults, skipped, ctx.Err()
		}
	}
	if fo.Duration > 0 && !client.WaitUntil(ctx, r.start.Add(fo.Duration)) {
		return faults, skipped, ctx.Err()
	}
	return faults, skipped, nil
}

// stop ends the load now, waits for the sessions and the background work
// to end, and hands over what was collected.
func (r *faultRun) stop() faultsRun {
	end := time.Now()
	r.stopAt.Store(end.UnixNano())
	r.loadWG.Wait()
	r.stopBG()
	r.bgWG.Wait()
	res := <-r.resources
	var engines []string
	for _, e := range r.f.engines {
		engines = append(engines, e.url)
	}
	outcomes := r.outcomes
	slices.SortStableFunc(outcomes, func(x, y Outcome) int { return x.Start.Compare(y.Start) })
	for k := range outcomes {
		outcomes[k].Body, outcomes[k].Tokens = nil, nil
	}
	return faultsRun{outcomes: outcomes, snaps: r.counters.taken(), resources: res, start: r.start, end: end, scale: r.scale,
		retries: int(r.client.pool.refused.Load()), engines: engines}
}

// runFaultSession runs one agent session (no branches) of the load's
// shape until its last turn, its first failure, or stop.
func runFaultSession(ctx context.Context, c *Client, a AgenticPressure, types []agentType, salts []string, rng *rand.Rand, id int, stop *atomic.Int64) []Outcome {
	t, salt := types[rng.IntN(len(types))], salts[rng.IntN(len(salts))]
	turns := a.MinTurns + rng.IntN(a.MaxTurns-a.MinTurns+1)
	input := []any{map[string]any{"role": "user", "content": fmt.Sprintf("Task %d: ", id) + workload.Text(rng, 60+rng.IntN(200))}}
	var outs []Outcome
	prev := ""
	for turn := 1; turn <= turns && time.Now().UnixNano() < stop.Load(); turn++ {
		o, answer := c.Responses(ctx, map[string]any{"model": "Qwen/Qwen3-0.6B", "instructions": t.instructions, "tools": t.tools,
			"input": input, "max_output_tokens": a.OutputTokens, "cache_salt": salt})
		o.Conversation, o.Turn, o.PrevEndpoint = id, turn, prev
		outs = append(outs, o)
		if o.Err != nil {
			return outs
		}
		prev = o.Endpoint
		call := fmt.Sprintf("call_%d_%d", id, turn)
		args := fmt.Sprintf(`{"query":%q,"limit":%d}`, workload.Words(rng, 6), 1+rng.IntN(50))
		out := toolOutput(rng, call, a.ToolMin+rng.IntN(a.ToolMax-a.ToolMin+1))
		input = append(input,
			map[string]any{"type": "message", "role": "assistant", "content": answer},
			map[string]any{"type": "function_call", "call_id": call, "name": t.toolNames[rng.IntN(len(t.toolNames))], "arguments": args}, out)
		history := o.PromptTokens + len(chat.Encode(answer)) + len(chat.Encode(args)) + len(chat.Encode(out["output"].(string)))
		if c.MaxModelLen > 0 && history+100+a.OutputTokens > c.MaxModelLen {
			return outs
		}
		think := a.Think/4 + time.Duration(rng.Int64N(int64(a.Think-a.Think/4)+1))
		until := time.Now().Add(c.Wall(think))
		if s := time.Unix(0, stop.Load()); s.Before(until) {
			until = s
		}
		if !c.WaitUntil(ctx, until) {
			return outs
		}
	}
	return outs
}
