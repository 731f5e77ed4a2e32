package fleet

import (
	"errors"
	"fmt"
	"time"
)

// State of an endpoint, as routing may use it (DESIGN.md §11).
type HealthState uint8

// The states.
const (
	// Cached: routable, and its cache is known — it gets cache credit and
	// a prediction.
	Cached HealthState = iota
	// LoadOnly: routable by load only — its cache is unknown (the event
	// stream is silent, one-sided or lost events; the summary is stale;
	// the sidecar is lost while the engine answers). No cache credit, no
	// prediction.
	LoadOnly
	// Draining: its sidecar announced that the engine is going away (it got
	// SIGTERM, as when the pod is deleted). No new request is sent to it;
	// those in flight finish. When the sidecar then leaves, the endpoint
	// goes at once, with no grace period.
	Draining
	// Down: nothing is sent to it.
	Down
)

// HealthStates lists the states, for metrics.
func HealthStates() []HealthState { return []HealthState{Cached, LoadOnly, Draining, Down} }

func (h HealthState) String() string {
	switch h {
	case Cached:
		return "cached"
	case LoadOnly:
		return "load_only"
	case Draining:
		return "draining"
	case Down:
		return "down"
	}
	return "unknown"
}

// Health is an endpoint's state and why.
type Health struct {
	State  HealthState
	Reason string // "" for Cached
}

// Routable reports whether the endpoint may be picked for a new request.
func (h Health) Routable() bool { return h.State.Routable() }

// Routable reports whether an endpoint in state s may be picked for a new
// request: cached or load-only.
func (s HealthState) Routable() bool { return s == Cached || s == LoadOnly }

// HealthConfig holds the limits health is judged by. Start from
// DefaultHealthConfig: a zero value is invalid, not a default.
type HealthConfig struct {
	// StaleSummary: an endpoint whose sidecar has sent nothing (delta,
	// snapshot, load report) for this long is routed by load only. Sidecars
	// send a load report every scrape (~100–250 ms). Default 2 s.
	StaleSummary time.Duration
	// DownAfter: one whose sidecar has sent nothing for this long is down.
	// Default 10 s.
	DownAfter time.Duration
	// SidecarGrace: an endpoint whose sidecar is lost stays routable by
	// load only this long while its engine answers the picker's own health
	// probe. Default 60 s.
	SidecarGrace time.Duration
	// EjectBase is how long the picker's passive outlier detection takes
	// an endpoint out after a failure reaching its engine (connection
	// refused or reset, a render or dial timeout, 502/503/504 before any
	// byte); each ejection soon after the last readmission doubles it, up
	// to EjectMax. It comes back after the backoff once a health probe of
	// the engine succeeds. Defaults 1 s and 30 s.
	EjectBase, EjectMax time.Duration
}

// DefaultHealthConfig returns the defaults.
func DefaultHealthConfig() HealthConfig {
	return HealthConfig{StaleSummary: 2 * time.Second, DownAfter: 10 * time.Second, SidecarGrace: 60 * time.Second,
		EjectBase: time.Second, EjectMax: 30 * time.Second}
}

// Validate checks c.
func (c HealthConfig) Validate() error {
	var errs []error
	if c.StaleSummary <= 0 {
		errs = append(errs, fmt.Errorf("--stale-summary %v: want a positive duration", c.StaleSummary))
	}
	if c.DownAfter <= c.StaleSummary {
		errs = append(errs, fmt.Errorf("--down-after %v: want longer than --stale-summary (%v)", c.DownAfter, c.StaleSummary))
	}
	if c.SidecarGrace <= 0 {
		errs = append(errs, fmt.Errorf("--sidecar-grace %v: want a positive duration", c.SidecarGrace))
	}
	if c.EjectBase <= 0 || c.EjectMax < c.EjectBase {
		errs = append(errs, fmt.Errorf("--eject-base %v, --eject-max %v: want 0 < base <= max", c.EjectBase, c.EjectMax))
	}
	return errors.Join(errs...)
}

// HealthAt judges e at now: the one place endpoint health is decided. In
// order:
//   - ejected by the picker's passive outlier detection (until its
//     backoff ends and a probe succeeds): down;
//   - the sidecar reports the engine down: down;
//   - the sidecar announced a drain: draining (Judge drops the endpoint
//     once that sidecar is lost);
//   - the sidecar is lost: load only while the engine answers the picker's
//     probe, down when it does not (the state drops the endpoint once the
//     grace period ends);
//   - nothing from the sidecar for DownAfter: down; for StaleSummary: load
//     only (a new endpoint is judged from when it was registered);
//   - the sidecar lost events it could not replay (partial), or judges its
//     live event stream silent or replay-only: load only, with its reason;
//   - otherwise cached.
//
// StateAt is the same judgement without the reason.
func (e *Endpoint) HealthAt(now time.Time, c HealthConfig) Health {
	state, why, quiet := e.judge(now, c)
	return Health{State: state, Reason: e.reason(why, now, quiet, c)}
}

