package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/workload"
)

// Phased is a load in phases, each sending Poisson arrivals per tenant at
// a multiple of the fleet's capacity: the overload and tenants scenarios
// (admission control, issue 19). Every request is a streaming completion
// of its tenant's shared prefix (SharedTokens) and a prompt of its own
// (UniqueTokens, all uncached), OutputTokens long; a tenant is named by
// the x-kvroute-tenant header and salts its prompts with its own
// cache_salt. The client never retries: a refusal is counted as it came.
//
// Capacity is prefill-bound: engines × the simulator's prefill rate ÷
// UniqueTokens requests per second (decoding is batched: OutputTokens
// steps are shared by every running request).
type Phased struct {
	Label  string
	Phases []Phase
	// Engines [2]; GPUBlocks [2048]; SharedTokens [256]; UniqueTokens
	// [2000]; OutputTokens [8].
	Engines, GPUBlocks                       int
	SharedTokens, UniqueTokens, OutputTokens int
}

// Phase is one period of load: each tenant's rate as a multiple of the
// fleet's capacity.
type Phase struct {
	Name string
	For  time.Duration // simulated time
	Load map[string]float64
}

// Overload is 4× the fleet's capacity for 60 s between two periods at
// half of it.
func Overload() Phased {
	return Phased{Label: "overload", Phases: []Phase{
		{Name: "unloaded", For: 30 * time.Second, Load: map[string]float64{"t1": 0.5}},
		{Name: "overload", For: 60 * time.Second, Load: map[string]float64{"t1": 4}},
		{Name: "after", For: 20 * time.Second, Load: map[string]float64{"t1": 0.5}},
	}}
}

// Tenants is a light tenant alone, then beside a heavy one sending ten
// times its load (together 2.75× the fleet's capacity).
func Tenants() Phased {
	return Phased{Label: "tenants", Phases: []Phase{
		{Name: "alone", For: 30 * time.Second, Load: map[string]float64{"light": 0.25}},
		{Name: "contended", For: 60 * time.Second, Load: map[string]float64{"light": 0.25, "heavy": 2.5}},
	}}
}

func (p Phased) withDefaults() Phased {
	p.Engines, p.GPUBlocks = cmp.Or(p.Engines, 2), cmp.Or(p.GPUBlocks, 2048)
	p.SharedTokens, p.UniqueTokens, p.OutputTokens = cmp.Or(p.SharedTokens, 256), cmp.Or(p.UniqueTokens, 2000), cmp.Or(p.OutputTokens, 8)
	return p
}

// Name is the scenario's name.
func (p Phased) Name() string { return p.Label }

// Fleet is the fleet the scenario is defined for.
func (p Phased) Fleet() FleetConfig {
	p = p.withDefaults()
	return FleetConfig{Engines: p.Engines, GPUBlocks: p.GPUBlocks}
}

// Capacity is the fleet's request rate, prefill-bound (type doc), for
// engines engines.
func (p Phased) Capacity(engines int) float64 {
	p = p.withDefaults()
	return float64(engines) * enginesim.DefaultConfig().Sim.Profile().PrefillTokensPerSecond / float64(p.UniqueTokens)
}

// PhaseList is the phases, for results.
func (p Phased) PhaseList() []Phase { return p.Phases }

// Run sends the phases one after another; each outcome's Step is its
// phase (1, 2, …) and Tenant its tenant.
func (p Phased) Run(ctx context.Context, c *Client, rng *rand.Rand) ([]Outcome, error) {
	p = p.withDefaults()
	if len(p.Phases) == 0 {
		return nil, errors.New(p.Label + ": no phases")
	}
	engines := c.Engines
	if engines == 0 {
		engines = p.Engines
	}
	capacity := p.Capacity(engines)
	tenants := map[string]string{}
	for _, ph := range p.Phases {
		for t := range ph.Load {
			if _, ok := tenants[t]; !ok {
				tenants[t] = fmt.Sprintf("Tenant %s shared instructions. ", t) + workload.Text(rng, p.SharedTokens)
			}
		}
	}
	var mu sync.Mutex
	var outs []Outcome
	var wg sync.WaitGroup
	n := 0
	for i, ph := range p.Phases {
		start := time.Now()
		names := slices.Sorted(func(yield func(string) bool) {
			for t := range ph.Load {
				if !yield(t) {
					return
				}
			}
		})
		// One merged Poisson stream: each arrival's tenant drawn by rate.
		total := 0.0
		for _, t := range names {
			total += ph.Load[t] * capacity
		}
		for at := time.Duration(0); total > 0; {
			at += time.Duration(rng.ExpFloat64() / total * float64(time.Second))
			if at >= ph.For || !c.WaitUntil(ctx, start.Add(c.Wall(at))) {
				break
			}
			x, tenant := rng.Float64()*total, names[len(names)-1]
			for _, t := range names {
				if x -= ph.Load[t] * capacity; x < 0 {
					tenant = t
					break
				}
			}
			n++
			body := map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": tenants[tenant] + fmt.Sprintf("Request %d. ", n) + workload.Text(rng, p.UniqueTokens),
				"max_tokens": p.OutputTokens, "cache_salt": "salt-" + tenant}
			conv, phase := n, i+1
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := c.CompletionsAs(ctx, tenant, body)
				o.Conversation, o.Turn, o.Step = conv, 1, phase
				mu.Lock()
				outs = append(outs, o)
				mu.Unlock()
			}()
		}
		if !c.WaitUntil(ctx, start.Add(c.Wall(ph.For))) {
			break
		}
	}
	wg.Wait()
	slices.SortStableFunc(outs, func(x, y Outcome) int { return x.Start.Compare(y.Start) })
	return outs, ctx.Err()
}

