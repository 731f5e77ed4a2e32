package predict

import (
	"errors"
	"fmt"
	"math"
)

// The terms' features, in the order of Vector and of the coefficients.
const (
	fOverhead    = iota // 1: the fixed cost of a request (hop, the step it lands in)
	fTail               // the uncached tail, in thousands of tokens
	fAttention          // tail × (context + tail/2), in millions of tokens²
	fAhead              // prefill tokens queued ahead, in thousands
	fRunning            // running decodes
	fRunningTail        // running decodes × the tail, in thousands of tokens
	fQueued             // requests queued ahead
	fKVUsage            // the engine\'s KV cache usage, 0..1
	fLoaded             // tokens loaded back from the endpoint's own CPU tier, in thousands
	fPulls              // 1 when the prefix is pulled from a peer (the pull's fixed cost)
	fPulled             // tokens pulled from a peer × the pulls sharing its link, in thousands
	NumTerms
)

// TermNames names the coefficients, for metrics and /debug.
var termNames = [NumTerms]string{"overhead_s", "tail_s_per_ktok", "attention_s_per_mtok2", "ahead_s_per_ktok", "running_s_per_seq",
	"running_tail_s_per_seq_ktok", "queued_s_per_request", "kv_usage_s", "cpu_load_s_per_ktok", "pull_s", "pull_s_per_ktok"}

// TermName is the name of coefficient i (0 ≤ i < NumTerms).
func TermName(i int) string { return termNames[i] }

// Features are what the model needs of a request on an endpoint.
type Features struct {
	// Tail is the prompt tokens the endpoint must prefill (not cached);
	// Context the tokens before them it holds (cached).
	Tail, Context float64
	// Ahead is the prefill work queued ahead of the request there, in
	// tokens, and Queued how many requests that is: a request waits per
	// token of prefill ahead of it and, where the engine's KV cache is the
	// bottleneck, per request ahead (each must finish decoding to make
	// room), which KVUsage (0..1, its last report) also tells.
	Ahead, Queued, KVUsage float64
	// Running is the decodes running there.
	Running float64
	// Loaded is the prompt tokens the endpoint loads back from its own
	// CPU tier (held there beyond its GPU prefix). Pulls is 1 when the
	// prefix is pulled from a peer's CPU tier (0 otherwise), and Pulled
	// the tokens pulled, times the pulls sharing the source's link (1 +
	// those already in flight from it). Tokens loaded or pulled are part
	// of Context, not of Tail.
	Loaded, Pulls, Pulled float64
}

// Vector is f's feature vector.
func (f Features) Vector() [NumTerms]float64 {
	t, s := max(f.Tail, 0)/1e3, max(f.Context, 0)/1e3
	r := max(f.Running, 0)
	return [NumTerms]float64{1, t, t * (s + t/2), max(f.Ahead, 0) / 1e3, r, r * t, max(f.Queued, 0), min(max(f.KVUsage, 0), 1),
		max(f.Loaded, 0) / 1e3, min(max(f.Pulls, 0), 1), max(f.Pulled, 0) / 1e3}
}

// Terms is a prediction in seconds, by term.
type Terms struct {
	Overhead float64 `json:"overhead_s"`
	Wait     float64 `json:"wait_s"`
	Prefill  float64 `json:"prefill_s"`
	TierLoad float64 `json:"tier_load_s"`
	Decode   float64 `json:"decode_slowdown_s"`
}

// Total is the predicted TTFT in seconds.
func (t Terms) Total() float64 { return t.Overhead + t.Wait + t.Prefill + t.TierLoad + t.Decode }

