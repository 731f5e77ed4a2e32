package lab

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/enginesim/profile"
)

// Delays are the modelled delays between the components, in simulated
// time. Each default is a measurement recorded in docs/benchmarks.md.
type Delays struct {
	// EventToIndex is from an engine's step publishing its KV events to
	// the sidecar having applied them (ZMQ, decode, index, summary).
	// Default 1 ms: the sidecar's event-to-summary lag on loopback, p99
	// ≤ 1 ms paced (docs/benchmarks.md, "Event-to-summary lag").
	EventToIndex time.Duration
	// DeltaInterval is the sidecar's summary tick: changes go out as a
	// numbered delta at the next tick. Default 10 ms, the sidecar's
	// --delta-interval.
	DeltaInterval time.Duration
	// SummaryToPicker is a delta's transit from the sidecar to a picker's
	// fleet state (gRPC stream, apply). Default 8 ms: with the tick's mean
	// wait (5 ms) and EventToIndex, an event is routable ≈ 14–19 ms after
	// the step, as measured end to end (verify's lag probe, median
	// 18.2 ms; event-to-routable p50 ≤ 20 ms at 64 endpoints).
	SummaryToPicker time.Duration
	// LoadPeriod is the sidecar's load report period: each engine's
	// waiting, running and KV usage reach the pickers this often. Default
	// 100 ms, the bench's scrape (peer-policies.md §1.0).
	LoadPeriod time.Duration
	// Render is a request's time in the picker before its decision:
	// parsing and the render call to an engine. Default 10 ms: the
	// picker's arrival-to-dispatch time, render included, p50 on
	// agentic-pressure (docs/benchmarks.md, agentic-pressure).
	Render time.Duration
	// Hop is one way between the picker and an engine (the request
	// forwarded; the answer's bytes back). Default 300 µs: the proxy's
	// overhead end to end, p50 +0.3 ms (docs/benchmarks.md, Picker).
	// A batch of bookings between two pickers takes one hop too.
	Hop time.Duration
	// BookingFlush is how long a picker's booking change waits before its
	// batch goes to the other pickers: the changes of that wait go
	// together. Default 5 ms, kvroute picker's --bookings-flush.
	BookingFlush time.Duration
}

// DefaultDelays returns the measured defaults.
func DefaultDelays() Delays {
	return Delays{EventToIndex: time.Millisecond, DeltaInterval: 10 * time.Millisecond, SummaryToPicker: 8 * time.Millisecond,
		LoadPeriod: 100 * time.Millisecond, Render: 10 * time.Millisecond, Hop: 300 * time.Microsecond,
		BookingFlush: 5 * time.Millisecond}
}

// Validate checks d: every delay ≥ 0, the periods positive.
func (d Delays) Validate() error {
	var errs []error
	for _, v := range []struct {
		name string
		d    time.Duration
	}{{"--event-to-index", d.EventToIndex}, {"--summary-to-picker", d.SummaryToPicker}, {"--render-time", d.Render}, {"--hop", d.Hop}, {"--bookings-flush", d.BookingFlush}} {
		if v.d < 0 {
			errs = append(errs, fmt.Errorf("%s %v: want ≥ 0", v.name, v.d))
		}
	}
	if d.DeltaInterval < time.Millisecond {
		errs = append(errs, fmt.Errorf("--delta-interval %v: want ≥ 1ms", d.DeltaInterval))
	}
	if d.LoadPeriod < time.Millisecond {
		errs = append(errs, fmt.Errorf("--load-period %v: want ≥ 1ms", d.LoadPeriod))
	}
	return errors.Join(errs...)
}