// phased is a scenario in phases (Phased).
type phased interface {
	PhaseList() []Phase
}

// PhaseResult is one tenant's requests in one phase.
type PhaseResult struct {
	Phase    string  `json:"phase"`
	Tenant   string  `json:"tenant"`
	Load     float64 `json:"load_x_capacity"`
	Requests int     `json:"requests"`
	OK       int     `json:"ok"`
	// Shed are 429 answers; ShedWithRetryAfter those carrying
	// Retry-After. ServerErrors are 5xx answers; OtherErrors failures
	// without a status (a connection cut, a stream without usage).
	Shed               int `json:"shed_429"`
	ShedWithRetryAfter int `json:"shed_429_with_retry_after"`
	ServerErrors       int `json:"server_errors_5xx"`
	OtherErrors        int `json:"other_errors"`
	// TTFT of the answered requests, simulated ms.
	TTFT Quantiles `json:"ttft_ms"`
}

// phaseResults summarizes outs by phase and tenant, in phase order then
// by tenant.
func phaseResults(outs []Outcome, phases []Phase, scale float64) []PhaseResult {
	type key struct {
		phase  int
		tenant string
	}
	by := map[key][]Outcome{}
	for _, o := range outs {
		by[key{o.Step, o.Tenant}] = append(by[key{o.Step, o.Tenant}], o)
	}
	var res []PhaseResult
	for i, ph := range phases {
		for _, t := range slices.Sorted(func(yield func(string) bool) {
			for t := range ph.Load {
				if !yield(t) {
					return
				}
			}
		}) {
			pr := PhaseResult{Phase: ph.Name, Tenant: t, Load: ph.Load[t]}
			var ttft []float64
			for _, o := range by[key{i + 1, t}] {
				pr.Requests++
				switch {
				case o.Err == nil:
					pr.OK++
					ttft = append(ttft, o.TTFT.Seconds()*1000/scale)
				case o.Status == http.StatusTooManyRequests:
					pr.Shed++
					if o.RetryAfter {
						pr.ShedWithRetryAfter++
					}
				case o.Status >= 500:
					pr.ServerErrors++
				default:
					pr.OtherErrors++
				}
			}
			pr.TTFT = quantiles(ttft)
			res = append(res, pr)
		}
	}
	return res
}

// phaseTable is summary.txt's table of the phases (empty without).
func phaseTable(r *Results) string {
	if len(r.Order) == 0 || len(r.Policies[r.Order[0]].Phases) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nper phase and tenant (load × the fleet's prefill-bound capacity; TTFT of answered requests)\n%-13s %-10s %-7s %5s %8s %6s %6s %9s %5s %6s %10s %10s\n",
		"policy", "phase", "tenant", "load", "requests", "ok", "429", "w/ retry", "5xx", "other", "ttft p50", "ttft p99")
	for _, p := range r.Order {
		for _, x := range r.Policies[p].Phases {
			fmt.Fprintf(&b, "%-13s %-10s %-7s %5.2f %8d %6d %6d %9d %5d %6d %8.0fms %8.0fms\n", p, x.Phase, x.Tenant, x.Load, x.Requests, x.OK,
				x.Shed, x.ShedWithRetryAfter, x.ServerErrors, x.OtherErrors, x.TTFT.P50, x.TTFT.P99)
		}
	}
	return b.String()
}
