package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

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

// Fault figures (results.json "faults").
type FaultsResult struct {
	Rule              string `json:"classification_rule"`
	Requests          int    `json:"requests"`
	RouterFailed      int    `json:"router_failed"`
	UnavoidableFailed int    `json:"unavoidable_failed"`
	// ClientRetries are refused connections the client retried on the
	// other picker (not failures).
	ClientRetries int `json:"client_retries_refused"`
	// Baseline are the failures before the first fault.
	Baseline struct {
		RouterFailed      int      `json:"router_failed"`
		UnavoidableFailed int      `json:"unavoidable_failed"`
		FailureSamples    []string `json:"failure_samples,omitempty"`
	} `json:"baseline"`
	WindowSeconds float64       `json:"window_s"` // the before and after windows
	Faults        []FaultResult `json:"faults"`
	Skipped       []string      `json:"skipped,omitempty"` // faults past --duration
	Timeline      FaultTimeline `json:"timeline"`
}

// FaultResult is one fault's figures; times in scenario seconds since the
// load started.
type FaultResult struct {
	Name     string  `json:"name"`
	Target   string  `json:"target"`
	Injected float64 `json:"injected_s"`
	Restored float64 `json:"restored_s"` // the fault undone (restarted and ready, resumed, healed); = injected for a one-shot fault
	// Requests failed from this fault's injection to the next one's.
	RouterFailed      int      `json:"router_failed"`
	UnavoidableFailed int      `json:"unavoidable_failed"`
	FailureSamples    []string `json:"failure_samples,omitempty"`
	// InFlight are the requests in flight on the target engine or through
	// the target picker at the injection, and InFlightFailed those of
	// them that failed (for a drain: must be 0).
	InFlight       *int `json:"in_flight_at_injection,omitempty"`
	InFlightFailed *int `json:"in_flight_failed,omitempty"`
	// Hit rates of the requests starting in the window before the
	// injection and in the window after the restore.
	HitRateBefore  float64 `json:"hit_rate_before"`
	RequestsBefore int     `json:"requests_before"`
	HitRateAfter   float64 `json:"hit_rate_after"`
	RequestsAfter  int     `json:"requests_after"`
	// Recovery is the time from the restore until the hit rate is back
	// within 5% of before (recoveryTime); null when it is not before the
	// next fault.
	Recovery *float64 `json:"recovery_s"`
	// Outcomes are the pickers' kvroute_picker_outcomes_total grown from
	// the recovery (or the end of the after window when not recovered)
	// to the next fault, summed over the pickers; AsPredicted is the
	// share of as_predicted among them.
	Outcomes    map[string]int `json:"outcomes_after_recovery"`
	AsPredicted float64        `json:"as_predicted_share_after_recovery"`
}

