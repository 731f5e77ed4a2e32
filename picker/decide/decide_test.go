package decide

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/inflight"
	"github.com/kvroute/kvroute/picker/predict"
	"github.com/kvroute/kvroute/picker/score"
)

var now = time.Unix(1_000_000, 0)

// ep is an endpoint with a load report that arrived ago before now
// (negative: none yet).
func ep(url string, waiting, running float64, ago time.Duration) fleet.Endpoint {
	e := fleet.Endpoint{URL: url, Group: "g", Info: fleet.Identity{Endpoint: url, Model: "m", BlockSize: 16}}
	if ago >= 0 {
		e.Load, e.LoadAt, e.LastUpdate = fleet.Load{Waiting: waiting, Running: running}, now.Add(-ago), now.Add(-ago)
	}
	return e
}

func withStream(e fleet.Endpoint, state string) fleet.Endpoint {
	e.StreamState, e.StreamReason = state, "test"
	return e
}

func engineDown(e fleet.Endpoint) fleet.Endpoint {
	e.Load.EngineDown, e.Load.EngineError = true, "connection refused"
	return e
}

func draining(e fleet.Endpoint) fleet.Endpoint {
	e.Load.Draining, e.Load.DrainReason = true, "SIGTERM"
	return e
}

func ejected(e fleet.Endpoint) fleet.Endpoint {
	e.Ejected, e.EjectedUntil, e.EjectReason = true, now.Add(time.Second), "connection refused"
	return e
}

func gpu(m map[string]int) [tier.Count]map[string]int { return [tier.Count]map[string]int{m, nil, nil} }

// anchored is a 1,024-token request with an anchor.
func anchored() Request {
	return Request{Request: score.Request{PromptTokens: 1024, Anchor: 42, HasAnchor: true, TieKey: 7}, BlockSize: 16}
}

