package lab

import (
	"bytes"
	"cmp"
	"fmt"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/test/lab/stats"
	"github.com/kvroute/kvroute/test/workload"
)

// TenantPhase is one tenant's requests in one load step (a phase) of a
// run: the table a scenario whose requests have tenants reports, per
// step and tenant (the fairness target of --engine-priority is read
// off it: a light tenant's p99 beside a heavy one against its p99
// alone, the heavy tenant's throughput with and without priorities).
type TenantPhase struct {
	Step int `json:"step"`
	// Phase is the step's name, when the scenario names its phases.
	Phase  string `json:"phase,omitempty"`
	Tenant string `json:"tenant"`
	// Requests were sent in the step; Answered completed (200), whenever
	// they did.
	Requests int `json:"requests"`
	Answered int `json:"answered"`
	// TTFT of the answered requests, ms of simulated time.
	TTFTP50 Num `json:"ttft_p50_ms"`
	TTFTP99 Num `json:"ttft_p99_ms"`
	// TTFTP99VsFirst is TTFTP99 ÷ the tenant's p99 in its first step
	// (1 there): a light tenant's p99 beside a heavy one against its p99
	// alone.
	TTFTP99VsFirst Num `json:"ttft_p99_vs_first_step"`
	// Throughput is the step's requests of the tenant answered by the
	// end of the step's window, per simulated second of the window
	// (WindowS). The window is the phase's, when the scenario has phases
	// of set lengths (workload.Phased); else from the step's first send
	// to the next step's first send (the last step: to the run's last
	// answer). Without admission control an overloaded phase leaves a
	// backlog that is answered after it: counted in Answered, not here.
	Throughput Num `json:"throughput_rps"`
	WindowS    Num `json:"window_s"`
}

// phasesOf is the scenario's phases, nil when it has none.
func phasesOf(sc workload.Scenario) []workload.Phase {
	if p, ok := sc.(workload.Phased); ok {
		return p.Phases()
	}
	return nil
}

// tenantPhases is outs' table by step and tenant (TenantPhase), in step
// order then by tenant; nil when no request has a tenant.
func tenantPhases(outs []Outcome, phases []workload.Phase) []TenantPhase {
	type key struct {
		step   int
		tenant string
	}
	by := map[key][]*Outcome{}
	first := map[int]time.Duration{} // each step's first send
	var last time.Duration           // the run's last answer
	any := false
	for i := range outs {
		o := &outs[i]
		any = any || o.Tenant != ""
		if t, ok := first[o.Step]; !ok || o.Start < t {
			first[o.Step] = o.Start
		}
		last = max(last, o.End)
		by[key{o.Step, o.Tenant}] = append(by[key{o.Step, o.Tenant}], o)
	}
	if !any {
		return nil
	}
	steps := make([]int, 0, len(first))
	for s := range first {
		steps = append(steps, s)
	}
	slices.Sort(steps)
	window := func(step int) (from, to time.Duration, name string) {
		if step >= 1 && step <= len(phases) {
			for _, ph := range phases[:step-1] {
				from += ph.For
			}
			return from, from + phases[step-1].For, phases[step-1].Name
		}
		from, to = first[step], last
		if k := slices.Index(steps, step); k+1 < len(steps) {
			to = first[steps[k+1]]
		}
		return from, to, ""
	}
	keys := make([]key, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int { return cmp.Or(cmp.Compare(a.step, b.step), cmp.Compare(a.tenant, b.tenant)) })
	var out []TenantPhase
	firstP99 := map[string]Num{}
	for _, k := range keys {
		from, to, name := window(k.step)
		tp := TenantPhase{Step: k.step, Phase: name, Tenant: k.tenant, Requests: len(by[k]), WindowS: Num((to - from).Seconds())}
		var ttft []float64
		inWindow := 0
		for _, o := range by[k] {
			if !o.OK() {
				continue
			}
			tp.Answered++
			ttft = append(ttft, float64(o.TTFT)/float64(time.Millisecond))
			if o.End <= to {
				inWindow++
			}
		}
		tp.TTFTP50, tp.TTFTP99 = Num(stats.Quantile(ttft, 0.5)), Num(stats.Quantile(ttft, 0.99))
		if _, ok := firstP99[k.tenant]; !ok {
			firstP99[k.tenant] = tp.TTFTP99
		}
		tp.TTFTP99VsFirst = Num(float64(tp.TTFTP99) / float64(firstP99[k.tenant]))
		tp.Throughput = Num(math.NaN())
		if to > from {
			tp.Throughput = Num(float64(inWindow) / (to - from).Seconds())
		}
		out = append(out, tp)
	}
	return out
}

