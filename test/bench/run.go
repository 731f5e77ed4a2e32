package bench

import (
	"bytes"
	"cmp"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/test/lab"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/render"
	"github.com/kvroute/kvroute/picker/score"
)

// Options configure a run.
type Options struct {
	Scenario Scenario
	// Lab, when set, is a lab sweep to show in the same results and
	// report (the demo's).
	Lab *lab.Results
	// Policies are the policies to run, in order: the picker's
	// (score.Policies, score.PeerPolicies) and LLMDCalibrated; default
	// kvroute's four (score.Policies).
	Policies  []score.Policy
	Engines   int // default: the scenario's
	GPUBlocks int // default: the scenario's, else 2048
	// CPUBlocks is each engine's CPU offload tier in blocks, with vLLM's
	// P2P tier (0: the scenario's; negative: none).
	CPUBlocks int
	// Pickers is how many pickers share each fleet (default 1): the
	// client sends each request to one of them drawn at random (from
	// Seed), as a Kubernetes Service spreads them (NewSpreadClient).
	Pickers int
	// TimeScale is the engines' time scale (1 real time, 0.1 ten times
	// faster, 0 no waiting); scenarios scale their own waits by it and
	// latencies are reported in simulated time (wall time / TimeScale).
	TimeScale float64
	Seed      uint64
	// LoadEpsilon, when set, is the picker's bounded-load factor.
	LoadEpsilon *float64
	// Admission runs the picker's admission control (its default limits,
	// or SaturationPrefillTokens): saturated groups queue and shed 429s,
	// counted per policy (PolicyResult.Shed429). Off (the default), every
	// request is admitted at once (Router.AdmitAll), so a comparison
	// measures routing alone: admission rescues load-blind policies and
	// drops its 429s from the TTFTs.
	Admission bool
	// Profile names the engines' latency profile (--profile; "" the
	// scenario's, else
	// engine's default, sim-default).
	Profile string
	// SaturationPrefillTokens, when set, is the picker's admission limit
	// on prefill tokens in flight per endpoint (with Admission).
	SaturationPrefillTokens *float64
	// EnginePriority: engines run --scheduling-policy priority and
	// kvroute's pickers --engine-priority (FleetConfig.EnginePriority).
	EnginePriority bool
	// SampleEvery is the period of the per-engine timeline; default 250 ms
	// of wall time, doubled as needed to keep ≤ 400 samples.
	SampleEvery time.Duration
	Log         *zap.Logger
	// Duration, when set, runs each policy for this long (wall time): the
	// scenario runs again and again (a new seed stream each time) until
	// then, and requests in flight at the end are cancelled and left out.
	Duration time.Duration
	// Progress, when set, is told of each request done (from the
	// scenario's goroutines) and of each policy's end (done < 0).
	Progress func(policy string, done int)
}