// FaultTimeline is the run in buckets of scenario time: the hit rate of
// the requests starting in each, and the failures (by when they failed).
type FaultTimeline struct {
	Seconds     []float64 `json:"t_s"` // bucket middles
	HitRate     []float64 `json:"hit_rate"`
	Requests    []int     `json:"requests"`
	Router      []int     `json:"router_failed"`
	Unavoidable []int     `json:"unavoidable_failed"`
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

// died is when the fault's process was seen dead (its injection for a
// fault without an incident or a stop).
func (f injected) died() time.Time {
	if f.incident != nil && !f.incident.Until.IsZero() {
		return f.incident.Until
	}
	return f.at
}

// injected is a fault as it happened.
type injected struct {
	name, target       string
	at, restored       time.Time
	incident           *Incident
	inFlightOn, picker string // the engine or picker whose in-flight requests are counted
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
	load := faultLoad(fo.Engines)
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
	var bases, admins, engines []string
	for _, p := range f.pickers {
		bases, admins = append(bases, p.url), append(admins, p.admin)
	}
	for _, e := range f.engines {
		engines = append(engines, e.url)
	}
	client := NewClient("")
	client.pool = newPickerPool(bases, admins)
	client.TimeScale, client.MaxModelLen = scale, mml
	var done atomic.Int64
	if o.Progress != nil {
		client.done = func() { o.Progress("faults", int(done.Add(1))) }
	}
	bg, stopBG := context.WithCancel(ctx)
	defer stopBG()
	var bgWG sync.WaitGroup
	bgWG.Add(1)
	go func() { defer bgWG.Done(); client.pool.probe(bg) }()

	start := time.Now()
	sim := func(t time.Time) float64 { return t.Sub(start).Seconds() / scale }
	// The pickers' outcome counters, every second, and the processes'
	// resources.
	var snapMu sync.Mutex
	var snaps []counterSnap
	tracks := make([]counterTrack, len(f.pickers))
	scrape := func() {
		sum := map[string]float64{}
		for i, p := range f.pickers {
			vals, err := scrapeCounter(bg, p.admin+"/metrics", "kvroute_picker_outcomes_total", "outcome")
			if err != nil {
				vals = tracks[i].last // down: nothing new
			}
			for k, v := range tracks[i].observe(vals) {
				sum[k] += v
			}
		}
		snapMu.Lock()
		snaps = append(snaps, counterSnap{T: sim(time.Now()), Totals: sum})
		snapMu.Unlock()
	}
	bgWG.Add(1)
	go func() {
		defer bgWG.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			scrape()
			select {
			case <-bg.Done():
				return
			case <-t.C:
			}
		}
	}()
	var comps []resourceSource
	for i, p := range f.pickers {
		comps = append(comps, resourceSource{name: fmt.Sprint("picker-", i), kind: "picker", pid: p.p.pid, metrics: p.admin + "/metrics"})
	}
	for i, e := range f.engines {
		comps = append(comps, resourceSource{name: fmt.Sprint("sidecar-", i), kind: "sidecar", pid: e.sidecar.pid, metrics: e.sidecarDebug + "/metrics"})
	}
	resources := make(chan *ResourceReport, 1)
	go func() { resources <- sampleResources(bg, comps, start, resourcePeriod(o.SampleEvery)) }()

	// The load.
	var stopAt atomic.Int64
	stopAt.Store(start.Add(24 * time.Hour).UnixNano())
	rng := rand.New(rand.NewPCG(o.Seed, 1))
	types, _ := load.plan(rng)
	salts := make([]string, load.Tenants)
	for t := range salts {
		salts[t] = fmt.Sprintf("tenant-%d-%016x", t, rng.Uint64())
	}
	var outMu sync.Mutex
	var outcomes []Outcome
	var loadWG sync.WaitGroup
	for w := 0; w < fo.Sessions; w++ {
		loadWG.Add(1)
		seed := rng.Uint64()
		go func() {
			defer loadWG.Done()
			wr := rand.New(rand.NewPCG(seed, uint64(w)))
			for k := 0; time.Now().UnixNano() < stopAt.Load() && ctx.Err() == nil; k++ {
				if k == 0 && !client.Wait(ctx, time.Duration(wr.Int64N(int64(load.Start)+1))) {
					return
				}
				outs := runFaultSession(ctx, client, load, types, salts, wr, w*100000+k, &stopAt)
				outMu.Lock()
				outcomes = append(outcomes, outs...)
				outMu.Unlock()
			}
		}()
	}

	// The schedule.
	var faults []injected
	var skipped []string
	runErr := func() error {
		if !client.Wait(ctx, fo.Warmup) {
			return ctx.Err()
		}
		for _, name := range fo.Faults {
			if fo.Duration > 0 && time.Since(start)+client.Wall(fo.Gap) > fo.Duration {
				skipped = append(skipped, name)
				continue
			}
			in, err := inject(ctx, f, client, name)
			if err != nil {
				return fmt.Errorf("fault %s: %w", name, err)
			}
			faults = append(faults, in)
			if !client.WaitUntil(ctx, in.restored.Add(client.Wall(fo.Gap))) {
				return ctx.Err()
			}
		}
		if fo.Duration > 0 && !client.WaitUntil(ctx, start.Add(fo.Duration)) {
			return ctx.Err()
		}
		return nil
	}()
	end := time.Now()
	stopAt.Store(end.UnixNano())
	loadWG.Wait()
	stopBG()
	bgWG.Wait()
	res := <-resources
	if runErr != nil {
		return nil, fmt.Errorf("%w (process logs in %s)", runErr, fo.LogDir)
	}
	elapsed := end.Sub(start)
	slices.SortStableFunc(outcomes, func(x, y Outcome) int { return x.Start.Compare(y.Start) })
	for k := range outcomes {
		outcomes[k].Body, outcomes[k].Tokens = nil, nil
	}
	fr := faultFigures(outcomes, faults, snaps, start, end, scale, min(30*time.Second, fo.Gap, cmp.Or(fo.Warmup, fo.Gap)))
	fr.ClientRetries, fr.Skipped = int(client.pool.refused.Load()), skipped

	r := &Results{Scenario: "faults", Seed: o.Seed, Policies: map[string]*PolicyResult{}, scale: scale, origin: start}
	r.Fleet.Engines, r.Fleet.GPUBlocksPerEngine, r.Fleet.BlockSize = fo.Engines, fo.GPUBlocks, 16
	r.WarmReturnChance = 1 / float64(fo.Engines)
	pr := summarize(outcomes, engines, elapsed, scale)
	pr.HitRateOverTime = hitRateOverTime(outcomes, start, elapsed, scale)
	pr.Resources = res
	pr.Outcomes = countsBetween(snaps, -1, 1e18)
	pr.Decisions = map[string]int{}
	total, wrong := 0, pr.Outcomes["fewer_cached_than_predicted"]+pr.Outcomes["another_endpoint_held_more"]
	for _, n := range pr.Outcomes {
		total += n
	}
	if total > 0 {
		pr.WrongPodRate = float64(wrong) / float64(total)
	}
	r.Policies["precise"], r.Order = pr, []string{"precise"}
	r.Faults, r.DurationSeconds = fr, fo.Duration.Seconds()
	r.requests = []policyOutcomes{{"precise", outcomes}}
	failed = false
	return r, nil
}