// Config is one lab run's fleet: engines, pickers, policy, delays.
type Config struct {
	// Engines is the number of engines (0: the scenario's).
	Engines int
	// GPUBlocks is each engine's KV blocks (0: the scenario's).
	GPUBlocks int
	// CPUBlocks is each engine's CPU offload tier, in blocks (0: the
	// scenario's; negative: none). Engines with a tier also run vLLM's
	// P2P tier: they advertise a KV source and pull when told to.
	CPUBlocks int
	// MaxModelLen is the engines' context length (0: the cache's size
	// less a block, at most 32,768, as the bench sizes it).
	MaxModelLen int
	// Profile names the engines' latency profile ("" the scenario's,
	// else the engine's default).
	Profile string
	// Capacity sizes the sidecars' and pickers' summaries, in blocks, as
	// kvroute sidecar and picker --capacity do (0: their default,
	// 65,536). An operator sizes it to the engines' KV blocks; the lab's
	// default is the bench's, the flag's default.
	Capacity int
	// EngineURLs, when set, name the engines (one each; default
	// lab://engine-0000, …): decisions that hash endpoints (rendezvous,
	// tie-breaks) then match a fleet of those URLs.
	EngineURLs []string
	// Pickers is how many pickers share the fleet; requests are spread
	// over them at random, as a Kubernetes Service does. Default 1.
	Pickers int
	// Isolated pickers do not exchange their bookings (an ablation: each
	// knows only its own picks until the engines' next load reports).
	// Default false: with several pickers, each sends its booking changes
	// to the others every Delays.BookingFlush, a hop away, as kvroute
	// picker's bookings streams do.
	Isolated bool
	// BookingLoss is the chance that one batch of bookings from one
	// picker to another is lost (0..1; default 0): a fault, for the
	// exchange's loss tolerance.
	BookingLoss float64
	// Policy is the pickers' routing policy.
	Policy score.Policy
	// Delays are the modelled delays.
	Delays Delays
	// Horizon bounds a run in simulated time: a run still going then is
	// an error. Default 6 h.
	Horizon time.Duration
	// LLMDPeak, when positive, is llm-d's calibrated peak prefill
	// throughput (tokens a second) for its load gate, with the recipe's
	// 18 s TTFT penalty (Calibrate; the llm-d-calibrated runs). Only
	// with Policy llm-d.
	LLMDPeak float64
	// NoPulls turns precise's source decision off (PreciseNoPull).
	NoPulls bool
	// EnginePriority runs the engines' schedulers with vLLM's priority
	// policy and, for kvroute's own policies, the pickers with
	// --engine-priority (the priority each pick sets is the request's
	// there). A peer policy sets none: its requests run at 0, first come
	// first served. Default false.
	EnginePriority bool
	// Tune adjusts each picker's configuration (flags such as the
	// bounded-load factor) after the lab's own settings; nil leaves them.
	Tune func(*picker.Config)
}

// DefaultConfig returns one picker, kvroute's precise policy and the
// measured delays; the fleet is the scenario's.
func DefaultConfig() Config {
	return Config{Pickers: 1, Policy: score.Precise, Delays: DefaultDelays(), Horizon: 6 * time.Hour}
}

// Validate checks c.
func (c Config) Validate() error {
	var errs []error
	if c.Engines < 0 || c.GPUBlocks < 0 || c.MaxModelLen < 0 || c.Capacity < 0 { // CPUBlocks < 0 is none
		errs = append(errs, fmt.Errorf("engines %d, GPU blocks %d, max model len %d, capacity %d: want ≥ 0 (0: the default)", c.Engines, c.GPUBlocks, c.MaxModelLen, c.Capacity))
	}
	if c.EngineURLs != nil && c.Engines != len(c.EngineURLs) {
		errs = append(errs, fmt.Errorf("%d engine URLs for %d engines: set Engines to their number", len(c.EngineURLs), c.Engines))
	}
	if c.Pickers < 1 {
		errs = append(errs, fmt.Errorf("--pickers %d: want ≥ 1", c.Pickers))
	}
	if !(c.BookingLoss >= 0 && c.BookingLoss <= 1) {
		errs = append(errs, fmt.Errorf("--booking-loss %v: want 0..1", c.BookingLoss))
	}
	if _, err := score.ParsePolicy(string(c.Policy)); err != nil {
		errs = append(errs, err)
	}
	if c.Profile != "" {
		if _, err := profile.Named(c.Profile); err != nil {
			errs = append(errs, err)
		}
	}
	if c.LLMDPeak < 0 || (c.LLMDPeak > 0 && c.Policy != score.LLMD && c.Policy != score.LLMDP2P) {
		errs = append(errs, fmt.Errorf("llm-d peak %v with policy %s: want a positive peak with llm-d or llm-d+p2p only", c.LLMDPeak, c.Policy))
	}
	if c.Horizon <= 0 {
		errs = append(errs, fmt.Errorf("horizon %v: want > 0", c.Horizon))
	}
	if err := c.Delays.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