// Quantiles are latency figures in milliseconds (or µs where named).
type Quantiles struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// PolicyResult is one policy's figures (results.json schema).
type PolicyResult struct {
	// Tiers, with engines running the CPU and P2P tiers, are where the
	// prompt tokens' KV came from and the pulls, from the engines'
	// /metrics at the run's end.
	Tiers    *EngineTiers `json:"tiers,omitempty"`
	Requests int          `json:"requests"`
	Errors   int          `json:"errors"`
	// ReuseRetries are the requests sent again on a new connection after
	// their kept-alive one broke before any answer (Outcome.ReuseRetries).
	ReuseRetries int `json:"reused_connection_retries,omitempty"`
	// ErrorSamples are up to five distinct errors, for the failure message.
	ErrorSamples        []string  `json:"error_samples,omitempty"`
	HitRate             float64   `json:"hit_rate"`
	ContinuationHitRate float64   `json:"continuation_hit_rate"` // turns after the first`
	TTFTms              Quantiles `json:"ttft_ms"`
	ContinuationTTFTms  Quantiles `json:"continuation_ttft_ms"`
	Conversations       int       `json:"conversations"`
	Continuations       int       `json:"continuations"` // turns continuing an answered one
	WarmReturns         int       `json:"warm_returns"`
	// WarmReturnRate is WarmReturns ÷ Continuations (0 without any): set
	// it against Results.WarmReturnChance.
	WarmReturnRate float64 `json:"warm_return_rate"`
	// LoadImbalance is the busiest engine's answered requests ÷ the
	// mean; LoadCV their coefficient of variation over the engines
	// (population standard deviation ÷ mean; 0: an even spread).
	LoadImbalance float64 `json:"load_imbalance"`
	LoadCV        float64 `json:"load_cv"`
	// PickerRequests are the requests sent to each picker (in the order
	// of the fleet's pickers), present with several.
	PickerRequests []int   `json:"picker_requests,omitempty"`
	ThroughputRPS  float64 `json:"throughput_rps"`
	// PickOverheadUs is the picker's own time per request (arrival to
	// dispatch): an exact mean, and quantiles as histogram bucket bounds.
	PickOverheadUs PickOverhead `json:"pick_overhead_us"`
	// WrongPodRate is the share of answered requests whose engine cached
	// fewer tokens than predicted or while another endpoint held more.
	WrongPodRate        float64 `json:"wrong_pod_rate"`
	RequestsPerEndpoint []int   `json:"requests_per_engine"`
	// Decisions are the picker's decisions by reason; LoadOverrides those
	// that skipped the best-cached endpoint at the load cap, giving up
	// LoadOverrideTokens cached tokens.
	Decisions map[string]int `json:"decisions"`
	// Outcomes are the picker's outcome counts (as_predicted,
	// fewer_cached_than_predicted, another_endpoint_held_more, …).
	Outcomes           map[string]int `json:"outcomes"`
	LoadOverrides      int            `json:"load_overrides"`
	LoadOverrideTokens int            `json:"load_override_tokens"`
	// TTFTPercentiles are the TTFT's 0th to 100th percentiles in ms (101
	// values), for the distribution chart.
	TTFTPercentiles []float64 `json:"ttft_percentiles_ms"`
	Timeline        *Timeline `json:"timeline,omitempty"`
	// HitRateOverTime is the hit rate in windows of the run's simulated
	// time, for the hit-rate-over-time chart.
	HitRateOverTime *HitRateSeries `json:"hit_rate_over_time,omitempty"`
	// Steps are the figures per load step, for scenarios that step their
	// load (shared-prefix's QPS).
	Steps []StepResult `json:"steps,omitempty"`
	// Phases are the figures per phase and tenant, for the phased
	// scenarios (overload, tenants).
	Phases []PhaseResult `json:"phases,omitempty"`
	// Resources are the pickers' and sidecars' memory and goroutines over
	// the run (soak figures).
	Resources *ResourceReport `json:"resources,omitempty"`
	// CutAtDeadline are the requests in flight when --duration ended the
	// run, cancelled and left out of every figure.
	CutAtDeadline int `json:"cut_at_deadline,omitempty"`
	// Shed429 are the requests the picker refused with 429 (counted in
	// Errors), present when admission ran (Results.Admission).
	Shed429 *int `json:"shed_429,omitempty"`
	// LLMDCalibration is the load gate's calibration, for LLMDCalibrated.
	LLMDCalibration *LLMDCalibration `json:"llm_d_calibration,omitempty"`
	// Repeats is how many times the scenario ran (--duration).
	Repeats int `json:"repeats,omitempty"`
}

// PickOverhead is the picker's own time per request, arrival to dispatch
// (per attempt), in µs. The bench has no raw samples of it, only the
// picker's histogram (kvroute_picker_proxy_overhead_seconds): Mean is
// exact (the samples' sum ÷ their count), but the quantiles are bucket
// bounds — P50Bound is the upper bound of the bucket holding the p50 (the
// p50 is ≤ it), unless P50Beyond, when the p50 is past the last finite
// bound, P50Bound; likewise P99.
type PickOverhead struct {
	Samples   int     `json:"samples"`
	Mean      float64 `json:"mean"`
	P50Bound  float64 `json:"p50_bucket_bound"`
	P99Bound  float64 `json:"p99_bucket_bound"`
	P50Beyond bool    `json:"p50_beyond_last_bucket,omitempty"`
	P99Beyond bool    `json:"p99_beyond_last_bucket,omitempty"`
	Note      string  `json:"note,omitempty"`
}

// pickOverheadNote says what the figures are, in results.json.
const pickOverheadNote = "from the picker's histogram: mean exact (sum ÷ count); p50 and p99 are histogram bucket bounds (the quantile is ≤ the bound, or > it when beyond_last_bucket), not quantiles of raw samples"

// bucketBound words a quantile known only as a bucket bound.
func bucketBound(us float64, beyond bool) string {
	if beyond {
		return fmt.Sprintf("> %.0f µs", us)
	}
	return fmt.Sprintf("≤ %.0f µs", us)
}

// P50Text and P99Text word the quantiles as the bounds they are.
func (o PickOverhead) P50Text() string { return bucketBound(o.P50Bound, o.P50Beyond) }

// P99Text words the p99 as the bound it is.
func (o PickOverhead) P99Text() string { return bucketBound(o.P99Bound, o.P99Beyond) }

// StepResult is one load step's figures.
type StepResult struct {
	Step           int       `json:"step"`
	QPS            float64   `json:"qps,omitempty"`
	Requests       int       `json:"requests"`
	Errors         int       `json:"errors"`
	HitRate        float64   `json:"hit_rate"`
	TTFTms         Quantiles `json:"ttft_ms"`
	ThroughputRPS  float64   `json:"throughput_rps"` // answered ÷ the step's length
	PromptTokensPS float64   `json:"prompt_tokens_per_s"`
}