// Config tunes the learning. Start from DefaultConfig: a zero field is
// invalid, not a default, and Validate says which.
type Config struct {
	// Prior are the starting coefficients (Terms' order; units per
	// TermName). Default: 50 ms a request, 10,000 prefill tokens a second
	// for the tail and for the work ahead, no attention cost, 1 ms a
	// running decode, nothing per queued request or for KV usage — slower
	// than any published GPU row, so that cached prefixes and queues weigh
	// before anything is learned; and, for the tiers, 10 µs a token loaded
	// back from CPU, 20 ms a pull and 10 µs a token pulled: cheaper than
	// the prior's prefill, optimistic on purpose, so that a fleet whose
	// engines can pull tries it and learns its real cost (a prior that
	// priced pulls above recompute would never observe one).
	Prior [NumTerms]float64
	// PriorSpread is each coefficient's prior standard deviation: how far
	// the first observations may move it at once.
	PriorSpread [NumTerms]float64
	// Forget is the forgetting factor per observation (0 < Forget ≤ 1):
	// an observation's weight halves after ln 2 / (1 − Forget) of them.
	// Default 0.995 (≈140).
	Forget float64
	// OutlierSigmas clips a residual at this many robust deviations.
	// Default 3.
	OutlierSigmas float64
	// SpeedGain is the weight of one observation in an endpoint's speed
	// factor. Default 0.1.
	SpeedGain float64
	// MinSpeed and MaxSpeed bound an endpoint's speed factor. Defaults
	// 0.1 and 10.
	MinSpeed, MaxSpeed float64
	// TokensGain is the weight of one report (or observation) in an
	// endpoint's mean uncached prompt. Default 0.2.
	TokensGain float64
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		Prior:         [NumTerms]float64{0.05, 0.1, 0, 0.1, 0.001, 0, 0, 0, 0.01, 0.02, 0.01},
		PriorSpread:   [NumTerms]float64{0.1, 0.1, 0.01, 0.1, 0.01, 0.001, 0.5, 1, 0.02, 1, 0.05},
		Forget:        0.995,
		OutlierSigmas: 3,
		SpeedGain:     0.1,
		MinSpeed:      0.1, MaxSpeed: 10,
		TokensGain: 0.2,
	}
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []error
	for i := range c.Prior {
		if !(c.Prior[i] >= 0) || math.IsInf(c.Prior[i], 0) {
			errs = append(errs, fmt.Errorf("prior %s %v: want a finite value ≥ 0", termNames[i], c.Prior[i]))
		}
		if !(c.PriorSpread[i] > 0) || math.IsInf(c.PriorSpread[i], 0) {
			errs = append(errs, fmt.Errorf("prior spread %s %v: want a finite value > 0", termNames[i], c.PriorSpread[i]))
		}
	}
	if !(c.Forget > 0 && c.Forget <= 1) {
		errs = append(errs, fmt.Errorf("forgetting factor %v: want 0 < f ≤ 1", c.Forget))
	}
	if !(c.OutlierSigmas >= 1) || math.IsInf(c.OutlierSigmas, 0) {
		errs = append(errs, fmt.Errorf("outlier clip %v: want ≥ 1 robust deviations", c.OutlierSigmas))
	}
	if !(c.SpeedGain > 0 && c.SpeedGain <= 1) || !(c.TokensGain > 0 && c.TokensGain <= 1) {
		errs = append(errs, errors.New("speed and tokens gains: want 0 < gain ≤ 1"))
	}
	if !(c.MinSpeed > 0 && c.MinSpeed <= 1 && c.MaxSpeed >= 1) || math.IsInf(c.MaxSpeed, 0) {
		errs = append(errs, fmt.Errorf("speed bounds %v..%v: want 0 < min ≤ 1 ≤ max, finite", c.MinSpeed, c.MaxSpeed))
	}
	return errors.Join(errs...)
}

// Coefficients are a fit's coefficients (TermName's order and units).
type Coefficients [NumTerms]float64

// Terms prices f with these coefficients at speed (an endpoint's factor;
// 1 for the group's curve).
func (c *Coefficients) Terms(f Features, speed float64) Terms {
	x := f.Vector()
	return Terms{
		Overhead: speed * c[fOverhead] * x[fOverhead],
		Prefill:  speed * (c[fTail]*x[fTail] + c[fAttention]*x[fAttention]),
		Wait:     speed * (c[fAhead]*x[fAhead] + c[fQueued]*x[fQueued] + c[fKVUsage]*x[fKVUsage]),
		Decode:   speed * (c[fRunning]*x[fRunning] + c[fRunningTail]*x[fRunningTail]),
		// Copies and pulls run over PCIe and the network, not the GPU's
		// compute: an endpoint's speed factor does not scale them.
		TierLoad: c[fLoaded]*x[fLoaded] + c[fPulls]*x[fPulls] + c[fPulled]*x[fPulled],
	}
}

func (c *Coefficients) dot(x [NumTerms]float64) float64 {
	y := 0.0
	for i := range x {
		y += c[i] * x[i]
	}
	return y
}
