package lab

import (
	"cmp"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/test/lab/stats"
)

// Num is a figure in results.json: a number, or null when undefined
// (NaN or infinite).
type Num float64

// MarshalJSON writes n, null when it is not finite, with the shortest
// representation that reads back exactly.
func (n Num) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

// Figures are one run's figures, as the bench defines them: the hit rate
// is the cached share of the prompt tokens of the requests that
// completed; TTFTs are of those requests, in milliseconds of simulated
// time, to the first output token at the client.
type Figures struct {
	Requests int `json:"requests"`
	// Responses counts the requests sent to /v1/responses.
	Responses int `json:"responses_requests"`
	Completed int `json:"completed"`
	// Refused429 counts 429 answers; Failed every other non-200.
	Refused429 int `json:"refused_429"`
	Failed     int `json:"failed"`
	HitRate    Num `json:"hit_rate"`
	TTFTMean   Num `json:"ttft_mean_ms"`
	TTFTP50    Num `json:"ttft_p50_ms"`
	TTFTP90    Num `json:"ttft_p90_ms"`
	TTFTP99    Num `json:"ttft_p99_ms"`
	// Continuations are the completed follow-ups: requests of a later
	// turn (Turn > 1) that continue an answered turn, the endpoint that
	// turn went to known (Outcome.PrevEndpoint: the session's Prev, else
	// the conversation's latest answered turn when it was sent).
	Continuations int `json:"continuations"`
	// WarmReturnRate is the share of Continuations that landed on their
	// previous turn's engine (Endpoint = PrevEndpoint): follow-ups back on
	// the worker that served the turn they follow (the stickiness SMG's
	// cache-aware routing aims at). Null without continuations.
	WarmReturnRate Num `json:"warm_return_rate"`
	// LoadImbalance is the busiest engine's completed requests ÷ the
	// mean over the engines.
	LoadImbalance Num `json:"load_imbalance"`
	// LoadCV is the coefficient of variation of the completed requests
	// per engine: their population standard deviation ÷ their mean, over
	// every engine of the fleet (those that served none count as 0); 0
	// when spread evenly, null when none completed.
	LoadCV Num `json:"load_cv"`
	// Duration is the run's simulated length, first send to last answer.
	DurationS Num `json:"duration_s"`
	// Resyncs counts summary deltas a picker took out of order (0 in a
	// sound run).
	Resyncs int `json:"resyncs,omitempty"`
	// PredictionError is the median of |predicted − observed| ÷ observed
	// TTFT (from the dispatch) over the predicted requests after the
	// first fifth of them (the steady state); null when nothing was
	// predicted.
	PredictionError Num `json:"prediction_median_error"`
	// Tiers are where the completed requests' prompt KV came from, when
	// the engines run a CPU tier or a source was named (absent else).
	Tiers *Tiers `json:"tiers,omitempty"`
	// Tenants is the table by load step and tenant, when the requests
	// have tenants (absent else).
	Tenants []TenantPhase `json:"tenants,omitempty"`
}

// Tiers split the completed requests' prompt tokens by where their KV
// came from — the engine's GPU prefix cache, its own CPU tier (loaded
// back), a peer's CPU tier (pulled), or nowhere (recomputed) — as shares
// of the prompt tokens, and count the pulls: requests that pulled, the
// bytes they moved, the busiest source's share of them (herding: 1 when
// one source serves every pull), sources named that served nothing (the
// blocks were gone: a wrong source, or a failed or timed-out pull, all
// recomputed) and requests that failed with a source named (any failure,
// whatever its cause: the target is none).
type Tiers struct {
	GPUHit     Num `json:"gpu_hit_share"`
	CPUHit     Num `json:"cpu_hit_share"`
	Pulled     Num `json:"pulled_share"`
	Recomputed Num `json:"recomputed_share"`
	// SourcesNamed counts requests sent with a source; Pulls those that
	// pulled something.
	SourcesNamed   int `json:"sources_named"`
	Pulls          int `json:"pulls"`
	PulledGB       Num `json:"pulled_gb"`
	MaxSourceShare Num `json:"max_source_share"`
	MissedPulls    int `json:"missed_pulls"`
	FailedWithPull int `json:"failed_with_source"`
}

// tiersOf is outs' Tiers, nil when no request touched a tier.
func tiersOf(outs []Outcome) *Tiers {
	var t Tiers
	var prompt, gpu, cpu, pulled int
	var bytes int64
	per := map[string]int{}
	for i := range outs {
		o := &outs[i]
		if o.Source != "" {
			t.SourcesNamed++
			if !o.OK() {
				t.FailedWithPull++
			}
		}
		if !o.OK() {
			continue
		}
		prompt += o.PromptTokens
		gpu, cpu, pulled = gpu+o.GPUHitTokens, cpu+o.CPUHitTokens, pulled+o.PulledTokens
		bytes += o.PulledBytes
		switch {
		case o.PulledTokens > 0:
			t.Pulls++
			per[o.Source]++
		case o.Source != "":
			t.MissedPulls++
		}
	}
	if t.SourcesNamed == 0 && cpu == 0 && pulled == 0 {
		return nil
	}
	t.GPUHit, t.CPUHit, t.Pulled = ratio(gpu, prompt), ratio(cpu, prompt), ratio(pulled, prompt)
	t.Recomputed = ratio(prompt-gpu-cpu-pulled, prompt)
	t.PulledGB = Num(float64(bytes) / 1e9)
	mx := 0
	for _, n := range per {
		mx = max(mx, n)
	}
	t.MaxSourceShare = ratio(mx, t.Pulls)
	return &t
}