// HitRateSeries is a policy's hit rate over its run: the run's simulated
// time cut into equal windows — 20, or fewer so that a window holds 12
// answered requests on average — each request counted in the window its
// start falls in; a window's hit rate is its answered requests' cached
// prompt tokens ÷ their prompt tokens. Windows without an answered request
// are left out, so the three lists stay parallel.
type HitRateSeries struct {
	Seconds  []float64 `json:"t_s"` // the window's middle, simulated seconds since the policy's start
	HitRate  []float64 `json:"hit_rate"`
	Requests []int     `json:"requests"` // answered requests starting in the window
}

// Hit rate windows: at most hitRateWindows, of hitRatePerWindow answered
// requests on average at least.
const hitRateWindows, hitRatePerWindow = 20, 12

// hitRateOverTime windows the outcomes of a run that started at start and
// lasted elapsed (wall time; scale turns it into simulated seconds).
func hitRateOverTime(outs []Outcome, start time.Time, elapsed time.Duration, scale float64) *HitRateSeries {
	if elapsed <= 0 {
		elapsed = time.Nanosecond
	}
	var ok []Outcome
	for _, o := range outs {
		if o.Err == nil && !o.Start.IsZero() {
			ok = append(ok, o)
		}
	}
	windows := min(hitRateWindows, max(1, len(ok)/hitRatePerWindow))
	prompt, cached, n := make([]int, windows), make([]int, windows), make([]int, windows)
	for _, o := range ok {
		k := int(float64(windows) * float64(o.Start.Sub(start)) / float64(elapsed))
		k = min(max(k, 0), windows-1)
		prompt[k], cached[k], n[k] = prompt[k]+o.PromptTokens, cached[k]+o.CachedTokens, n[k]+1
	}
	s := &HitRateSeries{Seconds: []float64{}, HitRate: []float64{}, Requests: []int{}}
	width := elapsed.Seconds() / scale / float64(windows)
	for k := range n {
		if n[k] == 0 {
			continue
		}
		rate := 0.0
		if prompt[k] > 0 {
			rate = float64(cached[k]) / float64(prompt[k])
		}
		s.Seconds = append(s.Seconds, (float64(k)+0.5)*width)
		s.HitRate, s.Requests = append(s.HitRate, rate), append(s.Requests, n[k])
	}
	return s
}

// stepped is a scenario with load steps (their rates, in order).
type stepped interface {
	Steps() (qps []float64, each time.Duration)
}

// Timeline is the fleet sampled during a policy's run.
type Timeline struct {
	Seconds []float64        `json:"t_s"` // simulated seconds since the start
	Engines []EngineTimeline `json:"engines"`
}

// EngineTimeline is one engine's samples.
type EngineTimeline struct {
	URL          string `json:"url"`
	Requests     []int  `json:"requests"`      // answered so far (cumulative)
	CachedBlocks []int  `json:"cached_blocks"` // KV blocks holding a cached prefix
	Queued       []int  `json:"queued"`        // running + waiting requests
}

// Results is results.json.
type Results struct {
	Scenario string `json:"scenario"`
	Seed     uint64 `json:"seed"`
	Fleet    struct {
		Engines            int `json:"engines"`
		GPUBlocksPerEngine int `json:"gpu_blocks_per_engine"`
		BlockSize          int `json:"block_size"`
		// Pickers share the fleet: requests spread over them at random
		// (the faults scenario: round-robin over its picker processes).
		Pickers int `json:"pickers"`
	} `json:"fleet"`
	PooledBoundHitRate float64 `json:"pooled_bound_hit_rate"`
	// WorkingSetBlocks is the number of distinct KV blocks the requests
	// touch; WorkingSetRatio that over the fleet's KV capacity.
	WorkingSetBlocks int     `json:"working_set_blocks"`
	WorkingSetRatio  float64 `json:"working_set_ratio"`
	// WarmReturnChance is the share of continuations a pick at random
	// would bring back to their turn's engine: 1 ÷ the engines.
	WarmReturnChance float64                  `json:"warm_return_chance"`
	Policies         map[string]*PolicyResult `json:"policies"`
	Order            []string                 `json:"policy_order"`
	// Labels are the policies' names in tables and charts where they
	// differ from their keys (Results.Label): "llm-d-precise (given
	// tokens)" when SendsResponses, "llm-d (default)" beside
	// llm-d-calibrated.
	Labels map[string]string `json:"policy_labels,omitempty"`
	// SendsResponses: the scenario sent /v1/responses requests.
	SendsResponses bool `json:"sends_responses"`
	// Admission: the picker's admission control ran (Options.Admission);
	// each policy's 429s are then in its "shed_429".
	Admission bool `json:"admission"`
	// EnginePriority: the engines ran --scheduling-policy priority and
	// kvroute's pickers --engine-priority (Options.EnginePriority).
	EnginePriority bool `json:"engine_priority,omitempty"`
	// VsBestPeer sets every policy against the best of the peer policies
	// that ran (llm-d, llm-d-precise, dynamo, sglang); absent when none
	// did.
	VsBestPeer *PeerComparison `json:"vs_best_peer,omitempty"`
	// Faults are the faults scenario's figures.
	Faults *FaultsResult `json:"faults,omitempty"`
	// DurationSeconds is --duration, when the run was for a fixed time.
	DurationSeconds float64 `json:"duration_s,omitempty"`
	// Lab, when set, is a virtual-time sweep of the same scenario (the
	// demo's lab section), shown in the same report.
	Lab *lab.Results `json:"lab,omitempty"`

	requests []policyOutcomes // for requests.jsonl
	scale    float64          // wall time ÷ simulated time
	origin   time.Time        // requests.jsonl's time zero when set (the faults scenario's start), else the first request's start
}

