package decide

import (
	"testing"

	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/inflight"
	"github.com/kvroute/kvroute/picker/predict"
	"github.com/kvroute/kvroute/picker/score"
)

// TestPulls: where the decision computes and where it fetches from. A
// 16,384-token prompt whose first 12,800 tokens sit in endpoint a's CPU
// tier only; a is busy (20 requests waiting), b and c idle and cold. At
// the prior (prefill 10,000 tokens a second, a pull 20 ms + 10 µs a
// token) pulling is far cheaper than recomputing, so an idle endpoint
// pulls from a — unless a rule or the model says otherwise.
func TestPulls(t *testing.T) {
	const prompt, held = 16384, 12800
	all := map[string]bool{"a": true, "b": true, "c": true}
	cpu := func(m map[string]int) [tier.Count]map[string]int { return [tier.Count]map[string]int{nil, m, nil} }
	expensive := DefaultConfig().Predict.Prior
	expensive[9] = 5 // a pull's fixed cost: 5 s
	for _, tc := range []struct {
		name     string
		cfg      func(*Config)
		req      func(*Request)
		snap     func(*Snapshot)
		endpoint string // "" any but a
		source   string
		pulled   int
	}{
		{name: "an idle endpoint pulls from the busy holder", source: "a", pulled: held},
		{name: "pulls off", cfg: func(c *Config) { c.Pulls = false }},
		{name: "the source must run the P2P tier", snap: func(s *Snapshot) { s.Sources = map[string]bool{"b": true, "c": true} }},
		{name: "the destination must run the P2P tier", snap: func(s *Snapshot) { s.Sources = map[string]bool{"a": true} }},
		{name: "a GPU copy is not pullable", snap: func(s *Snapshot) { s.Matched = gpu(map[string]int{"a": held / 16}) }},
		{name: "a pull priced above recomputing is not made", cfg: func(c *Config) { c.Predict.Prior = expensive }},
		{name: "not for a policy other than precise", req: func(r *Request) { r.Policy = score.LeastLoaded }},
		{name: "the holder is never its own source, idle or not", endpoint: "a",
			snap: func(s *Snapshot) { s.Endpoints[0].Load.Waiting = 0 }},
		{name: "a longer CPU prefix elsewhere tops up the local one", endpoint: "b", source: "a", pulled: held - 4096,
			snap: func(s *Snapshot) {
				s.Matched = [tier.Count]map[string]int{{"b": 4096 / 16}, {"a": held / 16, "b": 4096 / 16}, nil}
				s.Endpoints[2].Load.Waiting = 5
			}},
		{name: "the pull stops one block short of the whole prompt", source: "a", pulled: prompt - 16,
			snap: func(s *Snapshot) { s.Matched = cpu(map[string]int{"a": prompt / 16}) }},
		{name: "pulls in flight from a source steer to another", source: "c", pulled: held,
			snap: func(s *Snapshot) {
				s.Matched = cpu(map[string]int{"a": held / 16, "c": held / 16})
				s.Endpoints[2].Load.Waiting = 20
				s.InFlight = map[string]inflight.Pending{"a": {PullsOut: 3}}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			req := Request{Request: score.Request{PromptTokens: prompt, Anchor: 42, HasAnchor: true, TieKey: 7}, BlockSize: 16}
			if tc.req != nil {
				tc.req(&req)
			}
			snap := Snapshot{
				Endpoints: []fleet.Endpoint{ep("a", 20, 8, 0), ep("b", 0, 0, 0), ep("c", 0, 0, 0)},
				Matched:   cpu(map[string]int{"a": held / 16}),
				Sources:   all,
			}
			if tc.snap != nil {
				tc.snap(&snap)
			}
			d := Decide(&cfg, req, snap, now)
			if tc.endpoint != "" && d.Endpoint != tc.endpoint || tc.endpoint == "" && d.Endpoint == "a" {
				t.Fatalf("chose %s, want %q (or not a)", d, tc.endpoint)
			}
			if d.Source != tc.source || d.SourceTokens != tc.pulled || d.Plan.Pulled != tc.pulled {
				t.Fatalf("source %q (%d tokens, plan %+v), want %q (%d)", d.Source, d.SourceTokens, d.Plan, tc.source, tc.pulled)
			}
			if d.Source == d.Endpoint && d.Source != "" {
				t.Fatalf("%s pulls from itself", d.Endpoint)
			}
			if p := d.Plan; p.GPU+p.CPU+p.Pulled+p.Recompute != prompt {
				t.Errorf("plan %+v does not add up to the prompt's %d tokens", p, prompt)
			}
			if tc.source != "" {
				if d.Features.Pulls != 1 || d.Features.Tail != float64(d.Plan.Recompute) || d.Uncached != float64(d.Plan.Recompute) {
					t.Errorf("a pull's features %+v, uncached %v: want one pull and the rest prefilled", d.Features, d.Uncached)
				}
				if d.Predicted.TierLoad <= 0 {
					t.Errorf("the pull is not priced: %+v", d.Predicted)
				}
			}
		})
	}
}

// TestLoadBack prices a prefix held in the endpoint's own CPU tier as a
// load back, cheaper than recomputing it and dearer than a GPU hit.
func TestLoadBack(t *testing.T) {
	cfg := DefaultConfig()
	req := Request{Request: score.Request{PromptTokens: 8192}, BlockSize: 16}
	price := func(m [tier.Count]map[string]int) (predict.Terms, Placement) {
		d := Decide(&cfg, req, Snapshot{Endpoints: []fleet.Endpoint{ep("a", 0, 0, 0)}, Matched: m}, now)
		return d.Predicted, d.Plan
	}
	gpuHit, gp := price(gpu(map[string]int{"a": 400}))
	cpuHit, cp := price([tier.Count]map[string]int{{"a": 100}, {"a": 400}, nil})
	cold, _ := price([tier.Count]map[string]int{})
	if !(gpuHit.Total() < cpuHit.Total() && cpuHit.Total() < cold.Total()) {
		t.Errorf("GPU %v, CPU %v, cold %v: want GPU < CPU < cold", gpuHit.Total(), cpuHit.Total(), cold.Total())
	}
	if gp != (Placement{GPU: 6400, Recompute: 1792}) || cp != (Placement{GPU: 1600, CPU: 4800, Recompute: 1792}) {
		t.Errorf("plans %+v and %+v", gp, cp)
	}
}