func TestDecide(t *testing.T) {
	def := DefaultConfig()
	fresh := time.Second
	for _, tc := range []struct {
		name   string
		cfg    func(*Config)
		req    func(*Request)
		snap   Snapshot
		want   string // "" none
		reason score.Reason
		check  func(t *testing.T, d Decision)
	}{
		{name: "the longest GPU prefix wins",
			snap: Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 1, fresh), ep("b", 0, 1, fresh)}, Matched: gpu(map[string]int{"a": 10, "b": 40})},
			want: "b", reason: score.ReasonCacheHit,
			check: func(t *testing.T, d Decision) {
				if d.MatchedTokens != 640 || d.MatchedBlocks != 40 || d.Cached != 640 || d.Uncached != 1024-640 || d.AnotherHeldMore {
					t.Errorf("figures: %+v", d)
				}
			}},
		{name: "blocks become tokens at the group's block size",
			req:  func(r *Request) { r.BlockSize = 32 },
			snap: Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, fresh)}, Matched: gpu(map[string]int{"a": 8})},
			want: "a", reason: score.ReasonCacheHit,
			check: func(t *testing.T, d Decision) {
				if d.MatchedTokens != 256 || d.MatchedBlocks != 8 {
					t.Errorf("figures: %+v", d)
				}
			}},
		{name: "a stale load report makes an endpoint unroutable",
			snap: Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, 11*time.Second), ep("b", 0, 0, fresh)}, Matched: gpu(map[string]int{"a": 60})},
			want: "b", reason: score.ReasonColdAnchor,
			check: func(t *testing.T, d Decision) {
				if d.AnotherHeldMore {
					t.Error("an unroutable endpoint counted as holding more")
				}
			}},
		{name: "no load report yet is routable",
			snap: Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, -1)}, Matched: gpu(map[string]int{"a": 10})},
			want: "a", reason: score.ReasonCacheHit},
		{name: "the stale limit is configurable",
			cfg:  func(c *Config) { c.Health.StaleSummary, c.Health.DownAfter = 30*time.Second, time.Minute },
			snap: Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, 11*time.Second), ep("b", 0, 0, fresh)}, Matched: gpu(map[string]int{"a": 60})},
			want: "a", reason: score.ReasonCacheHit},
		{name: "an excluded endpoint is neither chosen nor counted as holding more",
			req:  func(r *Request) { r.Exclude = map[string]bool{"b": true} },
			snap: Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, fresh), ep("b", 0, 0, fresh)}, Matched: gpu(map[string]int{"a": 10, "b": 40})},
			want: "a", reason: score.ReasonCacheHit,
			check: func(t *testing.T, d Decision) {
				if d.AnotherHeldMore {
					t.Error("an excluded endpoint counted as holding more")
				}
			}},
		{name: "a load-only endpoint gets no cache credit and no prediction",
			snap: Snapshot{Endpoints: []fleet.Endpoint{
				withStream(ep("a", 0, 0, fresh), fleet.StreamSilent), ep("b", 0, 0, fresh)}, Matched: gpu(map[string]int{"a": 60})},
			reason: score.ReasonColdAnchor, // a's 60 blocks are not credited: the prefix is cold
			check: func(t *testing.T, d Decision) {
				if d.MatchedTokens != 0 || d.Cached != 0 || d.AnotherHeldMore || d.LoadOnly != (d.Endpoint == "a") {
					t.Errorf("%+v", d)
				}
			}},
		{name: "chosen while load only: nothing predicted, and said so",
			snap: Snapshot{Endpoints: []fleet.Endpoint{withStream(ep("a", 0, 0, fresh), fleet.StreamReplayOnly)}, Matched: gpu(map[string]int{"a": 60})},
			want: "a",
			check: func(t *testing.T, d Decision) {
				if !d.LoadOnly || d.MatchedTokens != 0 || d.Cached != 0 {
					t.Errorf("%+v", d)
				}
			}},
		{name: "an engine its sidecar reports down is not chosen",
			snap: Snapshot{Endpoints: []fleet.Endpoint{engineDown(ep("a", 0, 0, fresh)), ep("b", 5, 5, fresh)}, Matched: gpu(map[string]int{"a": 60})},
			want: "b"},
		{name: "an ejected endpoint is not chosen",
			snap: Snapshot{Endpoints: []fleet.Endpoint{ejected(ep("a", 0, 0, fresh)), ep("b", 5, 5, fresh)}, Matched: gpu(map[string]int{"a": 60})},
			want: "b"},
		{name: "a draining endpoint is not chosen, however much it holds",
			snap: Snapshot{Endpoints: []fleet.Endpoint{draining(ep("a", 0, 0, fresh)), ep("b", 5, 5, fresh)}, Matched: gpu(map[string]int{"a": 60})},
			want: "b"},
		{name: "only draining endpoints: none",
			snap: Snapshot{Endpoints: []fleet.Endpoint{draining(ep("a", 0, 0, fresh))}, Matched: gpu(map[string]int{"a": 60})},
			want: "", reason: score.ReasonNoneHealthy},
		{name: "nothing routable",
			snap: Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, time.Minute)}},
			want: "", reason: score.ReasonNoneHealthy},
		{name: "no endpoints",
			snap: Snapshot{},
			want: "", reason: score.ReasonNoneHealthy},
		{name: "picks in flight count as load: the bounded-load cap moves the request",
			cfg: func(c *Config) { c.Score.MinCap, c.Score.Epsilon = 1, 0.25 },
			snap: Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, fresh), ep("b", 0, 0, fresh)}, Matched: gpu(map[string]int{"a": 40}),
				InFlight: map[string]inflight.Pending{"a": {Count: 3, Tokens: 500}}},
			want: "b",
			check: func(t *testing.T, d Decision) {
				if d.Override == nil || d.Override.TokensLost != 640 || !d.AnotherHeldMore {
					t.Errorf("override: %+v", d)
				}
			}},
		{name: "a policy for this request overrides the configured one",
			req:    func(r *Request) { r.Policy = score.PrefixHash },
			snap:   Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, fresh), ep("b", 0, 0, fresh)}},
			reason: score.ReasonPrefixHash,
			check: func(t *testing.T, d Decision) {
				if d.Policy != score.PrefixHash || !d.OK() {
					t.Errorf("policy: %+v", d)
				}
			}},
		{name: "load only: no cache credit",
			req:    func(r *Request) { r.LoadOnly = true },
			snap:   Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, fresh), ep("b", 0, 0, fresh)}},
			reason: score.ReasonLoadOnly,
			check: func(t *testing.T, d Decision) {
				if d.Cached != 0 || d.MatchedTokens != 0 {
					t.Errorf("%+v", d)
				}
			}},
		{name: "unknown block size matches nothing",
			req:  func(r *Request) { r.BlockSize = 0 },
			snap: Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, fresh)}, Matched: gpu(map[string]int{"a": 40})},
			want: "a",
			check: func(t *testing.T, d Decision) {
				if d.MatchedTokens != 0 || d.MatchedBlocks != 0 {
					t.Errorf("%+v", d)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := def
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			req := anchored()
			if tc.req != nil {
				tc.req(&req)
			}
			d := Decide(&cfg, req, tc.snap, now)
			if tc.want != "" || !tc.snap.hasRoutable(&cfg) {
				if d.Endpoint != tc.want {
					t.Fatalf("chose %v, want %q", d, tc.want)
				}
			}
			if tc.reason != "" && d.Reason != tc.reason {
				t.Errorf("reason %s, want %s", d.Reason, tc.reason)
			}
			if len(d.Explain) != len(tc.snap.Endpoints) {
				t.Errorf("%d explained, %d endpoints", len(d.Explain), len(tc.snap.Endpoints))
			}
			if tc.check != nil {
				tc.check(t, d)
			}
		})
	}
}

