package predict

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/picker/fleet"
)

func near(a, b, rel float64) bool { return math.Abs(a-b) <= rel*math.Abs(b)+1e-12 }

// TestTerms prices each term alone on known coefficients: the queue, the
// tail's curve, the tier load and the decode slowdown.
func TestTerms(t *testing.T) {
	c := Coefficients{0.01, 0.1, 0.002, 0.05, 0.001, 0.0005, 0, 0, 0.004, 0.03, 0.006}
	for _, tc := range []struct {
		name  string
		f     Features
		speed float64
		want  Terms
	}{
		{"idle, nothing to prefill", Features{}, 1, Terms{Overhead: 0.01}},
		{"cold tail of 2,000 tokens", Features{Tail: 2000}, 1, Terms{Overhead: 0.01, Prefill: 0.1*2 + 0.002*2*1}},
		{"tail after 8,000 cached: attention over the context", Features{Tail: 1000, Context: 8000}, 1, Terms{Overhead: 0.01, Prefill: 0.1 + 0.002*1*8.5}},
		{"queue of 4,000 tokens ahead", Features{Ahead: 4000}, 1, Terms{Overhead: 0.01, Wait: 0.2}},
		{"2,000 tokens loaded back from CPU", Features{Loaded: 2000}, 1, Terms{Overhead: 0.01, TierLoad: 0.008}},
		{"a pull of 4,000 tokens, alone on its link", Features{Pulls: 1, Pulled: 4000}, 1, Terms{Overhead: 0.01, TierLoad: 0.03 + 0.024}},
		{"a pull sharing its link with one other", Features{Pulls: 1, Pulled: 2 * 4000}, 1, Terms{Overhead: 0.01, TierLoad: 0.03 + 0.048}},
		{"decodes slow each step", Features{Running: 10, Tail: 2000}, 1, Terms{Overhead: 0.01, Prefill: 0.2 + 0.004, Decode: 0.01 + 0.0005*10*2}},
		{"a slower engine scales all but the copies and pulls", Features{Tail: 1000, Ahead: 1000, Pulls: 1, Pulled: 1000}, 2,
			Terms{Overhead: 0.02, Prefill: 2 * (0.1 + 0.001), Wait: 0.1, TierLoad: 0.036}},
		{"negative inputs count as none", Features{Tail: -5, Ahead: -1, Running: -3, Loaded: -1, Pulls: -1, Pulled: -1}, 1, Terms{Overhead: 0.01}},
		{"pulls count once", Features{Pulls: 3}, 1, Terms{Overhead: 0.01, TierLoad: 0.03}},
	} {
		got := c.Terms(tc.f, tc.speed)
		for _, p := range [][2]float64{{got.Overhead, tc.want.Overhead}, {got.Prefill, tc.want.Prefill}, {got.Wait, tc.want.Wait},
			{got.TierLoad, tc.want.TierLoad}, {got.Decode, tc.want.Decode}} {
			if !near(p[0], p[1], 1e-9) {
				t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
				break
			}
		}
	}
}

// engineTTFT is a synthetic engine: a chunked prefill priced as the
// simulated engine's profiles price it (base a per chunk of 8,192, b per
// token, c per token² of attention), behind work ahead at b a token, with
// d per running decode per step.
type engineTTFT struct{ a, b, c, d float64 }

func (e engineTTFT) ttft(f Features) float64 {
	chunks := math.Ceil(max(f.Tail, 1) / 8192)
	return chunks*(e.a+e.d*f.Running) + e.b*f.Tail + 2*e.c*f.Tail*(f.Context+f.Tail/2) + e.b*f.Ahead
}

func randomFeatures(rng *rand.Rand) Features {
	return Features{Tail: float64(rng.IntN(16000) + 16), Context: float64(rng.IntN(4) * rng.IntN(8000)),
		Ahead: float64(rng.IntN(3) * rng.IntN(20000)), Running: float64(rng.IntN(32))}
}