// runFaultSession runs one agent session (no branches) of the load's
// shape until its last turn, its first failure, or stop.
func runFaultSession(ctx context.Context, c *Client, a AgenticPressure, types []agentType, salts []string, rng *rand.Rand, id int, stop *atomic.Int64) []Outcome {
	t, salt := types[rng.IntN(len(types))], salts[rng.IntN(len(salts))]
	turns := a.MinTurns + rng.IntN(a.MaxTurns-a.MinTurns+1)
	input := []any{map[string]any{"role": "user", "content": fmt.Sprintf("Task %d: ", id) + text(rng, 60+rng.IntN(200))}}
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
		args := fmt.Sprintf(`{"query":%q,"limit":%d}`, words(rng, 6), 1+rng.IntN(50))
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

// Fault holds, in scenario time: how long a killed process stays down, a
// stopped one stopped, event loss and a partition last. A partition lasts
// at least partitionWall of wall time, for gossip's failure detector.
const (
	downHold      = 5 * time.Second
	eventLossHold = 20 * time.Second
	partitionHold = 15 * time.Second
	partitionWall = 10 * time.Second
	readyBound    = 60 * time.Second
)

// inject injects the named fault, holds it, undoes it and waits until the
// fleet is back (restored).
func inject(ctx context.Context, f *procFleet, c *Client, name string) (injected, error) {
	in := injected{name: name}
	hold := func(d time.Duration) bool { return c.Wait(ctx, d) }
	n := len(f.engines)
	switch name {
	case "engine-sigkill":
		e := f.engines[1%n]
		in.target, in.inFlightOn = e.url, e.url
		in.at = time.Now()
		in.incident = &Incident{Kind: IncidentEngine, Target: e.url, At: in.at}
		if err := e.engine.signal(syscall.SIGKILL); err != nil {
			return in, err
		}
		if err := e.engine.wait(10 * time.Second); err != nil {
			return in, err
		}
		in.incident.Until = time.Now()
		if !hold(downHold) {
			return in, ctx.Err()
		}
		if err := e.engine.start(); err != nil {
			return in, err
		}
		if err := await(ctx, readyBound, func() error { return httpOK(ctx, e.url+"/health") }); err != nil {
			return in, err
		}
	case "engine-sigstop":
		e := f.engines[2%n]
		in.target, in.inFlightOn = e.url, e.url
		in.at = time.Now()
		in.incident = &Incident{Kind: IncidentEngine, Target: e.url, At: in.at}
		if err := e.engine.signal(syscall.SIGSTOP); err != nil {
			return in, err
		}
		ok := hold(downHold)
		if err := e.engine.signal(syscall.SIGCONT); err != nil || !ok {
			return in, cmp.Or(err, ctx.Err())
		}
	case "reset-prefix-cache":
		e := f.engines[3%n]
		in.target, in.at = e.url, time.Now()
		if err := postJSON(ctx, e.url+"/reset_prefix_cache?reset_running_requests=true", nil); err != nil {
			return in, err
		}
	case "event-loss":
		in.target, in.at = "every engine (10% of event batches dropped, replay on)", time.Now()
		for _, e := range f.engines {
			if err := postJSON(ctx, e.url+"/sim/faults", map[string]any{"drop_events_pct": 10}); err != nil {
				return in, err
			}
		}
		ok := hold(eventLossHold)
		for _, e := range f.engines {
			if err := postJSON(ctx, e.url+"/sim/faults", map[string]any{"drop_events_pct": 0}); err != nil {
				return in, err
			}
		}
		if !ok {
			return in, ctx.Err()
		}
	case "sidecar-sigkill":
		e := f.engines[2%n]
		in.target, in.at = "sidecar of "+e.url, time.Now()
		if err := e.sidecar.signal(syscall.SIGKILL); err != nil {
			return in, err
		}
		if err := e.sidecar.wait(10 * time.Second); err != nil {
			return in, err
		}
		if !hold(downHold) {
			return in, ctx.Err()
		}
		if err := e.sidecar.start(); err != nil {
			return in, err
		}
		if err := await(ctx, readyBound, func() error { return httpOK(ctx, e.sidecarDebug+"/readyz") }); err != nil {
			return in, err
		}
	case "picker-sigterm", "picker-sigkill":
		p := f.pickers[0]
		sig := syscall.SIGTERM
		if name == "picker-sigkill" {
			p, sig = f.pickers[1%len(f.pickers)], syscall.SIGKILL
		}
		in.target, in.picker = p.url, p.url
		in.at = time.Now()
		if sig == syscall.SIGKILL {
			in.incident = &Incident{Kind: IncidentPicker, Target: p.url, At: in.at}
		}
		if err := p.p.signal(sig); err != nil {
			return in, err
		}
		if err := p.p.wait(f.cfg.DrainDelay + 45*time.Second); err != nil { // the drain, then the shutdown timeout
			return in, err
		}
		if in.incident != nil {
			// Until the client's Service view drops the dead picker (its
			// first failed /readyz probe), requests still go to it — on
			// kept-alive connections, which break (a refused new one is
			// retried): the kill's doing, not routing's.
			if err := await(ctx, 10*time.Second, func() error { return c.pool.inRotation(p.url) }); err != nil {
				return in, err
			}
			in.incident.Until = time.Now()
		}
		if sig == syscall.SIGKILL && !hold(downHold) {
			return in, ctx.Err()
		}
		if err := p.p.start(); err != nil {
			return in, err
		}
		if err := await(ctx, readyBound, func() error { return httpOK(ctx, p.admin+"/readyz") }); err != nil {
			return in, err
		}
	case "gossip-partition":
		e := f.engines[3%n]
		in.target, in.at = "sidecar of "+e.url, time.Now()
		if err := postJSON(ctx, e.sidecarDebug+"/debug/fault/gossip", map[string]any{"partitioned": true}); err != nil {
			return in, err
		}
		ok := c.WaitUntil(ctx, time.Now().Add(max(c.Wall(partitionHold), partitionWall)))
		if err := postJSON(ctx, e.sidecarDebug+"/debug/fault/gossip", map[string]any{"partitioned": false}); err != nil || !ok {
			return in, cmp.Or(err, ctx.Err())
		}
	default:
		return in, fmt.Errorf("unknown fault %q", name)
	}
	in.restored = time.Now()
	return in, nil
}

// faultFigures turns the outcomes and the faults into the figures; window
// is the before and after windows (scenario time).
func faultFigures(outs []Outcome, faults []injected, snaps []counterSnap, start, end time.Time, scale float64, window time.Duration) *FaultsResult {
	sim := func(t time.Time) float64 { return t.Sub(start).Seconds() / scale }
	fr := &FaultsResult{Rule: ClassificationRule, WindowSeconds: window.Seconds(), Faults: []FaultResult{}}
	var incidents []Incident
	for _, f := range faults {
		if f.incident != nil {
			incidents = append(incidents, *f.incident)
		}
	}
	var points []hitPoint
	for _, o := range outs {
		if o.Err == nil {
			points = append(points, hitPoint{T: sim(o.Start), Prompt: o.PromptTokens, Cached: o.CachedTokens})
		}
	}
	for k, f := range faults {
		r := FaultResult{Name: f.name, Target: f.target, Injected: sim(f.at), Restored: sim(f.restored), Outcomes: map[string]int{}}
		next := sim(end)
		if k+1 < len(faults) {
			next = sim(faults[k+1].at)
		}
		w := window.Seconds()
		r.HitRateBefore, r.RequestsBefore = hitRate(points, r.Injected-w, r.Injected)
		r.HitRateAfter, r.RequestsAfter = hitRate(points, r.Restored, r.Restored+w)
		from := r.Restored + w
		if rec, ok := recoveryTime(points, r.HitRateBefore, r.Restored, next); ok {
			r.Recovery, from = &rec, r.Restored+rec
		}
		r.Outcomes = countsBetween(snaps, from, next)
		total := 0
		for _, n := range r.Outcomes {
			total += n
		}
		if total > 0 {
			r.AsPredicted = float64(r.Outcomes["as_predicted"]) / float64(total)
		}
		if f.inFlightOn != "" || f.picker != "" {
			n, failed := 0, 0
			for _, o := range outs {
				on := (f.inFlightOn != "" && o.Endpoint == f.inFlightOn) || (f.picker != "" && o.Picker == f.picker)
				if on && !o.Start.After(f.died()) && !o.End.Before(f.at) {
					n++
					if o.Err != nil {
						failed++
					}
				}
			}
			r.InFlight, r.InFlightFailed = &n, &failed
		}
		fr.Faults = append(fr.Faults, r)
	}
	// Failures, each to the fault in whose span (its injection to the
	// next one's) it failed.
	total := sim(end)
	bucket := min(5, max(1, total/100))
	nb := int(total/bucket) + 1
	tl := FaultTimeline{}
	prompt, cached := make([]int, nb), make([]int, nb)
	tl.Requests, tl.Router, tl.Unavoidable = make([]int, nb), make([]int, nb), make([]int, nb)
	for _, o := range outs {
		fr.Requests++
		if o.Err == nil {
			b := min(nb-1, max(0, int(sim(o.Start)/bucket)))
			prompt[b], cached[b], tl.Requests[b] = prompt[b]+o.PromptTokens, cached[b]+o.CachedTokens, tl.Requests[b]+1
			continue
		}
		class, _ := Classify(o, incidents)
		b := min(nb-1, max(0, int(sim(o.End)/bucket)))
		k := -1
		for i, f := range faults {
			if !o.End.Before(f.at) {
				k = i
			}
		}
		sample := fmt.Sprintf("%s via %s on %s at %.1fs: %v", class, o.Picker, cmp.Or(o.Endpoint, "(no endpoint)"), sim(o.End), o.Err)
		var rf, uf *int
		var samples *[]string
		if k < 0 {
			rf, uf, samples = &fr.Baseline.RouterFailed, &fr.Baseline.UnavoidableFailed, &fr.Baseline.FailureSamples
		} else {
			rf, uf, samples = &fr.Faults[k].RouterFailed, &fr.Faults[k].UnavoidableFailed, &fr.Faults[k].FailureSamples
		}
		if class == ClassRouter {
			*rf, fr.RouterFailed, tl.Router[b] = *rf+1, fr.RouterFailed+1, tl.Router[b]+1
		} else {
			*uf, fr.UnavoidableFailed, tl.Unavoidable[b] = *uf+1, fr.UnavoidableFailed+1, tl.Unavoidable[b]+1
		}
		if len(*samples) < 5 {
			*samples = append(*samples, sample)
		}
	}
	for b := range nb {
		tl.Seconds = append(tl.Seconds, (float64(b)+0.5)*bucket)
		rate := 0.0
		if prompt[b] > 0 {
			rate = float64(cached[b]) / float64(prompt[b])
		}
		tl.HitRate = append(tl.HitRate, rate)
	}
	fr.Timeline = tl
	return fr
}

// postJSON posts v (nil: no body) and wants a 2xx.
func postJSON(ctx context.Context, url string, v any) error {
	var body io.Reader
	if v != nil {
		b, _ := json.Marshal(v)
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return nil
}

// getOK GETs url within timeout and hands a 200 answer's body to read;
// another status is an error quoting the start of the body.
func getOK(ctx context.Context, url string, timeout time.Duration, read func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return read(resp.Body)
}

// getJSON decodes GET url's answer into out.
func getJSON(ctx context.Context, url string, out any) error {
	return getOK(ctx, url, 5*time.Second, func(r io.Reader) error { return json.NewDecoder(r).Decode(out) })
}

// scrapeCounter reads a metric family's samples from a Prometheus text
// page, keyed by the value of label (the whole family summed under ""
// when label is empty).
func scrapeCounter(ctx context.Context, url, name, label string) (out map[string]float64, err error) {
	err = getOK(ctx, url, 2*time.Second, func(r io.Reader) error {
		out, err = parseFamily(r, name, label)
		return err
	})
	return out, err
}

// parseFamily reads name's samples from Prometheus text exposition.
func parseFamily(r io.Reader, name, label string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		key := ""
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			labels := rest[1:end]
			rest = rest[end+1:]
			if label != "" {
				for _, kv := range strings.Split(labels, ",") {
					if k, v, ok := strings.Cut(kv, "="); ok && k == label {
						key = strings.Trim(v, `"`)
					}
				}
			}
		}
		fs := strings.Fields(rest)
		if len(fs) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			continue
		}
		out[key] += v
	}
	return out, sc.Err()
}

