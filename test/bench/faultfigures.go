package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The faults scenario's figures: what is measured during the run (the
// pickers' outcome counters) and what is reported per fault and in all
// (results.json "faults", summary.txt's faults block). The rules they
// apply are faultrules.go's.

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

// outcomeCounters samples the pickers' kvroute_picker_outcomes_total every
// second: summed over the pickers, accumulated across their restarts
// (counterTrack), stamped in scenario time (sim).
type outcomeCounters struct {
	pickers []*procPicker
	sim     func(time.Time) float64
	tracks  []counterTrack

	mu    sync.Mutex
	snaps []counterSnap
}

func newOutcomeCounters(pickers []*procPicker, sim func(time.Time) float64) *outcomeCounters {
	return &outcomeCounters{pickers: pickers, sim: sim, tracks: make([]counterTrack, len(pickers))}
}

// run samples at once, then every second, until ctx ends.
func (c *outcomeCounters) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		c.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sample scrapes every picker once; a picker down adds nothing new.
func (c *outcomeCounters) sample(ctx context.Context) {
	sum := map[string]float64{}
	for i, p := range c.pickers {
		vals, err := scrapeCounter(ctx, p.admin+"/metrics", "kvroute_picker_outcomes_total", "outcome")
		if err != nil {
			vals = c.tracks[i].last // down: nothing new
		}
		for k, v := range c.tracks[i].observe(vals) {
			sum[k] += v
		}
	}
	c.mu.Lock()
	c.snaps = append(c.snaps, counterSnap{T: c.sim(time.Now()), Totals: sum})
	c.mu.Unlock()
}

// taken are the samples so far, in time order.
func (c *outcomeCounters) taken() []counterSnap {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snaps
}

// faultsRun is what a faults run hands its figures: the requests'
// outcomes (in start order), the faults injected and those skipped, the
// outcome counters' samples and the processes' resources, over the load
// from start to end.
type faultsRun struct {
	outcomes   []Outcome
	faults     []injected
	skipped    []string
	snaps      []counterSnap
	resources  *ResourceReport
	start, end time.Time
	scale      float64
	retries    int      // refused connections the client retried
	engines    []string // the engines' base URLs
}

// faultResults are the results of a faults run: the one policy
// ("precise") and its figures, and the faults' (window: the before and
// after windows, scenario time).
func faultResults(seed uint64, fo FaultsOptions, run faultsRun, window time.Duration) *Results {
	elapsed := run.end.Sub(run.start)
	fr := faultFigures(run.outcomes, run.faults, run.snaps, run.start, run.end, run.scale, window)
	fr.ClientRetries, fr.Skipped = run.retries, run.skipped

	r := &Results{Scenario: "faults", Seed: seed, Policies: map[string]*PolicyResult{}, scale: run.scale, origin: run.start}
	r.Fleet.Engines, r.Fleet.GPUBlocksPerEngine, r.Fleet.BlockSize, r.Fleet.Pickers = fo.Engines, fo.GPUBlocks, 16, fo.Pickers
	r.WarmReturnChance = 1 / float64(fo.Engines)
	pr := summarize(run.outcomes, run.engines, elapsed, run.scale)
	pr.HitRateOverTime = hitRateOverTime(run.outcomes, run.start, elapsed, run.scale)
	pr.Resources = run.resources
	pr.Outcomes = countsBetween(run.snaps, -1, 1e18)
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
	r.requests = []policyOutcomes{{"precise", run.outcomes}}
	return r
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
		next := sim(end)
		if k+1 < len(faults) {
			next = sim(faults[k+1].at)
		}
		fr.Faults = append(fr.Faults, faultResult(f, outs, points, snaps, sim, next, window))
	}
	fr.Timeline = failures(fr, outs, faults, incidents, sim, sim(end))
	return fr
}

// faultResult is one fault's figures but its failures; next is when the
// next fault was injected (the run's end for the last), window the
// before and after windows.
func faultResult(f injected, outs []Outcome, points []hitPoint, snaps []counterSnap, sim func(time.Time) float64, next float64, window time.Duration) FaultResult {
	r := FaultResult{Name: f.name, Target: f.target, Injected: sim(f.at), Restored: sim(f.restored), Outcomes: map[string]int{}}
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
	return r
}

// failures counts the requests and the failures into fr — each failure
// classified, and counted to the fault in whose span (its injection to
// the next one's) it failed, or to the baseline before any — and returns
// the timeline over the run's total scenario seconds.
func failures(fr *FaultsResult, outs []Outcome, faults []injected, incidents []Incident, sim func(time.Time) float64, total float64) FaultTimeline {
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
	return tl
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

// parseFamily reads name's samples from Prometheus text exposition (with
// the client library's parser), summed by the value of label (all under
// "" when label is empty); a family absent gives an empty map.
func parseFamily(r io.Reader, name, label string) (map[string]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range fams[name].GetMetric() {
		key := ""
		for _, lp := range m.GetLabel() {
			if label != "" && lp.GetName() == label {
				key = lp.GetValue()
			}
		}
		switch {
		case m.Counter != nil:
			out[key] += m.Counter.GetValue()
		case m.Gauge != nil:
			out[key] += m.Gauge.GetValue()
		case m.Untyped != nil:
			out[key] += m.Untyped.GetValue()
		}
	}
	return out, nil
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