func (s Snapshot) hasRoutable(cfg *Config) bool {
	for i := range s.Endpoints {
		if s.Endpoints[i].HealthAt(now, cfg.Health).Routable() {
			return true
		}
	}
	return false
}

// TestDecideIsDeterministic: the same snapshot gives the same decision, in
// any endpoint order — two replicas agree without talking.
func TestDecideIsDeterministic(t *testing.T) {
	cfg := DefaultConfig()
	eps := []fleet.Endpoint{ep("a", 1, 2, time.Second), ep("b", 0, 3, time.Second), ep("c", 2, 0, time.Second), ep("d", 0, 0, -1)}
	rev := []fleet.Endpoint{eps[3], eps[2], eps[1], eps[0]}
	for anchor := uint64(0); anchor < 200; anchor++ {
		req := Request{Request: score.Request{PromptTokens: 512, Anchor: anchor, HasAnchor: true}, BlockSize: 16}
		a := Decide(&cfg, req, Snapshot{Endpoints: eps}, now)
		b := Decide(&cfg, req, Snapshot{Endpoints: rev}, now)
		if a.Endpoint != b.Endpoint || a.Reason != b.Reason {
			t.Fatalf("anchor %d: %v vs %v", anchor, a, b)
		}
	}
}

func TestCandidates(t *testing.T) {
	cfg := DefaultConfig()
	snap := Snapshot{
		Endpoints: []fleet.Endpoint{ep("a", 2, 3, time.Second), ep("b", 0, 0, -1), ep("c", 0, 0, time.Hour)},
		Matched:   [tier.Count]map[string]int{{"a": 4}, {"a": 6, "b": 2}, {"b": 1}},
		InFlight:  map[string]inflight.Pending{"b": {Count: 2, Tokens: 300}},
	}
	req := anchored()
	req.Exclude = map[string]bool{"a": true}
	cs := Candidates(&cfg, req, snap, now)
	// At the prior (50 ms, 10,000 tokens a second for the tail and the
	// work ahead, 1 ms a running decode), nothing learned: a's 2 waiting
	// requests are priced as long as this one. The 32 tokens a and b
	// hold on CPU beyond their GPU prefix load back at the prior's 10 µs
	// a token.
	want := []score.Candidate{
		{ID: "a", Healthy: false, Matched: [tier.Count]int{64, 96, 0}, Waiting: 2, Running: 3, Ahead: 2048, Predicted: 0.05 + 0.0928 + 0.2048 + 0.003 + 0.00032},
		{ID: "b", Healthy: true, Matched: [tier.Count]int{0, 32, 16}, Sent: 2, SentTokens: 300, Ahead: 300, Predicted: 0.05 + 0.0992 + 0.03 + 0.002 + 0.00032},
		{ID: "c", Healthy: false, Predicted: 0.05 + 0.1024},
	}
	if len(cs) != len(want) {
		t.Fatalf("%d candidates", len(cs))
	}
	for i := range want {
		got := cs[i]
		if math.Abs(got.Predicted-want[i].Predicted) > 1e-9 {
			t.Errorf("candidate %d: predicted %v, want %v", i, got.Predicted, want[i].Predicted)
		}
		got.Predicted = want[i].Predicted
		if got != want[i] {
			t.Errorf("candidate %d: %+v, want %+v", i, got, want[i])
		}
	}
}