// faultsTable is summary.txt's faults block ("" without faults).
func faultsTable(r *Results) string {
	f := r.Faults
	if f == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nfaults: %d requests, %d failed by the router, %d unavoidable (%d refused connections retried); windows %.0f s of scenario time\n",
		f.Requests, f.RouterFailed, f.UnavoidableFailed, f.ClientRetries, f.WindowSeconds)
	fmt.Fprintf(&b, "%-19s %8s %8s %7s %7s %9s %9s %10s %10s %9s\n", "fault", "at (s)", "back (s)", "router", "unavoid", "hit before", "hit after", "recovery", "in flight", "agreement")
	for _, x := range f.Faults {
		rec := "not back"
		if x.Recovery != nil {
			rec = fmt.Sprintf("%.0f s", *x.Recovery)
		}
		inf := "-"
		if x.InFlight != nil {
			inf = fmt.Sprintf("%d/%d", *x.InFlightFailed, *x.InFlight)
		}
		fmt.Fprintf(&b, "%-19s %8.1f %8.1f %7d %7d %9.1f%% %8.1f%% %10s %10s %8.1f%%\n", x.Name, x.Injected, x.Restored, x.RouterFailed, x.UnavoidableFailed,
			100*x.HitRateBefore, 100*x.HitRateAfter, rec, inf, 100*x.AsPredicted)
	}
	b.WriteString("(in flight: failed/in flight on the target at the injection; agreement: as_predicted share of the pickers' outcomes after recovery)\n")
	if f.Baseline.RouterFailed+f.Baseline.UnavoidableFailed > 0 {
		fmt.Fprintf(&b, "before any fault: %d router, %d unavoidable\n", f.Baseline.RouterFailed, f.Baseline.UnavoidableFailed)
	}
	if len(f.Skipped) > 0 {
		fmt.Fprintf(&b, "not injected (past --duration): %s\n", strings.Join(f.Skipped, ", "))
	}
	return b.String()
}