type policyOutcomes struct {
	policy   string
	outcomes []Outcome
}

// requestLine is one line of requests.jsonl: a request as the client saw
// it (latencies in simulated ms; no prompt text).
type requestLine struct {
	Policy       string  `json:"policy"`
	Conversation int     `json:"conversation"`
	Turn         int     `json:"turn"`
	Step         int     `json:"step,omitempty"`
	Endpoint     string  `json:"endpoint"`
	PrevEndpoint string  `json:"prev_endpoint,omitempty"`
	StartMs      float64 `json:"start_ms"`
	TTFTms       float64 `json:"ttft_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	Error        string  `json:"error,omitempty"`
}

// Run runs the scenario once per policy, each on a fresh fleet.
func Run(ctx context.Context, o Options) (*Results, error) {
	if len(o.Policies) == 0 {
		o.Policies = score.Policies()
	}
	fc := o.Scenario.Fleet()
	if o.Engines == 0 {
		o.Engines = cmp.Or(fc.Engines, 2)
	}
	if o.GPUBlocks == 0 {
		o.GPUBlocks = cmp.Or(fc.GPUBlocks, 2048)
	}
	if o.CPUBlocks == 0 {
		o.CPUBlocks = fc.CPUBlocks
	}
	o.Profile = cmp.Or(o.Profile, fc.Profile)
	if o.SampleEvery == 0 {
		o.SampleEvery = 250 * time.Millisecond
	}
	scale := o.TimeScale
	if scale <= 0 {
		scale = 1 // no simulated waiting: wall time is all there is
	}
	res := &Results{Scenario: o.Scenario.Name(), Seed: o.Seed, Policies: map[string]*PolicyResult{}, scale: scale, Lab: o.Lab,
		Admission: o.Admission, EnginePriority: o.EnginePriority}
	o.Pickers = max(o.Pickers, 1)
	res.Fleet.Engines, res.Fleet.GPUBlocksPerEngine, res.Fleet.BlockSize, res.Fleet.Pickers = o.Engines, o.GPUBlocks, 16, o.Pickers
	res.WarmReturnChance = 1 / float64(o.Engines)
	for i, p := range o.Policies {
		mml := fc.MaxModelLen
		if mml > 0 {
			mml = min(mml, (o.GPUBlocks-1)*16) // --gpu-blocks may shrink the cache
		}
		f, err := StartFleet(ctx, FleetConfig{Engines: o.Engines, GPUBlocks: o.GPUBlocks, MaxModelLen: mml,
			TimeScale: o.TimeScale, Policy: pickerPolicy(p), Log: o.Log, LoadEpsilon: o.LoadEpsilon, PolicySeed: o.Seed,
			SaturationPrefillTokens: o.SaturationPrefillTokens, Profile: o.Profile, CPUBlocks: max(o.CPUBlocks, 0), Pickers: o.Pickers,
			EnginePriority: o.EnginePriority})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		cal, err := setUpFleet(ctx, o, f, p, scale)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		client := NewSpreadClient(f.PickerURLs(), o.Seed)
		client.TimeScale, client.MaxModelLen, client.Engines = o.TimeScale, f.MaxModelLen(), o.Engines
		var done atomic.Int64
		if o.Progress != nil {
			client.done = func() { o.Progress(string(p), int(done.Add(1))) }
		}
		start := time.Now()
		sampled := make(chan *Timeline, 1)
		sctx, stopSampling := context.WithCancel(ctx)
		go func() { sampled <- sample(sctx, f, client, start, o.SampleEvery, scale) }()
		resources := make(chan *ResourceReport, 1)
		if o.Duration > 0 { // a soak: the in-process fleet's figures are this process's
			go func() {
				resources <- sampleResources(sctx, []resourceSource{{name: "bench process", kind: "process", self: true}}, start, resourcePeriod(o.SampleEvery))
			}()
		} else {
			resources <- nil
		}
		outcomes, cut, repeats, err := runScenario(ctx, o, client)
		elapsed := time.Since(start)
		stopSampling()
		timeline := <-sampled
		if o.Progress != nil {
			o.Progress(string(p), -1)
		}
		if err == nil && i == 0 { // the same requests every time: once is enough
			res.PooledBoundHitRate, res.WorkingSetBlocks, err = pooledBound(ctx, f.EngineURLs()[0], outcomes, o.Engines*o.GPUBlocks, 16)
			res.WorkingSetRatio = float64(res.WorkingSetBlocks) / float64(o.Engines*o.GPUBlocks)
		}
		engines := f.EngineURLs()
		stats, serr := f.PickerStats()
		var tiers *EngineTiers
		if o.CPUBlocks > 0 && serr == nil {
			tiers, serr = engineTiers(ctx, engines)
		}
		f.Close()
		if err == nil {
			err = serr
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for k := range outcomes { // keep the figures, not the bodies
			outcomes[k].Body, outcomes[k].Tokens = nil, nil
			res.SendsResponses = res.SendsResponses || outcomes[k].Path == "/v1/responses"
		}
		pr := summarize(outcomes, engines, elapsed, scale)
		if o.Pickers > 1 {
			pr.PickerRequests = perPicker(outcomes, f.PickerURLs())
		}
		pr.LLMDCalibration = cal
		pr.Tiers = tiers
		if o.Admission {
			pr.Shed429 = shed429(outcomes)
		}
		pr.Timeline, pr.Resources, pr.CutAtDeadline = timeline, <-resources, cut
		if o.Duration > 0 {
			pr.Repeats = repeats
		}
		pr.HitRateOverTime = hitRateOverTime(outcomes, start, elapsed, scale)
		if st, ok := o.Scenario.(stepped); ok {
			qps, each := st.Steps()
			pr.Steps = steps(outcomes, qps, each, scale)
		}
		if ph, ok := o.Scenario.(phased); ok {
			pr.Phases = phaseResults(outcomes, ph.PhaseList(), scale)
		}
		pr.PickOverheadUs = stats.Overhead
		pr.Decisions, pr.Outcomes = map[string]int{}, map[string]int{}
		for k, v := range stats.Decisions {
			pr.Decisions[k] = int(v)
		}
		for k, v := range stats.Outcomes {
			pr.Outcomes[k] = int(v)
		}
		pr.LoadOverrides, pr.LoadOverrideTokens = int(stats.LoadOverrides), int(stats.OverrideTokens)
		res.requests = append(res.requests, policyOutcomes{string(p), outcomes})
		total, wrong := 0.0, stats.Outcomes["fewer_cached_than_predicted"]+stats.Outcomes["another_endpoint_held_more"]
		for _, n := range stats.Outcomes {
			total += n
		}
		if total > 0 {
			pr.WrongPodRate = wrong / total
		}
		res.Policies[string(p)] = pr
		res.Order = append(res.Order, string(p))
	}
	res.VsBestPeer = ComparePeers(res)
	res.Labels = policyLabels(res)
	res.DurationSeconds = o.Duration.Seconds()
	return res, nil
}

// shed429 counts the requests refused with 429.
func shed429(outs []Outcome) *int {
	n := 0
	for _, o := range outs {
		if o.Status == http.StatusTooManyRequests {
			n++
		}
	}
	return &n
}

// runScenario runs o's scenario once, or with o.Duration again and again
// until it has passed: iteration i draws from the seed's stream i+1 and
// numbers its conversations from i × 1,000,000. Requests the deadline cut
// (failed with the context's error once it passed) are left out and
// counted.
func runScenario(ctx context.Context, o Options, c *Client) (outs []Outcome, cut, repeats int, err error) {
	if o.Duration <= 0 {
		outs, err = o.Scenario.Run(ctx, c, rand.New(rand.NewPCG(o.Seed, 1)))
		return outs, 0, 1, err
	}
	dctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	for i := 0; dctx.Err() == nil; i++ {
		got, rerr := o.Scenario.Run(dctx, c, rand.New(rand.NewPCG(o.Seed, uint64(1+i))))
		repeats++
		ended := dctx.Err() != nil && ctx.Err() == nil
		for _, x := range got {
			if x.Err != nil && ended && (errors.Is(x.Err, context.DeadlineExceeded) || errors.Is(x.Err, context.Canceled)) {
				cut++
				continue
			}
			x.Conversation += i * 1_000_000
			outs = append(outs, x)
		}
		if rerr != nil && !ended {
			return outs, cut, repeats, rerr
		}
	}
	return outs, cut, repeats, ctx.Err()
}

// sample records, every period until ctx ends, each engine's answered
// requests, cached blocks and queue; the period doubles (and the samples so
// far are thinned) whenever 400 would be exceeded.
func sample(ctx context.Context, f *Fleet, c *Client, start time.Time, period time.Duration, scale float64) *Timeline {
	const most = 400
	tl := &Timeline{}
	urls := f.EngineURLs()
	for _, u := range urls {
		tl.Engines = append(tl.Engines, EngineTimeline{URL: u})
	}
	take := func() {
		routed := c.Routed()
		tl.Seconds = append(tl.Seconds, time.Since(start).Seconds()/scale)
		for i, st := range f.EngineStats() {
			e := &tl.Engines[i]
			e.Requests = append(e.Requests, routed[urls[i]])
			e.CachedBlocks = append(e.CachedBlocks, st.CachedBlocks)
			e.Queued = append(e.Queued, st.Running+st.Waiting)
		}
	}
	thin := func() {
		tl.Seconds = everyOther(tl.Seconds)
		for i := range tl.Engines {
			e := &tl.Engines[i]
			e.Requests, e.CachedBlocks, e.Queued = everyOther(e.Requests), everyOther(e.CachedBlocks), everyOther(e.Queued)
		}
	}
	take()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			take() // the final state
			return tl
		case <-t.C:
			take()
			if len(tl.Seconds) >= most {
				thin()
				period *= 2
				t.Reset(period)
			}
		}
	}
}

// everyOther keeps the elements at even indexes.
func everyOther[T any](s []T) []T {
	out := s[:0]
	for i := 0; i < len(s); i += 2 {
		out = append(out, s[i])
	}
	return out
}

// summarize turns outcomes into a policy's figures; latencies are divided
// by scale (wall → simulated time).
func summarize(outs []Outcome, engines []string, elapsed time.Duration, scale float64) *PolicyResult {
	r := &PolicyResult{RequestsPerEndpoint: make([]int, len(engines))}
	var prompt, cached, contPrompt, contCached int
	var ttft, cont []float64
	convs := map[int]bool{}
	for _, o := range outs {
		r.Requests++
		r.ReuseRetries += o.ReuseRetries
		if o.Err != nil {
			r.Errors++
			if msg := o.Err.Error(); len(r.ErrorSamples) < 5 && !slices.Contains(r.ErrorSamples, msg) {
				r.ErrorSamples = append(r.ErrorSamples, msg)
			}
			continue
		}
		convs[o.Conversation] = true
		prompt += o.PromptTokens
		cached += o.CachedTokens
		ms := float64(o.TTFT.Microseconds()) / 1000 / scale
		ttft = append(ttft, ms)
		if o.Turn > 1 && o.PrevEndpoint != "" {
			r.Continuations++
			cont = append(cont, ms)
			contPrompt += o.PromptTokens
			contCached += o.CachedTokens
			if o.PrevEndpoint != "" && o.PrevEndpoint == o.Endpoint {
				r.WarmReturns++
			}
		}
		if i := slices.Index(engines, o.Endpoint); i >= 0 {
			r.RequestsPerEndpoint[i]++
		}
	}
	r.Conversations = len(convs)
	if prompt > 0 {
		r.HitRate = float64(cached) / float64(prompt)
	}
	if contPrompt > 0 {
		r.ContinuationHitRate = float64(contCached) / float64(contPrompt)
	}
	if r.Continuations > 0 {
		r.WarmReturnRate = float64(r.WarmReturns) / float64(r.Continuations)
	}
	r.TTFTms, r.ContinuationTTFTms = quantiles(ttft), quantiles(cont)
	r.TTFTPercentiles = percentiles(ttft)
	r.LoadImbalance, r.LoadCV = loadSpread(r.RequestsPerEndpoint)
	if elapsed > 0 { // answered requests per second of simulated time
		r.ThroughputRPS = float64(r.Requests-r.Errors) / (elapsed.Seconds() / scale)
	}
	return r
}

// loadSpread is the spread of the requests per engine: the busiest ÷
// the mean, and the coefficient of variation (population standard
// deviation ÷ mean); 0 and 0 when none was answered.
func loadSpread(per []int) (imbalance, cv float64) {
	mx, sum := 0, 0
	for _, n := range per {
		mx, sum = max(mx, n), sum+n
	}
	if sum == 0 {
		return 0, 0
	}
	mean := float64(sum) / float64(len(per))
	ss := 0.0
	for _, n := range per {
		ss += (float64(n) - mean) * (float64(n) - mean)
	}
	return float64(mx) / mean, math.Sqrt(ss/float64(len(per))) / mean
}

// perPicker counts the requests sent to each picker of bases.
func perPicker(outs []Outcome, bases []string) []int {
	n := make([]int, len(bases))
	for _, o := range outs {
		if i := slices.Index(bases, o.Picker); i >= 0 {
			n[i]++
		}
	}
	return n
}

func quantiles(v []float64) Quantiles {
	if len(v) == 0 {
		return Quantiles{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	q := func(perMille int) float64 { return s[max(0, (perMille*len(s)+999)/1000-1)] } // nearest rank
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	return Quantiles{Mean: sum / float64(len(s)), P50: q(500), P90: q(900), P99: q(990)}
}

// steps summarises the outcomes of each load step; the throughputs are
// answered requests and their prompt tokens per second of the step (each
// long, simulated time); latencies are divided by scale.
func steps(outs []Outcome, qps []float64, each time.Duration, scale float64) []StepResult {
	var res []StepResult
	for i := range qps {
		r := StepResult{Step: i + 1, QPS: qps[i]}
		var ttft []float64
		var prompt, cached int
		for _, o := range outs {
			if o.Step != i+1 {
				continue
			}
			r.Requests++
			if o.Err != nil {
				r.Errors++
				continue
			}
			prompt, cached = prompt+o.PromptTokens, cached+o.CachedTokens
			ttft = append(ttft, float64(o.TTFT.Microseconds())/1000/scale)
		}
		if prompt > 0 {
			r.HitRate = float64(cached) / float64(prompt)
		}
		r.TTFTms = quantiles(ttft)
		if each > 0 {
			r.ThroughputRPS = float64(len(ttft)) / each.Seconds()
			r.PromptTokensPS = float64(prompt) / each.Seconds()
		}
		res = append(res, r)
	}
	return res
}

// percentiles returns the 0th…100th percentiles of v (nil when empty).
func percentiles(v []float64) []float64 {
	if len(v) == 0 {
		return nil
	}
	s := slices.Clone(v)
	slices.Sort(s)
	out := make([]float64, 101)
	for p := range out {
		out[p] = s[max(0, (p*len(s)+99)/100-1)] // nearest rank, ⌈p·n/100⌉
	}
	return out
}

// pooledBound replays the requests through one LRU of capacity blocks:
// the hit rate a single cache the size of the whole fleet would reach, and
// the number of distinct blocks (the working set). Tokens come from the
// engine's render endpoint, keys as the picker makes them.
func pooledBound(ctx context.Context, engine string, outs []Outcome, capacity, blockSize int) (float64, int, error) {
	lru := list.New()
	at := map[blockkey.Key]*list.Element{}
	seen := map[blockkey.Key]struct{}{}
	rc := render.New(time.Minute, 64<<20) // the picker's render client
	defer rc.Close()
	var hit, total int
	for _, o := range outs {
		if o.Err != nil {
			continue
		}
		var req struct {
			CacheSalt string `json:"cache_salt"`
		}
		var toks []uint32
		if o.Tokens != nil {
			toks = o.Tokens()
		} else {
			_ = json.Unmarshal(o.Body, &req)
			var err error
			if toks, err = renderTokens(ctx, rc, engine, o.Path, o.Body); err != nil {
				return 0, 0, fmt.Errorf("pooled bound: %w", err)
			}
		}
		keys := (&blockkey.Request{Tokens: toks, CacheSalt: req.CacheSalt}).AppendKeys(nil, "Qwen/Qwen3-0.6B", blockSize)
		n := 0
		for n < len(keys) && at[keys[n]] != nil {
			n++
		}
		total += len(toks)
		if len(toks) > 0 {
			hit += min(n*blockSize, (len(toks)-1)/blockSize*blockSize)
		}
		for _, k := range keys {
			seen[k] = struct{}{}
			if e := at[k]; e != nil {
				lru.MoveToFront(e)
				continue
			}
			at[k] = lru.PushFront(k)
			if lru.Len() > capacity {
				old := lru.Back()
				lru.Remove(old)
				delete(at, old.Value.(blockkey.Key))
			}
		}
	}
	if total == 0 {
		return 0, len(seen), nil
	}
	return float64(hit) / float64(total), len(seen), nil
}

// renderTokens returns the engine-exact tokens of a request sent to path,
// through the picker's render client (render endpoints, Responses as chat
// where an engine has no Responses render, /tokenize last).
func renderTokens(ctx context.Context, rc *render.Client, engine, path string, body []byte) ([]uint32, error) {
	kind, ok := map[string]intake.Kind{"/v1/chat/completions": intake.Chat, "/v1/completions": intake.Completion, "/v1/responses": intake.Responses}[path]
	if !ok {
		return nil, fmt.Errorf("render: no render for %s", path)
	}
	r, err := rc.Render(ctx, engine, kind, body)
	return r.TokenIDs, err
}

// Write stores results.json, summary.txt, report.html and requests.jsonl
// (every request of a Run, a line each) in dir and returns the table.
func Write(dir string, r *Results) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(b, '\n'), 0o644); err != nil {
		return "", err
	}
	t := Table(r)
	if err := os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(t), 0o644); err != nil {
		return "", err
	}
	var page bytes.Buffer
	if err := WriteReport(&page, r); err != nil {
		return "", fmt.Errorf("report.html: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.html"), page.Bytes(), 0o644); err != nil {
		return "", err
	}
	scale := cmp.Or(r.scale, 1)
	var lines bytes.Buffer
	enc := json.NewEncoder(&lines)
	for _, po := range r.requests {
		t0 := r.origin
		for _, o := range po.outcomes {
			if !r.origin.IsZero() {
				break
			}
			if t0.IsZero() || o.Start.Before(t0) {
				t0 = o.Start
			}
		}
		for _, o := range po.outcomes {
			l := requestLine{Policy: po.policy, Conversation: o.Conversation, Turn: o.Turn, Step: o.Step, Endpoint: o.Endpoint,
				PrevEndpoint: o.PrevEndpoint, StartMs: float64(o.Start.Sub(t0).Microseconds()) / 1000 / scale,
				TTFTms: float64(o.TTFT.Microseconds()) / 1000 / scale, PromptTokens: o.PromptTokens, CachedTokens: o.CachedTokens}
			if o.Err != nil {
				l.Error = o.Err.Error()
			}
			if err := enc.Encode(l); err != nil {
				return "", err
			}
		}
	}
	return t, os.WriteFile(filepath.Join(dir, "requests.jsonl"), lines.Bytes(), 0o644)
}

// vsChance words a policy's warm-return share against chance ("1.02×",
// "-" without continuations).
func vsChance(x *PolicyResult, chance float64) string {
	if x.Continuations == 0 || chance <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", x.WarmReturnRate/chance)
}

// Table is the side-by-side summary.
func Table(r *Results) string {
	var b strings.Builder
	if r.Faults != nil {
		fmt.Fprintf(&b, "scenario faults, %d engines × %d blocks (real processes, 2 pickers), seed %d\n",
			r.Fleet.Engines, r.Fleet.GPUBlocksPerEngine, r.Seed)
	} else {
		fmt.Fprintf(&b, "scenario %s, %d engines × %d blocks, seed %d; working set %.2f× the fleet's KV; pooled-cache bound hit rate %.1f%%\n",
			r.Scenario, r.Fleet.Engines, r.Fleet.GPUBlocksPerEngine, r.Seed, r.WorkingSetRatio, 100*r.PooledBoundHitRate)
	}
	fmt.Fprintf(&b, "warm returns by chance (a pick at random among %d engines): %.1f%%\n", r.Fleet.Engines, 100*r.WarmReturnChance)
	if r.Faults == nil && r.Fleet.Pickers > 1 {
		fmt.Fprintf(&b, "%d pickers, each request sent to one drawn at random (as a Service spreads them); their figures summed\n", r.Fleet.Pickers)
	}
	if r.Admission {
		fmt.Fprintf(&b, "admission control on: 429s are counted in errors and shown apart\n")
	}
	w := nameWidth(r)
	fmt.Fprintf(&b, "\n%-*s %8s %6s %8s %9s %11s %11s %11s %11s %9s %9s %7s%s\n", w, "policy", "requests", "errors", "hit", "cont. hit", "ttft mean", "ttft p90", "cont. mean", "warm", "vs chance", "imbalance", "load CV", shedHeader(r))
	for _, p := range r.Order {
		x := r.Policies[p]
		vs := vsChance(x, r.WarmReturnChance)
		fmt.Fprintf(&b, "%-*s %8d %6d %7.1f%% %8.1f%% %9.0fms %9.0fms %9.0fms %5d/%-5d %9s %9.2f %7.3f%s\n", w, r.Label(p), x.Requests, x.Errors, 100*x.HitRate, 100*x.ContinuationHitRate,
			x.TTFTms.Mean, x.TTFTms.P90, x.ContinuationTTFTms.Mean, x.WarmReturns, x.Continuations, vs, x.LoadImbalance, x.LoadCV, shedCell(r, x))
	}
	for _, p := range r.Order {
		if x := r.Policies[p]; len(x.PickerRequests) > 0 {
			fmt.Fprintf(&b, "%-*s requests per picker: %v\n", w, r.Label(p), x.PickerRequests)
		}
	}
	if len(r.Order) > 0 && len(r.Policies[r.Order[0]].Steps) > 0 {
		fmt.Fprintf(&b, "\nper load step\n%-*s %4s %6s %8s %8s %11s %11s %11s %10s\n", w, "policy", "step", "qps", "requests", "hit", "ttft p50", "ttft p90", "ttft p99", "answered/s")
		for _, p := range r.Order {
			for _, st := range r.Policies[p].Steps {
				fmt.Fprintf(&b, "%-*s %4d %6.1f %8d %7.1f%% %9.0fms %9.0fms %9.0fms %10.1f\n", w, r.Label(p), st.Step, st.QPS, st.Requests, 100*st.HitRate,
					st.TTFTms.P50, st.TTFTms.P90, st.TTFTms.P99, st.ThroughputRPS)
			}
		}
	}
	b.WriteString(calibrationTable(r))
	b.WriteString(phaseTable(r))
	b.WriteString(peerTable(r))
	b.WriteString(faultsTable(r))
	b.WriteString(resourcesTable(r))
	if r.Faults != nil { // the pickers are processes: no histogram read
		return b.String()
	}
	fmt.Fprintf(&b, "\npick overhead, arrival to dispatch (wall time): the mean is exact; p50 and p99 are histogram bucket bounds, not raw-sample quantiles\n")
	fmt.Fprintf(&b, "%-*s %8s %10s %14s %14s\n", w, "policy", "samples", "mean", "p50 (bucket)", "p99 (bucket)")
	for _, p := range r.Order {
		o := r.Policies[p].PickOverheadUs
		fmt.Fprintf(&b, "%-*s %8d %7.0f µs %14s %14s\n", w, r.Label(p), o.Samples, o.Mean, o.P50Text(), o.P99Text())
	}
	return b.String()
}