// TestPredictions: the snapshot's model prices each candidate — the queue
// (this picker's carried prefill, the engine's other waiting requests at
// the learned mean), the tail past the longest match, the running decodes
// and the endpoint's speed — and the decision goes to the fastest.
func TestPredictions(t *testing.T) {
	cfg := DefaultConfig()
	fresh := time.Second
	coef := predict.Coefficients{0.01, 0.1, 0, 0.1, 0.002, 0}
	base := func() Snapshot {
		return Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, fresh), ep("b", 0, 0, fresh)}, Model: &coef, MeanTokens: 500}
	}
	for _, tc := range []struct {
		name   string
		mod    func(*Snapshot)
		want   string
		wantS  float64 // the chosen one's predicted seconds
		reason score.Reason
	}{
		{"a cached prefix shortens the tail", func(s *Snapshot) { s.Matched = gpu(map[string]int{"b": 48}) }, "b", 0.01 + 0.1*0.256, score.ReasonCacheHit},
		{"this picker's carried prefill is waited for", func(s *Snapshot) {
			s.Matched = gpu(map[string]int{"b": 48})
			s.InFlight = map[string]inflight.Pending{"b": {AwaitCount: 1, AwaitTokens: 8000}}
		}, "a", 0.01 + 0.1*1.024, score.ReasonColdAnchor},
		{"the engine's other waiting requests, at the learned mean", func(s *Snapshot) {
			s.Endpoints[1] = ep("b", 4, 0, fresh)
			s.Matched = gpu(map[string]int{"b": 48})
		}, "a", 0.01 + 0.1*1.024, score.ReasonColdAnchor},
		{"an endpoint's own mean replaces the group's", func(s *Snapshot) {
			s.Endpoints[1] = ep("b", 4, 0, fresh)
			s.Matched = gpu(map[string]int{"b": 48})
			s.Learned = map[string]predict.Endpoint{"b": {Speed: 1, MeanTokens: 100}}
		}, "b", 0.01 + 0.1*0.256 + 0.1*0.4, score.ReasonCacheHit},
		{"running decodes slow the step", func(s *Snapshot) {
			s.Endpoints[1] = ep("b", 0, 200, fresh)
			s.Matched = gpu(map[string]int{"b": 48})
		}, "a", 0.01 + 0.1*1.024, score.ReasonColdAnchor},
		{"a slow engine's speed factor", func(s *Snapshot) {
			s.Matched = gpu(map[string]int{"b": 48})
			s.Learned = map[string]predict.Endpoint{"b": {Speed: 5}}
		}, "a", 0.01 + 0.1*1.024, score.ReasonColdAnchor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			tc.mod(&s)
			d := Decide(&cfg, anchored(), s, now)
			if d.Endpoint != tc.want || d.Reason != tc.reason || math.Abs(d.Predicted.Total()-tc.wantS) > 1e-9 {
				t.Fatalf("chose %s (%s) predicted %+v (%.4f s), want %s (%s) at %.4f s", d.Endpoint, d.Reason, d.Predicted, d.Predicted.Total(), tc.want, tc.reason, tc.wantS)
			}
			if d.Features.Tail+d.Features.Context != 1024 {
				t.Errorf("features %+v do not add up to the prompt", d.Features)
			}
		})
	}
}

