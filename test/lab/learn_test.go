package lab

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/workload"
)

// singles is a test scenario of one-shot chat requests of many lengths,
// half of them after one of two shared system prompts, arriving slowly
// enough that most run alone: what a TTFT model must learn the engine's
// prefill curve from. Every tail fits one chunk of 8,192 tokens, where
// the model's curve has the engine's form exactly (the step base is then
// a constant); past a chunk the steps' bases make a staircase the curve
// can only approximate (docs/benchmarks.md, "Predicted TTFT").
type singles struct{ n int }

func (s singles) Name() string          { return "test-singles" }
func (s singles) Fleet() workload.Fleet { return workload.Fleet{Engines: 4, GPUBlocks: 8192} }
func (s singles) SLO() time.Duration    { return 2 * time.Second }
func (s singles) Plan(o workload.Options) (workload.Plan, error) {
	rng := rand.New(rand.NewPCG(o.Seed, 7))
	systems := []string{workload.Text(rng, 3000), workload.Text(rng, 6000)}
	var p workload.Plan
	at := time.Duration(0)
	for i := 0; i < s.n; i++ {
		msgs := []map[string]any{}
		user := 100 + rng.IntN(7900) // cold: up to a chunk
		if i%2 == 0 {
			msgs = append(msgs, map[string]any{"role": "system", "content": systems[rng.IntN(2)]})
			user = 100 + rng.IntN(2000) // after a long cached context
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": workload.Text(rng, user)})
		body, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "messages": msgs, "max_tokens": 4, "stream": true})
		at += time.Duration(rng.ExpFloat64() * float64(300*time.Millisecond) / max(o.Rate, 1e-9))
		p.Sessions = append(p.Sessions, workload.Planned{Start: at, Session: &single{req: workload.Request{Path: "/v1/chat/completions", Body: body, Conversation: i, Turn: 1}}})
	}
	return p, nil
}

type single struct {
	req  workload.Request
	sent bool
}

func (s *single) Next(prev *workload.Answer) (workload.Request, time.Duration, bool) {
	if s.sent {
		return workload.Request{}, 0, true
	}
	s.sent = true
	return s.req, 0, false
}

// TestLearnsTheProfile: in a lab run on sim-default, the TTFT model
// precise learns from its own requests reaches the profile's per-token
// prefill cost within 10% (and no attention cost, which the profile has
// none of), and predicts the steady state within 15% (median). On
// gptoss120b-h200 the same run learns no attention term and a per-token
// cost 17% high (docs/benchmarks.md, "Predicted TTFT": the quadratic's
// 14 ms at 8,000 tokens drowns in the step-alignment jitter).
// The learned values are the picker's own: nothing reads the profile but
// this test.
func TestLearnsTheProfile(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy, cfg.Profile = score.Precise, profile.SimDefault
	outs, models, err := RunLearned(cfg, singles{n: 600}, workload.Options{Seed: 3, Rate: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	if len(models) != 1 {
		t.Fatalf("%d models learned, want 1", len(models))
	}
	prof, _ := profile.Named(profile.SimDefault)
	wantTail := 1 / prof.PrefillTokensPerSecond * 1e3 // s per 1,000 tokens
	wantAttn := 2 * prof.PrefillQuadratic * 1e6       // s per 1,000² tokens
	for _, m := range models {
		tail, attn := m.Coefficients["tail_s_per_ktok"], m.Coefficients["attention_s_per_mtok2"]
		t.Logf("learned from %d requests: %v; the profile: tail %.4g s/ktok, attention %.4g s/Mtok²", m.Observations, m.Coefficients, wantTail, wantAttn)
		if math.Abs(tail-wantTail) > 0.1*wantTail {
			t.Errorf("tail %.4g s/ktok, want %.4g within 10%%", tail, wantTail)
		}
		if math.Abs(attn-wantAttn) > 0.1*wantAttn {
			t.Errorf("attention %.4g s/Mtok², want %.4g within 10%%", attn, wantAttn)
		}
	}
	if e := predictionError(outs); !(e <= 0.15) {
		t.Errorf("steady median prediction error %.3f, want ≤ 0.15", e)
	}
}

// TestRelearnsAChangedEngine: a third of the way into a lab run one of
// four engines becomes twice as slow (its node replaced under the same
// address). From the requests alone, the first picker's model learns it
// again: by the last third of the run its predictions there are within
// 15% (median) again, its speed factor has risen above 1.3 (the rest of
// the slowdown is explained by the longer queue the slow engine keeps),
// and the other engines' factors stay near 1.
func TestRelearnsAChangedEngine(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = score.Precise
	slow := profile.Default()
	slow.StepBase *= 2
	slow.PrefillTokensPerSecond /= 2
	slow.DecodePerSeq *= 2
	var changed string
	watch := func(r *run) {
		r.sim.at(60*time.Second, func() {
			changed = r.engines[0].url
			if err := r.engines[0].core.SetLatency(slow); err != nil {
				t.Error(err)
			}
		})
	}
	outs, models, err := runWith(cfg, singles{n: 600}, workload.Options{Seed: 5, Rate: 1}, watch)
	if err != nil {
		t.Fatal(err)
	}
	var last []Outcome
	for _, o := range outs {
		if o.Endpoint == changed && o.Start > 120*time.Second {
			last = append(last, o)
		}
	}
	if e := predictionError(last); len(last) < 20 || !(e <= 0.15) {
		t.Errorf("the slowed engine's last %d predictions: median error %.3f, want ≤ 0.15 from at least 20", len(last), e)
	}
	for _, m := range models {
		for url, e := range m.Endpoints {
			t.Logf("%s: speed %.2f from %d requests", url, e.Speed, e.Observations)
			switch {
			case url == changed && !(e.Speed > 1.3):
				t.Errorf("the slowed engine %s: speed factor %.2f, want above 1.3", url, e.Speed)
			case url != changed && !(e.Speed > 0.75 && e.Speed < 1.33):
				t.Errorf("engine %s: speed factor %.2f, want ≈1", url, e.Speed)
			}
		}
	}
}