// TenantSummary is a policy's TenantPhase at one rate over the seeds:
// the median of each figure over the seeds that had the step and tenant
// (the mean of the middle two of an even number).
type TenantSummary struct {
	Policy         string  `json:"policy"`
	Rate           float64 `json:"rate"`
	Step           int     `json:"step"`
	Phase          string  `json:"phase,omitempty"`
	Tenant         string  `json:"tenant"`
	Seeds          int     `json:"seeds"`
	Requests       Num     `json:"requests"`
	Answered       Num     `json:"answered"`
	TTFTP50        Num     `json:"ttft_p50_ms"`
	TTFTP99        Num     `json:"ttft_p99_ms"`
	TTFTP99VsFirst Num     `json:"ttft_p99_vs_first_step"`
	Throughput     Num     `json:"throughput_rps"`
}

// median is the median of v's values that are not NaN (NaN: none).
func median(v []float64) float64 {
	s := make([]float64, 0, len(v))
	for _, x := range v {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return math.NaN()
	}
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// tenantSummaries are a policy's tenant tables at one rate over the
// seeds (fs, one per seed), in step order then by tenant; nil when no
// run had any.
func tenantSummaries(p string, rate float64, fs []*Figures) []TenantSummary {
	type key struct {
		step          int
		phase, tenant string
	}
	by := map[key][]*TenantPhase{}
	for _, f := range fs {
		for i := range f.Tenants {
			t := &f.Tenants[i]
			k := key{t.Step, t.Phase, t.Tenant}
			by[k] = append(by[k], t)
		}
	}
	keys := make([]key, 0, len(by))
	for k := range by {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.step, b.step), cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.phase, b.phase))
	})
	var out []TenantSummary
	for _, k := range keys {
		col := func(of func(*TenantPhase) float64) Num {
			v := make([]float64, len(by[k]))
			for i, t := range by[k] {
				v[i] = of(t)
			}
			return Num(median(v))
		}
		out = append(out, TenantSummary{Policy: p, Rate: rate, Step: k.step, Phase: k.phase, Tenant: k.tenant, Seeds: len(by[k]),
			Requests:       col(func(t *TenantPhase) float64 { return float64(t.Requests) }),
			Answered:       col(func(t *TenantPhase) float64 { return float64(t.Answered) }),
			TTFTP50:        col(func(t *TenantPhase) float64 { return float64(t.TTFTP50) }),
			TTFTP99:        col(func(t *TenantPhase) float64 { return float64(t.TTFTP99) }),
			TTFTP99VsFirst: col(func(t *TenantPhase) float64 { return float64(t.TTFTP99VsFirst) }),
			Throughput:     col(func(t *TenantPhase) float64 { return float64(t.Throughput) })})
	}
	return out
}

// tenantTable writes, when the runs at rate had tenants, each policy's
// table by step and tenant: per seed, then the median over the seeds.
func tenantTable(b *bytes.Buffer, r *Results, rate float64) {
	any := false
	for _, t := range r.Tenants {
		any = any || t.Rate == rate
	}
	if !any {
		return
	}
	fmt.Fprintf(b, "\nrate ×%g — per phase and tenant: TTFT of the answered requests; p99 ÷ the tenant's first phase's; throughput: the phase's requests answered by its end, a second\n", rate)
	tw := tabwriter.NewWriter(b, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tseed\tphase\ttenant\trequests\tanswered\tTTFT p50\tTTFT p99\tp99 ÷ first\tthroughput\t")
	phase := func(step int, name string) string {
		if name == "" {
			return fmt.Sprint(step)
		}
		return fmt.Sprintf("%d %s", step, name)
	}
	for _, p := range r.Policies {
		for _, run := range r.Runs {
			if run.Policy != p || run.Rate != rate {
				continue
			}
			for _, t := range run.Figures.Tenants {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t\n", label(r, p), run.Seed, phase(t.Step, t.Phase), t.Tenant, t.Requests, t.Answered,
					numText(t.TTFTP50, msText), numText(t.TTFTP99, msText), numText(t.TTFTP99VsFirst, ratioText), numText(t.Throughput, rpsText))
			}
		}
		for _, t := range r.Tenants {
			if t.Policy != p || t.Rate != rate {
				continue
			}
			fmt.Fprintf(tw, "%s\tmedian\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", label(r, p), phase(t.Step, t.Phase), t.Tenant, numText(t.Requests, countText),
				numText(t.Answered, countText), numText(t.TTFTP50, msText), numText(t.TTFTP99, msText), numText(t.TTFTP99VsFirst, ratioText),
				numText(t.Throughput, rpsText))
		}
	}
	tw.Flush()
}

func numText(n Num, f func(float64) string) string {
	if x := float64(n); math.IsNaN(x) || math.IsInf(x, 0) {
		return "—"
	}
	return f(float64(n))
}

func rpsText(x float64) string   { return fmt.Sprintf("%.2f/s", x) }
func countText(x float64) string { return fmt.Sprintf("%g", x) }