func TestRenderOrder(t *testing.T) {
	cfg := DefaultConfig()
	eps := []fleet.Endpoint{ep("d", 1, 1, time.Second), ep("a", 0, 5, time.Second), ep("c", 0, 0, -1), ep("b", 1, 1, time.Second),
		ep("stale", 0, 0, time.Hour), draining(ep("draining", 0, 0, time.Second))}
	got := RenderOrder(&cfg, eps, now)
	want := []string{"c", "b", "d", "a"}
	if len(got) != len(want) {
		t.Fatalf("%v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%v, want %v", got, want)
		}
	}
	if got := RenderOrder(&cfg, nil, now); len(got) != 0 {
		t.Fatalf("%v", got)
	}
}

func TestConfig(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Health.StaleSummary = 0
	if c.Validate() == nil {
		t.Error("zero stale-summary accepted")
	}
	c = DefaultConfig()
	c.Score.Epsilon = -1
	if c.Validate() == nil {
		t.Error("a bad score config accepted")
	}
	var zero Config
	if zero.Validate() == nil {
		t.Error("the zero Config accepted")
	}
}

// TestSaturated: shedding needs every routable, not excluded endpoint at
// the threshold, counting queued requests and picks in flight; no
// routable endpoint is not overload; 0 never sheds.
func TestSaturated(t *testing.T) {
	cfg := DefaultConfig()
	fresh := time.Second
	snap := Snapshot{Endpoints: []fleet.Endpoint{ep("a", 2, 4, fresh), ep("b", 1, 4, fresh), ep("c", 9, 0, time.Minute)},
		InFlight: map[string]inflight.Pending{"b": {Count: 1}}}
	for _, tc := range []struct {
		name    string
		exclude map[string]bool
		waiting float64
		want    bool
	}{
		{name: "every routable endpoint at the threshold (b by its pick in flight)", waiting: 2, want: true},
		{name: "one under it", waiting: 3, want: false},
		{name: "off", waiting: 0, want: false},
		{name: "an excluded endpoint under it does not count", exclude: map[string]bool{"b": true}, waiting: 2, want: true},
		{name: "nothing routable is not overload", exclude: map[string]bool{"a": true, "b": true}, waiting: 1, want: false},
	} {
		req := anchored()
		req.Exclude = tc.exclude
		if got := Saturated(&cfg, req, snap, now, tc.waiting); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPeerBookingsCounted: another picker's pick, applied to this
// picker's bookings, is priced on its endpoint as this picker's own would
// be; when the pick's add was lost, the endpoint's next load report
// (which counts the request waiting) prices the same queue, so a lost
// add hides a request only until that report.
func TestPeerBookingsCounted(t *testing.T) {
	cfg := DefaultConfig()
	req := anchored()
	picked := now.Add(-50 * time.Millisecond)
	price := func(delivered, reported bool) float64 {
		t.Helper()
		a, _ := inflight.NewBookings(inflight.DefaultConfig())
		b, _ := inflight.NewBookings(inflight.DefaultConfig())
		a.Journal(true)
		a.Book("e", 2000, true, picked)
		ops, _ := a.TakeJournal(picked)
		if delivered {
			b.Apply("a", ops, picked.Add(time.Millisecond))
		}
		e := ep("e", 0, 0, 200*time.Millisecond) // a report from before the pick: it does not count it
		if reported {
			e = ep("e", 1, 0, 10*time.Millisecond) // the next one: the request waits there
		}
		snap := Snapshot{Endpoints: []fleet.Endpoint{e}, InFlight: map[string]inflight.Pending{"e": b.Pending("e", e.LoadAt, now)}, MeanTokens: 2000}
		return Candidates(&cfg, req, snap, now)[0].Predicted
	}
	alone, held := price(false, false), price(true, false)
	if !(held > alone) {
		t.Fatalf("the other picker's pick did not raise the prediction: %v alone, %v with it", alone, held)
	}
	if lost, got := price(false, true), price(true, true); math.Abs(lost-got) > 1e-9 || !(lost > alone) {
		t.Fatalf("after the report: add lost %v, delivered %v (before it, alone %v)", lost, got, alone)
	}
}
