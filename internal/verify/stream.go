package verify

import (
	"cmp"
	"fmt"
)

// The stream states a sidecar reports per rank on /debug/state.
const (
	StreamLive       = "live"        // live batches arrive
	StreamReplayOnly = "replay_only" // batches arrive only through replay
	StreamSilent     = "silent"      // the engine serves, no batch arrives
	StreamPartial    = "partial"     // events were lost for good
	StreamUnknown    = "unknown"     // no evidence yet
)

// StreamFacts is what an endpoint's sidecar says of that rank's live KV
// event stream and of its engine, read after the probes have sent it
// traffic.
type StreamFacts struct {
	Endpoint string
	Rank     int
	// DebugURL is the sidecar's debug base URL ("" unknown: not asked).
	DebugURL string
	// Err, when set, is why its /debug/state could not be read.
	Err string
	// Found: /debug/state has an entry of this endpoint and rank.
	Found bool
	// Reported: the entry carries stream_state (older sidecars do not).
	Reported bool
	State    string // stream_state
	Reason   string // stream_reason: why, with the likely fix
	// EngineDown: the sidecar's last health check or scrape of its engine
	// failed (EngineError says how).
	EngineDown  bool
	EngineError string
	// Served: verify's own requests reached the engine and were answered
	// (so an "unknown" stream has had its evidence).
	Served bool
	// WaitedSecs is how long verify waited for the sidecar to leave
	// "unknown".
	WaitedSecs float64
}

// streamCause is the likely cause of a stream state, when the sidecar
// gives no reason of its own.
func streamCause(state string) string {
	switch state {
	case StreamSilent:
		return "the engine serves requests but no live KV event reaches the sidecar: the engine and the sidecar must not both connect " +
			"(an engine --kv-events-config endpoint with a concrete host makes the engine connect, so the sidecar needs --kv-events-mode bind; " +
			"a wildcard host makes it bind, so the sidecar connects)"
	case StreamReplayOnly:
		return "KV events reach the sidecar only through replay catch-ups, seconds late: its live socket delivers nothing " +
			"(an engine --kv-events-config endpoint with a concrete host makes the engine connect, so the sidecar needs --kv-events-mode bind)"
	case StreamPartial:
		return "KV events were lost and could not be replayed (is the engine's replay endpoint set and reachable?): matches may be missing " +
			"until the engine's cache turns over"
	default:
		return "the sidecar reports a stream state this kvroute does not know: see the sidecar's logs"
	}
}

// JudgeStream checks the endpoint's sidecar sees its rank's live event
// stream: "live" passes; "silent", "replay_only" and "partial" fail with
// the sidecar's reason as the cause; "unknown" fails once verify's own
// requests were served (the sidecar had its evidence and saw no event); a
// sidecar that does not report the state, or reports its engine down,
// fails.
func JudgeStream(f StreamFacts) Check {
	c := Check{Name: "sidecar stream", Endpoint: f.Endpoint}
	switch {
	case f.DebugURL == "":
		c.Detail = "the sidecar's debug URL is unknown: its stream state cannot be read"
		c.Cause = "the sidecar listens for debug on every interface without a known address: set --admin-advertise (or --gossip-advertise)"
	case f.Err != "":
		c.Detail, c.Cause = f.Err, "the sidecar's debug port is not reachable from here (network policy, --admin-listen on loopback, or the sidecar is down)"
	case !f.Found:
		c.Detail = fmt.Sprintf("the sidecar at %s has no rank %d of this endpoint", f.DebugURL, f.Rank)
		c.Cause = "its advertised debug URL reaches another sidecar (a loopback address?): set --admin-advertise to the pod's address"
	case f.EngineDown:
		c.Detail = "the sidecar reports its engine down: " + f.EngineError
		c.Cause = "the sidecar's health checks or scrapes of the engine fail: the engine is down, hung, or not reachable at the sidecar's --engine-url"
	case !f.Reported:
		c.Detail = "the sidecar does not report stream_state"
		c.Cause = "the sidecar runs a kvroute version without event-stream health: upgrade it to judge its live stream"
	case f.State == StreamLive:
		c.OK, c.Detail = true, "the live KV event stream delivers"
	case f.State == StreamUnknown && !f.Served:
		c.OK, c.Detail = true, "no evidence yet: the engine has served none of verify's requests"
	case f.State == StreamUnknown:
		c.Detail = fmt.Sprintf("the engine served requests but the sidecar saw no event: stream_state still %q after %.1f s", f.State, f.WaitedSecs)
		c.Cause = cmp.Or(f.Reason, "no KV event reaches the sidecar, live or replayed: check the engine's --kv-events-config (enable_kv_cache_events) and the sidecar's "+
			"--kv-events and --kv-events-mode (an endpoint with a concrete host makes the engine connect, so the sidecar needs --kv-events-mode bind)")
	default:
		c.Detail = fmt.Sprintf("the sidecar judges the live KV event stream %q", f.State)
		c.Cause = cmp.Or(f.Reason, streamCause(f.State))
	}
	return c
}
