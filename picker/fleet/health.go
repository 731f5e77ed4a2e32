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
func (h Health) Routable() bool { return h.State == Cached || h.State == LoadOnly }

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
func (e *Endpoint) HealthAt(now time.Time, c HealthConfig) Health {
	switch {
	case e.Ejected && now.Before(e.EjectedUntil):
		return Health{Down, "ejected by the picker after a failure reaching the engine: " + e.EjectReason}
	case e.Ejected:
		return Health{Down, "ejected by the picker (" + e.EjectReason + "); back once a health probe of the engine succeeds"}
	case e.Load.EngineDown:
		return Health{Down, "the sidecar cannot reach the engine: " + e.Load.EngineError}
	case e.Load.Draining:
		return Health{Draining, "the sidecar announced a drain (" + e.Load.DrainReason + "): no new requests, those in flight finish"}
	case !e.SidecarLost.IsZero() && !e.EngineAnswers:
		return Health{Down, "the sidecar is lost and the engine does not answer the picker's health probe"}
	case !e.SidecarLost.IsZero():
		return Health{LoadOnly, fmt.Sprintf("the sidecar is lost (%s ago); the engine answers the picker's health probe", round(now.Sub(e.SidecarLost)))}
	}
	last := e.LastUpdate
	if last.IsZero() {
		last = e.Since
	}
	if !last.IsZero() {
		switch quiet := now.Sub(last); {
		case quiet > c.DownAfter:
			return Health{Down, fmt.Sprintf("nothing from the sidecar for %s (--down-after %s)", round(quiet), c.DownAfter)}
		case quiet > c.StaleSummary:
			return Health{LoadOnly, fmt.Sprintf("the summary is stale: nothing from the sidecar for %s (--stale-summary %s)", round(quiet), c.StaleSummary)}
		}
	}
	switch e.StreamState {
	case StreamPartial:
		return Health{LoadOnly, "the sidecar lost KV events it could not replay: " + e.StreamReason}
	case StreamSilent, StreamReplayOnly:
		return Health{LoadOnly, "the KV event stream is " + e.StreamState + ": " + e.StreamReason}
	}
	if e.Info.Partial {
		return Health{LoadOnly, "the sidecar lost KV events it could not replay"}
	}
	return Health{State: Cached}
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