// TestConvergesToTheEngine learns gpt-oss-120b on one H200's published fit
// (19.14 µs a token, 0.226 ns a token² of attention, 29.8 ms a chunk of
// 8,192) from 3,000 requests with 5% noise: the per-token slope (the
// chunks' base included) and the attention slope within 10%, the steady
// median error within 15%.
func TestConvergesToTheEngine(t *testing.T) {
	eng := engineTTFT{a: 0.0298, b: 19.14e-6, c: 0.226e-9, d: 0.0001}
	m, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		f := randomFeatures(rng)
		m.Observe("e1", f, eng.ttft(f)*(1+0.05*rng.NormFloat64()))
	}
	th := m.Coefficients()
	// A chunk of 8,192 tokens costs a step's base too: per token, that is
	// part of the tail's slope.
	if want := eng.b*1e3 + eng.a/8.192; !near(th[fTail], want, 0.10) {
		t.Errorf("tail slope %.4g s/ktok, want %.4g within 10%%", th[fTail], want)
	}
	if !near(th[fAttention], 2*eng.c*1e6, 0.10) {
		t.Errorf("attention %.4g s/Mtok², want %.4g within 10%%", th[fAttention], 2*eng.c*1e6)
	}
	if !near(th[fAhead], eng.b*1e3, 0.10) {
		t.Errorf("work ahead %.4g s/ktok, want %.4g within 10%%", th[fAhead], eng.b*1e3)
	}
	if me := m.MedianError(); !(me <= 0.15) {
		t.Errorf("median relative error %.3f, want ≤ 0.15", me)
	}
}

// TestRelearnsAReplacedEngine: one of four engines is replaced by one
// twice as slow; its speed factor follows within 100 of its requests,
// and the others' stay near 1.
func TestRelearnsAReplacedEngine(t *testing.T) {
	eng := engineTTFT{a: 0.025, b: 1e-4, d: 0.0001}
	m, _ := New(DefaultConfig())
	rng := rand.New(rand.NewPCG(3, 4))
	urls := []string{"a", "b", "c", "d"}
	for range 2000 {
		f := randomFeatures(rng)
		m.Observe(urls[rng.IntN(4)], f, eng.ttft(f))
	}
	for range 100 {
		f := randomFeatures(rng)
		m.Observe("d", f, 2*eng.ttft(f))
		for _, u := range urls[:3] {
			f := randomFeatures(rng)
			m.Observe(u, f, eng.ttft(f))
		}
	}
	if s := m.Speed("d"); !(s > 1.6 && s < 2.4) {
		t.Errorf("replaced engine's speed factor %.2f, want ≈2", s)
	}
	for _, u := range urls[:3] {
		if s := m.Speed(u); !(s > 0.75 && s < 1.3) {
			t.Errorf("engine %s's speed factor %.2f, want ≈1", u, s)
		}
	}
	f := Features{Tail: 4000}
	if r := m.Predict("d", f).Total() / m.Predict("a", f).Total(); !(r > 1.6 && r < 2.6) {
		t.Errorf("predicted slowdown of the replaced engine %.2f, want ≈2", r)
	}
}

// TestOutliersDoNotMoveTheFit: one request in twenty stalls for 30 s (a
// client that reads slowly, a retry); the slope stays within 10%.
func TestOutliersDoNotMoveTheFit(t *testing.T) {
	eng := engineTTFT{a: 0.025, b: 1e-4}
	m, _ := New(DefaultConfig())
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 3000 {
		f := randomFeatures(rng)
		y := eng.ttft(f)
		if i%20 == 0 {
			y = 30
		}
		m.Observe("e", f, y)
	}
	if th := m.Coefficients(); !near(th[fTail], 0.1, 0.10) {
		t.Errorf("tail slope %.4g with outliers, want 0.1 within 10%%", th[fTail])
	}
}

