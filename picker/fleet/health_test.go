package fleet

import (
	"strings"
	"testing"
	"time"
)

func TestHealthAt(t *testing.T) {
	now := time.Unix(1000, 0)
	c := DefaultHealthConfig()
	fresh := func(mut func(*Endpoint)) Endpoint {
		e := Endpoint{URL: "http://a", Since: now.Add(-time.Minute), LastUpdate: now.Add(-100 * time.Millisecond), StreamState: StreamLive}
		if mut != nil {
			mut(&e)
		}
		return e
	}
	for _, tc := range []struct {
		name   string
		e      Endpoint
		want   HealthState
		reason string // a part of the reason
	}{
		{"fresh and live", fresh(nil), Cached, ""},
		{"a sidecar that reports no stream state", fresh(func(e *Endpoint) { e.StreamState = "" }), Cached, ""},
		{"stream state unknown (no evidence yet)", fresh(func(e *Endpoint) { e.StreamState = StreamUnknown }), Cached, ""},
		{"just registered, nothing yet", Endpoint{Since: now.Add(-time.Second)}, Cached, ""},
		{"registered long ago, nothing since", Endpoint{Since: now.Add(-time.Minute)}, Down, "--down-after"},
		{"no time known at all", Endpoint{}, Cached, ""},
		{"stale summary", fresh(func(e *Endpoint) { e.LastUpdate = now.Add(-3 * time.Second) }), LoadOnly, "stale"},
		{"exactly at the stale limit", fresh(func(e *Endpoint) { e.LastUpdate = now.Add(-c.StaleSummary) }), Cached, ""},
		{"past the down limit", fresh(func(e *Endpoint) { e.LastUpdate = now.Add(-11 * time.Second) }), Down, "nothing from the sidecar"},
		{"a report from the future (clock skew)", fresh(func(e *Endpoint) { e.LastUpdate = now.Add(time.Minute) }), Cached, ""},
		{"silent stream", fresh(func(e *Endpoint) { e.StreamState, e.StreamReason = StreamSilent, "use --kv-events-mode bind" }), LoadOnly, "--kv-events-mode bind"},
		{"replay-only stream", fresh(func(e *Endpoint) { e.StreamState = StreamReplayOnly }), LoadOnly, "replay_only"},
		{"partial stream", fresh(func(e *Endpoint) { e.StreamState = StreamPartial }), LoadOnly, "could not replay"},
		{"partial identity", fresh(func(e *Endpoint) { e.Info.Partial = true }), LoadOnly, "could not replay"},
		{"engine down", fresh(func(e *Endpoint) { e.Load.EngineDown, e.Load.EngineError = true, "connection refused" }), Down, "connection refused"},
		{"ejected", fresh(func(e *Endpoint) {
			e.Ejected, e.EjectedUntil, e.EjectReason = true, now.Add(time.Second), "render: timeout"
		}), Down, "render: timeout"},
		{"backoff over, no probe yet", fresh(func(e *Endpoint) { e.Ejected, e.EjectedUntil = true, now }), Down, "probe"},
		{"not ejected", fresh(func(e *Endpoint) { e.EjectedUntil = now.Add(time.Second) }), Cached, ""},
		{"sidecar lost, engine answers", fresh(func(e *Endpoint) { e.SidecarLost, e.EngineAnswers = now.Add(-5*time.Second), true }), LoadOnly, "sidecar is lost"},
		{"sidecar lost, engine silent", fresh(func(e *Endpoint) { e.SidecarLost = now.Add(-5 * time.Second) }), Down, "does not answer"},
		{"draining", fresh(func(e *Endpoint) { e.Load.Draining, e.Load.DrainReason = true, "SIGTERM" }), Draining, "SIGTERM"},
		{"draining with a silent stream", fresh(func(e *Endpoint) {
			e.Load.Draining, e.StreamState = true, StreamSilent
		}), Draining, "drain"},
		{"draining, lost sidecar (until Judge drops it)", fresh(func(e *Endpoint) {
			e.Load.Draining, e.SidecarLost, e.EngineAnswers = true, now, true
		}), Draining, "drain"},
		{"an engine down while draining is down", fresh(func(e *Endpoint) {
			e.Load.Draining, e.Load.EngineDown, e.Load.EngineError = true, true, "connection refused"
		}), Down, "connection refused"},
		{"ejection wins over a lost sidecar", fresh(func(e *Endpoint) {
			e.SidecarLost, e.EngineAnswers, e.Ejected, e.EjectedUntil = now, true, true, now.Add(time.Second)
		}), Down, "ejected"},
	} {
		h := tc.e.HealthAt(now, c)
		if h.State != tc.want || !strings.Contains(h.Reason, tc.reason) {
			t.Errorf("%s: %v %q, want %v with %q", tc.name, h.State, h.Reason, tc.want, tc.reason)
		}
		if (h.State == Cached) != (h.Reason == "") {
			t.Errorf("%s: state %v with reason %q", tc.name, h.State, h.Reason)
		}
		if h.Routable() != (h.State == Cached || h.State == LoadOnly) {
			t.Errorf("%s: routable %v for %v", tc.name, h.Routable(), h.State)
		}
	}
	for _, s := range HealthStates() {
		if s.String() == "unknown" {
			t.Errorf("state %d has no name", s)
		}
	}
}

func TestHealthConfig(t *testing.T) {
	if err := DefaultHealthConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*HealthConfig){
		"zero stale":        func(c *HealthConfig) { c.StaleSummary = 0 },
		"down before stale": func(c *HealthConfig) { c.DownAfter = c.StaleSummary },
		"zero grace":        func(c *HealthConfig) { c.SidecarGrace = 0 },
	} {
		c := DefaultHealthConfig()
		mut(&c)
		if c.Validate() == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if (HealthConfig{}).Validate() == nil {
		t.Error("the zero HealthConfig accepted")
	}
}
