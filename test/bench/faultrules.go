package bench

import (
	"maps"
	"slices"
	"time"
)

// The faults scenario's pure rules: which failures are the router's, how
// hit rates are windowed, when a hit rate has recovered, and picker
// counters across restarts. No I/O; times are inputs.

// Failure classes.
const (
	ClassRouter      = "router"
	ClassUnavoidable = "unavoidable"
)

// Incident kinds: what was killed or stopped.
const (
	IncidentEngine = "engine"
	IncidentPicker = "picker"
)

// Incident is a process killed (SIGKILL) or stopped (SIGSTOP): the signal
// was sent at At, and Until is when the fleet was rid of it — an engine's
// exit reaped; a picker's exit reaped and the client's Service view
// dropping it (its first failed /readyz probe), until which requests still
// go to it on kept-alive connections that break; = At for a stop, which
// takes effect at once (zero means At). Requests
// in flight on it at any moment from At to Until are those it cut: an engine (Target its base URL, as the
// picker's x-kvroute-endpoint names it) or a picker (Target its base URL,
// as the client sent to it). A picker's SIGTERM (a drain) is not an
// incident: a drain must fail nothing. Nor is anything done to a sidecar,
// to gossip, to events or to the cache: no request is in flight on those.
type Incident struct {
	Kind      string
	Target    string
	At, Until time.Time
}

// ClassificationRule is the rule Classify applies, as results.json states
// it.
const ClassificationRule = "a failed request is unavoidable when it was in flight, at the moment of the kill or stop, " +
	"on the engine SIGKILLed or SIGSTOPped (its x-kvroute-endpoint is that engine's) or through the picker SIGKILLed " +
	"(the client sent it to that picker): it started no later than the fleet was rid of the process (an engine: its " +
	"exit reaped; a picker: its exit reaped and the client's Service view dropping it at its first failed /readyz " +
	"probe, as requests on kept-alive connections still reach it until then; a stop: the signal sent) and failed no " +
	"earlier than the signal was sent. Every other " +
	"failed request is router_failed: sent after the fault to a process already dead or stopped, a 5xx or any other " +
	"error status from a picker, a stream cut or ended without its completion event or usage, every failure during a " +
	"picker's drain (SIGTERM), a sidecar's kill or a gossip partition, a cache reset or event loss, and any failure " +
	"with no fault at all. A refused connection is retried by the client on the other picker and is not a failure."

// Classify says whose fault the failed request o is, by
// ClassificationRule, and which incident (its index; -1 for the router).
// o must have failed (o.Err set); o.End is when it failed.
func Classify(o Outcome, incidents []Incident) (class string, incident int) {
	for i, in := range incidents {
		until := in.Until
		if until.IsZero() {
			until = in.At
		}
		if o.Start.After(until) || o.End.Before(in.At) {
			continue
		}
		switch {
		case in.Kind == IncidentEngine && o.Endpoint != "" && o.Endpoint == in.Target:
			return ClassUnavoidable, i
		case in.Kind == IncidentPicker && o.Picker != "" && o.Picker == in.Target:
			return ClassUnavoidable, i
		}
	}
	return ClassRouter, -1
}

// hitPoint is one answered request: its start in scenario seconds, its
// prompt and cached tokens.
type hitPoint struct {
	T              float64
	Prompt, Cached int
}

// hitRate is the cached ÷ prompt tokens of the requests starting in
// [from, to), and how many there were (rate 0 without prompt tokens).
func hitRate(points []hitPoint, from, to float64) (float64, int) {
	var prompt, cached, n int
	for _, p := range points {
		if p.T >= from && p.T < to {
			prompt, cached, n = prompt+p.Prompt, cached+p.Cached, n+1
		}
	}
	if prompt == 0 {
		return 0, n
	}
	return float64(cached) / float64(prompt), n
}

// Recovery: the hit rate is back when a window of recoveryWindow seconds
// holding at least recoveryMinRequests answered requests reaches
// recoveryShare of the hit rate before the fault; windows slide by
// recoveryStep.
const (
	recoveryWindow      = 5.0
	recoveryStep        = 1.0
	recoveryMinRequests = 5
	recoveryShare       = 0.95
)

// recoveryTime is the time from restored (scenario seconds) until the hit
// rate is back within 5% of before (relative: ≥ 0.95 × before): the end of
// the first window [t, t+recoveryWindow), t = restored, restored+1 s, …,
// that holds recoveryMinRequests answered requests and reaches it, minus
// restored. Only windows ending by until (the next fault, or the end of
// the load) count; false when none is back by then.
func recoveryTime(points []hitPoint, before, restored, until float64) (float64, bool) {
	for t := restored; t+recoveryWindow <= until; t += recoveryStep {
		rate, n := hitRate(points, t, t+recoveryWindow)
		if n >= recoveryMinRequests && rate >= recoveryShare*before {
			return t + recoveryWindow - restored, true
		}
	}
	return 0, false
}

// counterTrack accumulates a picker's counters across its restarts: a
// value below the last one seen means the process started again from 0,
// so the new value is all new. What a killed picker counted after its
// last scrape is lost.
type counterTrack struct {
	last, total map[string]float64
}

// observe takes a scrape's values and returns the running totals.
func (c *counterTrack) observe(now map[string]float64) map[string]float64 {
	if c.total == nil {
		c.last, c.total = map[string]float64{}, map[string]float64{}
	}
	reset := false
	for k, v := range now {
		if v < c.last[k] {
			reset = true
		}
	}
	for k, v := range now {
		if reset {
			c.total[k] += v
		} else {
			c.total[k] += v - c.last[k]
		}
	}
	c.last = maps.Clone(now)
	return maps.Clone(c.total)
}

// counterSnap is the pickers' summed totals at scenario time T.
type counterSnap struct {
	T      float64
	Totals map[string]float64
}

// countsBetween is what the totals grew by from the last snapshot at or
// before from to the last at or before to (snapshots in time order).
func countsBetween(snaps []counterSnap, from, to float64) map[string]int {
	at := func(t float64) map[string]float64 {
		i, _ := slices.BinarySearchFunc(snaps, t, func(s counterSnap, t float64) int {
			if s.T <= t {
				return -1
			}
			return 1
		})
		if i == 0 {
			return nil
		}
		return snaps[i-1].Totals
	}
	a, b := at(from), at(to)
	out := map[string]int{}
	for k, v := range b {
		if d := int(v - a[k] + 0.5); d > 0 {
			out[k] = d
		}
	}
	return out
}
