package sched_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// TestDefaultLatencyIsTheOldModel: with the default profile (sim-default)
// a step lasts exactly what it did before profiles: 25 ms, plus 0.1 ms per
// decoding sequence, plus its prefill tokens at 10,000 tok/s, mixed steps
// included.
func TestDefaultLatencyIsTheOldModel(t *testing.T) {
	old := func(prefill, decodes int) time.Duration {
		return 25*time.Millisecond + time.Duration(decodes)*(100*time.Microsecond) +
			time.Duration(float64(prefill)/10_000*float64(time.Second))
	}
	cfg := config()
	if cfg.Latency.Name != profile.SimDefault {
		t.Fatalf("the default profile is %q", cfg.Latency.Name)
	}
	e := &engine{t: t, s: newScheduler(t, cfg)}
	e.add(sched.Request{ID: 1, Prompt: prompt(1000, 300), MaxTokens: 20, IgnoreEOS: true})
	e.add(sched.Request{ID: 2, Prompt: prompt(2000, 77), MaxTokens: 20, IgnoreEOS: true})
	for i, want := range []time.Duration{
		old(256, 0),   // 1's first chunk fills the budget
		old(44+77, 0), // 1's last chunk and 2 whole
		old(0, 2),     // both decode
	} {
		if st := e.step(); st.Duration != want {
			t.Fatalf("step %d lasted %v, want %v", i, st.Duration, want)
		}
	}
	e.add(sched.Request{ID: 3, Prompt: prompt(1000, 150), MaxTokens: 1}) // 1's first 9 blocks cached
	if st := e.step(); st.Duration != old(150-144, 2) || st.CachedTokens != 144 {
		t.Fatalf("a cached prefix beside two decodes: %v, %d cached; want %v", st.Duration, st.CachedTokens, old(6, 2))
	}
}

// TestProfileLatency: with a profile that has a quadratic prefill term and
// a KV term in decode, each step is the profile's StepCost of what it
// computes: chunks at their context offsets (a cached prefix included) and
// decodes over their contexts; a lone cold request's time to first token
// is the profile's ColdPrefill.
func TestProfileLatency(t *testing.T) {
	p, err := profile.Named(profile.GPTOSS120BH200)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config()
	p.MaxNumBatchedTokens = cfg.MaxNumBatchedTokens
	cfg.Latency = p
	e := &engine{t: t, s: newScheduler(t, cfg)}
	e.add(sched.Request{ID: 1, Prompt: prompt(1000, 600), MaxTokens: 2, IgnoreEOS: true})
	for i, c := range []profile.Chunk{{Offset: 0, Tokens: 256}, {Offset: 256, Tokens: 256}, {Offset: 512, Tokens: 88}} {
		st := e.step()
		if want := p.StepBase + p.ChunkCost(c.Offset, c.Tokens); st.Duration != want {
			t.Fatalf("chunk %d: %v, want %v", i, st.Duration, want)
		}
		if i == 2 && (len(st.Updates) != 1 || st.Updates[0].TTFT != p.ColdPrefill(600)) {
			t.Fatalf("first token %+v, want a TTFT of %v", st.Updates, p.ColdPrefill(600))
		}
	}
	if st := e.step(); st.Duration != p.StepCost(nil, 1, 601) || st.Updates[0].Finish == "" {
		t.Fatalf("the decode over 601 tokens: %v, want %v", st.Duration, p.StepCost(nil, 1, 601))
	}
	if p.StepCost(nil, 1, 601) <= p.StepCost(nil, 1, 1) {
		t.Fatal("the decode's context costs nothing")
	}
	e.add(sched.Request{ID: 2, Prompt: prompt(1000, 200), MaxTokens: 1}) // 12 blocks cached
	if st := e.step(); st.CachedTokens != 192 || st.Duration != p.StepBase+p.ChunkCost(192, 8) {
		t.Fatalf("a cached prefix: %v, %d cached; want %v", st.Duration, st.CachedTokens, p.StepBase+p.ChunkCost(192, 8))
	}
}

// TestSetLatency: a replaced latency model prices the next step; an
// invalid one is refused and the old one kept.
func TestSetLatency(t *testing.T) {
	cfg := sched.DefaultConfig()
	s, err := sched.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	slow := cfg.Latency
	slow.StepBase *= 2
	if err := s.SetLatency(slow); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(sched.Request{ID: 1, Prompt: make([]uint32, 16), MaxTokens: 1}, 0); err != nil {
		t.Fatal(err)
	}
	st := s.Step(0)
	want := slow.StepCost([]profile.Chunk{{Tokens: 16}}, 0, 0)
	if st.Duration != want {
		t.Fatalf("step took %v, want %v at the slower model", st.Duration, want)
	}
	bad := slow
	bad.PrefillTokensPerSecond = 0
	if err := s.SetLatency(bad); err == nil {
		t.Fatal("an invalid profile was taken")
	}
}
