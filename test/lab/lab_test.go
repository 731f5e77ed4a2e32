package lab

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/workload"
)

// convos is a small test scenario: conversations of a few chat turns over
// shared system prompts, each turn carrying the answers before it.
type convos struct {
	n, turns, engines int
}

func (c convos) Name() string          { return "test-convos" }
func (c convos) Fleet() workload.Fleet { return workload.Fleet{Engines: c.engines, GPUBlocks: 1024} }
func (c convos) SLO() time.Duration    { return time.Second }
func (c convos) Plan(o workload.Options) (workload.Plan, error) {
	rng := rand.New(rand.NewPCG(o.Seed, 1))
	systems := []string{workload.Text(rng, 600), workload.Text(rng, 800)}
	var p workload.Plan
	for i := 0; i < c.n; i++ {
		s := &convo{id: i, turns: c.turns, system: systems[i%2], rng: rand.New(rand.NewPCG(o.Seed, uint64(i)+10))}
		p.Sessions = append(p.Sessions, workload.Planned{Start: time.Duration(float64(i) * float64(200*time.Millisecond) / max(o.Rate, 1e-9)), Session: s})
	}
	return p, nil
}

type convo struct {
	id, turns, turn int
	system          string
	msgs            []map[string]any
	rng             *rand.Rand
}

func (c *convo) Next(prev *workload.Answer) (workload.Request, time.Duration, bool) {
	if prev != nil {
		if !prev.OK || c.turn == c.turns {
			return workload.Request{}, 0, true
		}
		c.msgs = append(c.msgs, map[string]any{"role": "assistant", "content": prev.Text})
	} else {
		c.msgs = []map[string]any{{"role": "system", "content": c.system}}
	}
	c.turn++
	c.msgs = append(c.msgs, map[string]any{"role": "user", "content": workload.Text(c.rng, 100+c.rng.IntN(200))})
	body, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "messages": c.msgs, "max_tokens": 16, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})
	wait := time.Duration(0)
	if prev != nil {
		wait = 300 * time.Millisecond
	}
	return workload.Request{Path: "/v1/chat/completions", Body: body, Conversation: c.id, Turn: c.turn}, wait, false
}

func TestRunSmall(t *testing.T) {
	for _, pol := range []score.Policy{score.Precise, score.RoundRobin, score.Dynamo, score.LLMD, score.SGLang, score.LLMDPrecise} {
		t.Run(string(pol), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Policy = pol
			outs, err := Run(cfg, convos{n: 12, turns: 4, engines: 4}, workload.Options{Seed: 1, Rate: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(outs) != 48 {
				t.Fatalf("%d outcomes, want 48", len(outs))
			}
			var prompt, cached int
			for _, o := range outs {
				if !o.OK() {
					t.Fatalf("not OK: %+v", o)
				}
				prompt += o.PromptTokens
				cached += o.CachedTokens
			}
			t.Logf("%s: hit %.3f", pol, float64(cached)/float64(prompt))
		})
	}
}

func TestDeterministic(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Pickers = 2
	a, err := Run(cfg, convos{n: 10, turns: 3, engines: 3}, workload.Options{Seed: 5, Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Run(cfg, convos{n: 10, turns: 3, engines: 3}, workload.Options{Seed: 5, Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two runs of the same inputs differ")
	}
}

// TestSweepBytes: a sweep's results.json is byte-identical run to run,
// whatever the number of workers, and compares against the best peer.
func TestSweepBytes(t *testing.T) {
	s := Sweep{Scenario: convos{n: 8, turns: 3, engines: 3}, Policies: []string{"precise", "dynamo", "sglang"},
		Seeds: []uint64{1, 2, 3}, Rates: []float64{1, 4}, Fleet: DefaultConfig()}
	var out [][]byte
	for _, w := range []int{1, 3} {
		s.Workers = w
		r, err := RunSweep(s)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
		if len(r.Runs) != 18 || len(r.Summary) != 6 || len(r.Goodput) != 3 || len(r.VsBestPeer) != 3*4*2 {
			t.Fatalf("runs %d, summaries %d, goodput %d, ratios %d", len(r.Runs), len(r.Summary), len(r.Goodput), len(r.VsBestPeer))
		}
		t.Log("\n" + Table(r))
	}
	if !bytes.Equal(out[0], out[1]) {
		t.Fatal("results.json differs between two runs of the same inputs")
	}
}

// TestCalibrate: llm-d's recipe on the default engine measures its cold
// prefill of a whole chunk — 25 ms + 8,192 tokens at 10,000 a second, plus
// the picker's render and the two hops — so the peak is ≈ 9,583 tokens a
// second, and τ = peak × 18 s.
func TestCalibrate(t *testing.T) {
	c, err := Calibrate(DefaultConfig(), convos{n: 1, turns: 1, engines: 2})
	if err != nil {
		t.Fatal(err)
	}
	if c.ChunkTokens != 8192 || len(c.TTFTms) != 20 {
		t.Fatalf("%+v", c)
	}
	want := 25 + 819.2 + 10 + 0.6
	for _, x := range c.TTFTms {
		if math.Abs(float64(x)-want) > 0.01 {
			t.Fatalf("probe TTFT %v ms, want %v", x, want)
		}
	}
	if p := float64(c.PeakPrefillThroughput); p != math.Floor(8192/(want/1000)) || float64(c.TauTokens) != p*18 {
		t.Fatalf("peak %v, τ %v", c.PeakPrefillThroughput, c.TauTokens)
	}
}

// TestLabels: llm-d-precise on a Responses scenario is labelled as given
// tokens; llm-d is "(default)" beside llm-d-calibrated.
func TestLabels(t *testing.T) {
	r := &Results{GivenTokens: true, LLMDCalibration: &Calibration{}}
	if got := label(r, "llm-d-precise"); got != "llm-d-precise (given tokens)" {
		t.Error(got)
	}
	if got := label(r, "llm-d"); got != "llm-d (default)" {
		t.Error(got)
	}
	if got := label(&Results{}, "llm-d-precise"); got != "llm-d-precise" {
		t.Error(got)
	}
}