// TestPriorIsConservative: before any observation the model prices a
// token of prefill at 10,000 a second and a queued one alike, so a cached
// prefix and a queue both weigh.
func TestPriorIsConservative(t *testing.T) {
	m, _ := New(DefaultConfig())
	cold := m.Predict("x", Features{Tail: 8000}).Total()
	warm := m.Predict("x", Features{Tail: 500, Context: 7500}).Total()
	queued := m.Predict("x", Features{Tail: 500, Context: 7500, Ahead: 20000}).Total()
	if !(warm < cold && cold < queued) {
		t.Errorf("prior: warm %.3f, cold %.3f, warm behind a queue %.3f: want warm < cold < queued", warm, cold, queued)
	}
	if !math.IsNaN(m.MedianError()) || m.Observations() != 0 {
		t.Error("a fresh model has no error and no observations")
	}
}

// TestIgnoresBadObservations: zero, negative and infinite observations
// teach nothing.
func TestIgnoresBadObservations(t *testing.T) {
	m, _ := New(DefaultConfig())
	before := m.Coefficients()
	for _, y := range []float64{0, -1, math.Inf(1), math.NaN()} {
		m.Observe("e", Features{Tail: 1000}, y)
	}
	if m.Coefficients() != before || m.Observations() != 0 {
		t.Error("bad observations moved the model")
	}
}

// TestReport reads the engine's counters' growth: the mean uncached prompt
// per request and the histograms' means; a restart (counters down) starts
// over without a bogus interval.
func TestReport(t *testing.T) {
	m, _ := New(DefaultConfig())
	m.Report("e", fleet.EngineStats{}) // an engine that exports nothing
	if got := m.Endpoint("e"); got.MeanTokens != 0 || got.Speed != 1 {
		t.Fatalf("no stats: %+v", got)
	}
	s := fleet.EngineStats{Have: true, TTFTCount: 10, TTFTSeconds: 5, QueueCount: 10, QueueSeconds: 1, PrefillCount: 10, PrefillSeconds: 3,
		PromptTokens: 50000, CachedTokens: 10000}
	m.Report("e", s) // the first: nothing to compare with
	if got := m.Endpoint("e"); got.MeanTokens != 0 {
		t.Fatalf("first report learned %+v", got)
	}
	s.TTFTCount, s.TTFTSeconds, s.QueueCount, s.QueueSeconds, s.PrefillCount, s.PrefillSeconds = 14, 7, 14, 1.4, 14, 4.2
	s.PromptTokens, s.CachedTokens = 62000, 14000 // 4 requests: 12,000 prompt, 4,000 cached
	m.Report("e", s)
	st := m.State().Endpoints["e"]
	if !near(st.MeanUncachedTokens, 2000, 1e-9) || !near(st.MeanTTFTSeconds, 0.5, 1e-9) || !near(st.MeanQueueSeconds, 0.1, 1e-9) || !near(st.MeanPrefillSeconds, 0.3, 1e-9) {
		t.Fatalf("after an interval: %+v", st)
	}
	if got := m.Endpoint("e").MeanTokens; got != 2000 {
		t.Fatalf("decision's mean tokens %v, want 2000", got)
	}
	restarted := fleet.EngineStats{Have: true, TTFTCount: 1, TTFTSeconds: 0.2, PromptTokens: 100}
	m.Report("e", restarted)
	if st := m.State().Endpoints["e"]; st.MeanUncachedTokens != 2000 {
		t.Fatalf("a restart moved the mean: %+v", st)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"negative prior", func(c *Config) { c.Prior[fTail] = -1 }},
		{"zero spread", func(c *Config) { c.PriorSpread[fAhead] = 0 }},
		{"forget above 1", func(c *Config) { c.Forget = 1.5 }},
		{"forget 0", func(c *Config) { c.Forget = 0 }},
		{"outlier clip below 1", func(c *Config) { c.OutlierSigmas = 0.5 }},
		{"speed gain 0", func(c *Config) { c.SpeedGain = 0 }},
		{"min speed above 1", func(c *Config) { c.MinSpeed = 2 }},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		if c.Validate() == nil {
			t.Errorf("%s: valid", tc.name)
		}
		if _, err := New(c); err == nil {
			t.Errorf("%s: New accepted it", tc.name)
		}
	}
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func FuzzObserve(f *testing.F) {
	f.Add(1000.0, 0.0, 0.0, 0.0, 0.5)
	f.Fuzz(func(t *testing.T, tail, ctx, ahead, running, y float64) {
		m, _ := New(DefaultConfig())
		ft := Features{Tail: tail, Context: ctx, Ahead: ahead, Running: running}
		for range 3 {
			m.Observe("e", ft, y)
		}
		for i, v := range m.Coefficients() {
			if math.IsNaN(v) || v < 0 {
				t.Fatalf("coefficient %s = %v", TermName(i), v)
			}
		}
	})
}