// CompletedShare is the share of requests that completed.
func (f *Figures) CompletedShare() float64 {
	if f.Requests == 0 {
		return math.NaN()
	}
	return float64(f.Completed) / float64(f.Requests)
}

// figuresOf sums a run's outcomes over its engines.
func figuresOf(outs []Outcome, engines []string) Figures {
	f := Figures{Requests: len(outs)}
	var prompt, cached, warm int
	var ttft []float64
	per := map[string]int{}
	var first, last time.Duration = math.MaxInt64, 0
	for i := range outs {
		o := &outs[i]
		first, last = min(first, o.Start), max(last, o.End)
		if o.Path == "/v1/responses" {
			f.Responses++
		}
		switch {
		case o.OK():
		case o.Status == http.StatusTooManyRequests:
			f.Refused429++
			continue
		default:
			f.Failed++
			continue
		}
		f.Completed++
		prompt += o.PromptTokens
		cached += o.CachedTokens
		ttft = append(ttft, float64(o.TTFT)/float64(time.Millisecond))
		per[o.Endpoint]++
		if o.Turn > 1 && o.PrevEndpoint != "" {
			f.Continuations++
			if o.PrevEndpoint == o.Endpoint {
				warm++
			}
		}
	}
	f.HitRate, f.WarmReturnRate = ratio(cached, prompt), ratio(warm, f.Continuations)
	f.TTFTMean, f.TTFTP50, f.TTFTP90, f.TTFTP99 = Num(meanOf(ttft)), Num(stats.Quantile(ttft, 0.5)), Num(stats.Quantile(ttft, 0.9)), Num(stats.Quantile(ttft, 0.99))
	f.LoadImbalance, f.LoadCV = loadSpread(per, engines)
	f.DurationS = Num(math.NaN())
	if len(outs) > 0 {
		f.DurationS = Num((last - first).Seconds())
	}
	f.PredictionError = Num(predictionError(outs))
	f.Tiers = tiersOf(outs)
	return f
}

// loadSpread is the spread of the requests per engine over the fleet's
// engines (an engine absent from per served none): the busiest ÷ the
// mean, and the coefficient of variation (population standard deviation
// ÷ mean). Both NaN when none served any.
func loadSpread(per map[string]int, engines []string) (imbalance, cv Num) {
	mx, sum := 0, 0
	for _, e := range engines {
		mx, sum = max(mx, per[e]), sum+per[e]
	}
	if sum == 0 {
		return Num(math.NaN()), Num(math.NaN())
	}
	mean := float64(sum) / float64(len(engines))
	ss := 0.0
	for _, e := range engines {
		d := float64(per[e]) - mean
		ss += d * d
	}
	return Num(float64(mx) / mean), Num(math.Sqrt(ss/float64(len(engines))) / mean)
}

// predictionError is the median relative error of the predicted
// requests after the first fifth of them, by start (NaN: none).
func predictionError(outs []Outcome) float64 {
	var pred []*Outcome
	for i := range outs {
		if o := &outs[i]; o.PredictedTTFT > 0 && o.DispatchTTFT > 0 {
			pred = append(pred, o)
		}
	}
	slices.SortStableFunc(pred, func(a, b *Outcome) int { return cmp.Compare(a.Start, b.Start) })
	var errs []float64
	for _, o := range pred[len(pred)/5:] {
		errs = append(errs, math.Abs(float64(o.PredictedTTFT-o.DispatchTTFT))/float64(o.DispatchTTFT))
	}
	return stats.Quantile(errs, 0.5)
}

func ratio(a, b int) Num {
	if b == 0 {
		return Num(math.NaN())
	}
	return Num(float64(a) / float64(b))
}

func meanOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// figure names the figures compared across policies, and which way is
// better.
type figure struct {
	name         string
	higherBetter bool
	of           func(*Figures) float64
}

// compared are the figures every comparison reports.
func compared() []figure {
	return []figure{
		{"hit_rate", true, func(f *Figures) float64 { return float64(f.HitRate) }},
		{"ttft_mean_ms", false, func(f *Figures) float64 { return float64(f.TTFTMean) }},
		{"ttft_p90_ms", false, func(f *Figures) float64 { return float64(f.TTFTP90) }},
		{"ttft_p99_ms", false, func(f *Figures) float64 { return float64(f.TTFTP99) }},
	}
}