// StateAt is e's state at now as HealthAt judges it, without wording the
// reason: what a decision asks of every endpoint of its group.
func (e *Endpoint) StateAt(now time.Time, c HealthConfig) HealthState {
	state, _, _ := e.judge(now, c)
	return state
}

// cause is why an endpoint is in its state (HealthAt's list, in order).
type cause uint8

const (
	causeNone cause = iota
	causeEjected
	causeEngineDown
	causeDraining
	causeLostSilent
	causeLostAnswers
	causeQuietDown
	causeQuietStale
	causeStreamPartial
	causeStreamQuiet
	causeInfoPartial
)

// judge is HealthAt's judgement: the state, its cause, and for the
// causes of silence how long the sidecar has been quiet. It is the
// verdict (what does not depend on the time) then the time's part.
func (e *Endpoint) judge(now time.Time, c HealthConfig) (HealthState, cause, time.Duration) {
	state, why, fixed := e.verdict()
	if fixed {
		return state, why, 0
	}
	return atTime(state, why, e.heard(), now, c)
}

// verdict is HealthAt's judgement as far as it does not depend on the
// time: a state that holds whatever the time (fixed: ejected, the engine
// down, draining, the sidecar lost), or the state the endpoint is in
// while its sidecar is heard from, which atTime completes.
func (e *Endpoint) verdict() (state HealthState, why cause, fixed bool) {
	switch {
	case e.Ejected: // down before its backoff ends and after, until a probe succeeds
		return Down, causeEjected, true
	case e.Load.EngineDown:
		return Down, causeEngineDown, true
	case e.Load.Draining:
		return Draining, causeDraining, true
	case !e.SidecarLost.IsZero() && !e.EngineAnswers:
		return Down, causeLostSilent, true
	case !e.SidecarLost.IsZero():
		return LoadOnly, causeLostAnswers, true
	}
	switch e.StreamState {
	case StreamPartial:
		return LoadOnly, causeStreamPartial, false
	case StreamSilent, StreamReplayOnly:
		return LoadOnly, causeStreamQuiet, false
	}
	if e.Info.Partial {
		return LoadOnly, causeInfoPartial, false
	}
	return Cached, causeNone, false
}

// heard is when anything last arrived for e: its last update, else when
// it was registered; zero when neither is known.
func (e *Endpoint) heard() time.Time {
	if e.LastUpdate.IsZero() {
		return e.Since
	}
	return e.LastUpdate
}

// atTime completes a verdict that is not fixed at now: nothing heard from
// the sidecar since heard for DownAfter is down, for StaleSummary load
// only; else the verdict stands. A zero heard is never quiet.
func atTime(state HealthState, why cause, heard, now time.Time, c HealthConfig) (HealthState, cause, time.Duration) {
	if !heard.IsZero() {
		switch quiet := now.Sub(heard); {
		case quiet > c.DownAfter:
			return Down, causeQuietDown, quiet
		case quiet > c.StaleSummary:
			return LoadOnly, causeQuietStale, quiet
		}
	}
	return state, why, 0
}

// reason words a judgement's cause.
func (e *Endpoint) reason(why cause, now time.Time, quiet time.Duration, c HealthConfig) string {
	switch why {
	case causeEjected:
		if !now.Before(e.EjectedUntil) {
			return "ejected by the picker (" + e.EjectReason + "); back once a health probe of the engine succeeds"
		}
		return "ejected by the picker after a failure reaching the engine: " + e.EjectReason
	case causeEngineDown:
		return "the sidecar cannot reach the engine: " + e.Load.EngineError
	case causeDraining:
		return "the sidecar announced a drain (" + e.Load.DrainReason + "): no new requests, those in flight finish"
	case causeLostSilent:
		return "the sidecar is lost and the engine does not answer the picker's health probe"
	case causeLostAnswers:
		return fmt.Sprintf("the sidecar is lost (%s ago); the engine answers the picker's health probe", round(now.Sub(e.SidecarLost)))
	case causeQuietDown:
		return fmt.Sprintf("nothing from the sidecar for %s (--down-after %s)", round(quiet), c.DownAfter)
	case causeQuietStale:
		return fmt.Sprintf("the summary is stale: nothing from the sidecar for %s (--stale-summary %s)", round(quiet), c.StaleSummary)
	case causeStreamPartial:
		return "the sidecar lost KV events it could not replay: " + e.StreamReason
	case causeStreamQuiet:
		return "the KV event stream is " + e.StreamState + ": " + e.StreamReason
	case causeInfoPartial:
		return "the sidecar lost KV events it could not replay"
	}
	return ""
}

// The stream states a sidecar reports of its live KV event stream.
const (
	StreamLive       = "live"
	StreamReplayOnly = "replay_only"
	StreamSilent     = "silent"
	StreamPartial    = "partial"
	StreamUnknown    = "unknown"
)

func round(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