// TestLearnsCopyAndPullCosts: an engine behind a link where a pull costs
// a fixed 28 ms plus 10.6 µs a token (gpt-oss-120b over RDMA, the P2P
// report's fit) and a load back from its CPU tier 0.8 µs a token; a
// third of the requests pull, a third load back. The model learns both
// from the TTFTs alone (the fixed cost within 15% + 10 ms, the slopes
// within 15% and 25%: a copy is a small part of a TTFT), and no endpoint's speed factor takes the pulls' cost for
// slowness; the GLM-like link (1.25 s a pull) is learned as well, so
// that short pulls stop paying there.
func TestLearnsCopyAndPullCosts(t *testing.T) {
	for _, link := range []struct {
		name         string
		setup, perTk float64
	}{{"gpt-oss RDMA", 0.028, 10.6e-6}, {"GLM floor", 1.25, 20.7e-6}} {
		eng := engineTTFT{a: 0.0298, b: 19.14e-6, c: 0.226e-9, d: 0.0001}
		m, _ := New(DefaultConfig())
		rng := rand.New(rand.NewPCG(7, 8))
		for i := range 4000 {
			f := randomFeatures(rng)
			y := eng.ttft(f)
			switch i % 3 {
			case 0:
				n := float64(rng.IntN(32000) + 1000)
				share := float64(1 + rng.IntN(3))
				f.Pulls, f.Pulled, f.Context = 1, n*share, f.Context+n
				y = eng.ttft(f) + link.setup + link.perTk*n*share
			case 1:
				n := float64(rng.IntN(32000) + 1000)
				f.Loaded, f.Context = n, f.Context+n
				y = eng.ttft(f) + 0.8e-6*n
			}
			m.Observe([]string{"a", "b"}[i%2], f, y*(1+0.03*rng.NormFloat64()))
		}
		th := m.Coefficients()
		if !(math.Abs(th[fPulls]-link.setup) <= 0.15*link.setup+0.01) {
			t.Errorf("%s: pull setup %.4g s, want %.4g within 15%% + 10 ms", link.name, th[fPulls], link.setup)
		}
		if !near(th[fPulled], link.perTk*1e3, 0.15) {
			t.Errorf("%s: pull slope %.4g s/ktok, want %.4g within 15%%", link.name, th[fPulled], link.perTk*1e3)
		}
		if !(math.Abs(th[fLoaded]-0.8e-3) <= 0.25*0.8e-3+2e-4) {
			t.Errorf("%s: load-back slope %.4g s/ktok, want ≈ %.4g", link.name, th[fLoaded], 0.8e-3)
		}
		for _, u := range []string{"a", "b"} {
			if s := m.Speed(u); !(s > 0.85 && s < 1.15) {
				t.Errorf("%s: endpoint %s speed factor %.2f, want ≈1", link.name, u, s)
			}
		}
	}
}
