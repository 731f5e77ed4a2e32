package lab

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/test/workload"
)

// reportSample is a load report a picker held: when the engine's figures
// were taken (the report's arrival less its transit), and them.
type reportSample struct {
	taken time.Duration
	url   string
	stats fleet.EngineStats
}

// TestEngineStatsInLoadReports: the lab's load reports carry each engine's
// own request figures as its /metrics would, taken at its last finished
// step: at every report a picker held during the run, TTFTCount is the
// requests whose first token the engine had made by then, and the queue
// and prefill counts those it had finished (vLLM observes them at the
// end); the last report has every request, its prompt and cached tokens,
// and sums on the virtual clock: the TTFTs the clients saw less the render
// and the two hops, and queue + prefill = TTFT.
func TestEngineStatsInLoadReports(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Pickers = 2
	d := cfg.Delays
	var r *run
	var samples []reportSample
	watch := func(rr *run) {
		r = rr
		var look func()
		look = func() { // every 13 ms, off the load period's phase
			for _, p := range r.pickers {
				for _, ep := range p.fleet.Endpoints() {
					if ep.HasLoad() {
						samples = append(samples, reportSample{ep.LoadAt.Sub(r.sim.base) - d.SummaryToPicker, ep.URL, ep.Load.Engine})
					}
				}
			}
			if r.live() {
				r.sim.after(13*time.Millisecond, look)
			}
		}
		r.sim.after(13*time.Millisecond, look)
	}
	outs, _, err := runWith(cfg, convos{n: 12, turns: 3, engines: 3}, workload.Options{Seed: 3, Rate: 4}, watch)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) < 100 {
		t.Fatalf("%d reports sampled", len(samples))
	}
	for _, s := range samples {
		if err := withinReport(s, outs, d); err != nil {
			t.Fatalf("%s, report taken at %v: %v", s.url, s.taken, err)
		}
	}
	queued := 0.0
	for _, p := range r.pickers {
		for _, ep := range p.fleet.Endpoints() {
			if err := lastReport(ep, outs, d); err != nil {
				t.Fatalf("%s, the last report: %v", ep.URL, err)
			}
			queued += ep.Load.Engine.QueueSeconds
		}
	}
	if queued <= 0 {
		t.Fatal("no request waited in a queue at rate 4")
	}
}

// withinReport checks a report's counts against what the engine had done
// by then, from the outcomes: a first token made at step end t reaches
// the client a hop later (Start + TTFT), the last one likewise (End). A
// step ending at the very instant the report was taken may be in it or
// not.
func withinReport(s reportSample, outs []Outcome, d Delays) error {
	var firstLo, firstHi, endLo, endHi float64
	var admittedLo, arrivedHi float64
	for _, o := range outs {
		if o.Endpoint != s.url || !o.OK() {
			continue
		}
		first, end, arrived := o.Start+o.TTFT-d.Hop, o.End-d.Hop, o.Start+d.Render+d.Hop
		firstLo, firstHi = firstLo+b2f(first < s.taken), firstHi+b2f(first <= s.taken)
		endLo, endHi = endLo+b2f(end < s.taken), endHi+b2f(end <= s.taken)
		if first < s.taken {
			admittedLo += float64(o.PromptTokens)
		}
		if arrived <= s.taken {
			arrivedHi += float64(o.PromptTokens)
		}
	}
	g := s.stats
	switch {
	case !g.Have:
		return fmt.Errorf("no engine figures: %+v", g)
	case g.TTFTCount < firstLo || g.TTFTCount > firstHi:
		return fmt.Errorf("TTFT count %v; first tokens made by then: %v to %v", g.TTFTCount, firstLo, firstHi)
	case g.QueueCount != g.PrefillCount || g.QueueCount < endLo || g.QueueCount > endHi:
		return fmt.Errorf("queue count %v, prefill count %v; requests finished by then: %v to %v", g.QueueCount, g.PrefillCount, endLo, endHi)
	case g.PromptTokens < admittedLo || g.PromptTokens > arrivedHi:
		return fmt.Errorf("prompt tokens %v; admitted by then: %v to %v", g.PromptTokens, admittedLo, arrivedHi)
	}
	return nil
}

// lastReport checks the last report a picker holds of ep, taken once
// every request was answered: every request the engine served, with its
// prompt and cached tokens and its engine-side TTFT.
func lastReport(ep fleet.Endpoint, outs []Outcome, d Delays) error {
	var n, prompt, cached, ttft float64
	for _, o := range outs {
		if o.Endpoint == ep.URL && o.OK() {
			n++
			prompt += float64(o.PromptTokens)
			cached += float64(o.CachedTokens)
			ttft += (o.TTFT - d.Render - 2*d.Hop).Seconds() // the client's less the render and the hops
		}
	}
	g := ep.Load.Engine
	switch {
	case n == 0:
		return fmt.Errorf("served nothing")
	case !g.Have || g.TTFTCount != n || g.QueueCount != n || g.PrefillCount != n:
		return fmt.Errorf("%+v; want %v requests in every count", g, n)
	case g.PromptTokens != prompt || g.CachedTokens != cached:
		return fmt.Errorf("prompt %v, cached %v tokens; want %v, %v", g.PromptTokens, g.CachedTokens, prompt, cached)
	case math.Abs(g.TTFTSeconds-ttft) > 1e-9 || math.Abs(g.QueueSeconds+g.PrefillSeconds-g.TTFTSeconds) > 1e-9:
		return fmt.Errorf("TTFT %v s (want %v), queue %v + prefill %v s", g.TTFTSeconds, ttft, g.QueueSeconds, g.PrefillSeconds)
	case g.PrefillSeconds <= 0 || g.QueueSeconds < 0:
		return fmt.Errorf("queue %v, prefill %v s", g.QueueSeconds, g.PrefillSeconds)
	}
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
