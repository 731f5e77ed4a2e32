package sched_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/sched"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
)

// tiered is config() with a CPU tier of cpuBlocks blocks.
func tiered(cpuBlocks int) sched.Config {
	cfg := config()
	cfg.Cache.CPUBlocks = cpuBlocks
	return cfg
}

// arrival is a request and when it arrives.
type arrival struct {
	at  time.Duration
	req sched.Request
}

// answerFunc answers a lookup as a shell does: the blocks the source
// holds, when they arrive, whether the pull failed.
type answerFunc func(sched.Lookup) (blocks int, ready time.Duration, failed bool)

// shell drives one scheduler in simulated time as the engine's shell
// does: arrivals at their times, a step whenever there is work, and when
// a step computed nothing, a jump to the next arrival or to NextReady;
// lookups are answered at once by answer. It records every step and the
// first update of every request.
type shell struct {
	t      *testing.T
	s      *sched.Scheduler
	now    time.Duration
	answer answerFunc
	steps  []sched.Step
	starts []time.Duration
	first  map[sched.ID]sched.Update
}

func newShell(t *testing.T, cfg sched.Config, answer answerFunc) *shell {
	return &shell{t: t, s: newScheduler(t, cfg), answer: answer, first: map[sched.ID]sched.Update{}}
}

// run plays arrivals (in time order) until the engine is idle and every
// request arrived.
func (h *shell) run(arrivals ...arrival) {
	h.t.Helper()
	for n := 0; ; n++ {
		if n > 10_000 {
			h.t.Fatal("not idle after 10,000 steps")
		}
		for len(arrivals) > 0 && arrivals[0].at <= h.now {
			if err := h.s.Add(arrivals[0].req, arrivals[0].at); err != nil {
				h.t.Fatal(err)
			}
			arrivals = arrivals[1:]
		}
		st := h.s.Step(h.now)
		h.steps, h.starts = append(h.steps, st), append(h.starts, h.now)
		for _, u := range st.Updates {
			if u.First {
				h.first[u.ID] = u
			}
		}
		for _, lk := range st.Lookups {
			blocks, ready, failed := h.answer(lk)
			if err := h.s.Resolve(lk.ID, blocks, ready, failed); err != nil {
				h.t.Fatal(err)
			}
		}
		if st.Duration > 0 {
			h.now += st.Duration
			continue
		}
		next := h.s.NextReady()
		if len(arrivals) > 0 && (next == 0 || arrivals[0].at < next) {
			next = arrivals[0].at
		}
		switch {
		case next > h.now:
			h.now = next
		case next == 0 && h.s.Idle():
			return
		case next == 0:
			h.t.Fatalf("stuck at %v: %+v", h.now, h.s.Load())
		}
	}
}

// sum adds a figure over the recorded steps.
func (h *shell) sum(f func(sched.Step) int64) int64 {
	var n int64
	for _, st := range h.steps {
		n += f(st)
	}
	return n
}

// noPeer answers no lookup (none is expected).
func noPeer(t *testing.T) answerFunc {
	return func(lk sched.Lookup) (int, time.Duration, bool) {
		t.Fatalf("unexpected lookup %+v", lk)
		return 0, 0, false
	}
}

// TestCPUHitLatency: the same prompt met again after the GPU forgot it
// (a prefix-cache reset keeps the CPU tier) waits for its load-back and
// then prefills the rest: slower than a GPU hit by exactly LoadBack of
// the hit, faster than recomputing it; the hit is credited as cached
// tokens, split as CPU hits, and its bytes counted as loaded.
func TestCPUHitLatency(t *testing.T) {
	warm := prompt(5000, 100) // 6 full blocks: 96 tokens hit (len−1 cap)
	for _, c := range []struct {
		name      string
		cpuBlocks int
		reset     bool
		gpu, cpu  int // hit tokens
	}{
		{"GPU hit", 32, false, 96, 0},
		{"CPU hit", 32, true, 0, 96},
		{"recompute, no tier", 0, true, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := tiered(c.cpuBlocks) // sim-default: 96 tokens load in 251.66 µs
			h := newShell(t, cfg, noPeer(t))
			h.run(arrival{0, sched.Request{ID: 1, Prompt: warm, MaxTokens: 1}})
			if c.reset {
				if _, err := h.s.ResetPrefixCache(false); err != nil {
					t.Fatal(err)
				}
			}
			start := h.now
			h.run(arrival{start, sched.Request{ID: 2, Prompt: warm, MaxTokens: 1}})
			u := h.first[2]
			lb := cfg.Latency.LoadBack(c.cpu)
			want := lb + cfg.Latency.StepCost([]profile.Chunk{{Offset: c.gpu + c.cpu, Tokens: 100 - c.gpu - c.cpu}}, 0, 0)
			if u.TTFT != want || u.CachedTokens != c.gpu+c.cpu || u.GPUHitTokens != c.gpu || u.CPUHitTokens != c.cpu || u.PulledTokens != 0 {
				t.Fatalf("first token %+v; want a TTFT of %v with %d GPU and %d CPU hit tokens", u, want, c.gpu, c.cpu)
			}
			if c.cpu > 0 && (lb != 251_658*time.Nanosecond || u.TTFT != cfg.Latency.StepBase+prefill(cfg, 4)+lb) {
				t.Fatalf("load-back %v; TTFT %v", lb, u.TTFT)
			}
			var cpuHits, loaded int64
			for _, st := range h.steps[len(h.steps)-2:] {
				cpuHits += int64(st.CPUHitTokens)
				loaded += st.LoadedBytes
			}
			if cpuHits != int64(c.cpu) || loaded != int64(c.cpu)*131_072 {
				t.Fatalf("step figures: %d CPU hit tokens, %d bytes loaded", cpuHits, loaded)
			}
		})
	}
	// The three, in order.
	cfg := tiered(32)
	gpuHit := cfg.Latency.StepBase + prefill(cfg, 4)
	cpuHit := gpuHit + cfg.Latency.LoadBack(96)
	recompute := cfg.Latency.StepBase + prefill(cfg, 100)
	if !(gpuHit < cpuHit && cpuHit < recompute) {
		t.Fatalf("GPU hit %v, CPU hit %v, recompute %v: not in order", gpuHit, cpuHit, recompute)
	}
}

// TestWaitingForKVDoesNotBlock: a request loading from the CPU tier keeps
// its place at the head of the queue, counts as waiting, and the
// requests behind it are admitted and run meanwhile; it is admitted in
// the first step starting once its load is done.
func TestWaitingForKVDoesNotBlock(t *testing.T) {
	cfg := tiered(32)
	cfg.Latency.H2DBytesPerSecond = 1e8 // 96 tokens load in 125.8 ms: several steps
	h := newShell(t, cfg, noPeer(t))
	warm := prompt(5000, 100)
	h.run(arrival{0, sched.Request{ID: 1, Prompt: warm, MaxTokens: 1}})
	if _, err := h.s.ResetPrefixCache(false); err != nil {
		t.Fatal(err)
	}
	h.steps, h.starts = nil, nil
	t0 := h.now
	h.run(arrival{t0, sched.Request{ID: 2, Prompt: warm, MaxTokens: 1}},
		arrival{t0, sched.Request{ID: 3, Prompt: prompt(9000, 40), MaxTokens: 20, IgnoreEOS: true}})
	ready := t0 + cfg.Latency.LoadBack(96)
	first := h.steps[0]
	if first.Scheduled != 1 || len(first.Updates) != 1 || first.Updates[0].ID != 3 || first.Load.Waiting != 1 || first.NextReady != ready {
		t.Fatalf("first step: %+v; want request 3 run, 2 waiting until %v", first, ready)
	}
	for i, st := range h.steps {
		admitted := slices.ContainsFunc(st.Updates, func(u sched.Update) bool { return u.ID == 2 })
		if h.starts[i] < ready && (admitted || st.Load.Waiting != 1) {
			t.Fatalf("step %d at %v, before the load ends: %+v", i, h.starts[i], st)
		}
		if admitted && (h.starts[i] < ready || i > 0 && h.starts[i-1] >= ready) {
			t.Fatalf("request 2 admitted in the step at %v; its load ended at %v", h.starts[i], ready)
		}
	}
	if h.first[3].TTFT >= h.first[2].TTFT || h.first[2].CPUHitTokens != 96 {
		t.Fatalf("request 3 first at %v, request 2 at %v (%+v)", h.first[3].TTFT, h.first[2].TTFT, h.first[2])
	}
}

// pullSetup is a source engine whose CPU tier holds the blocks of warm
// (or not, when evicted), and the links between it and the consumer.
type pullSetup struct {
	src   *sched.Scheduler
	links transfer.Links
	prof  profile.Profile
}

func newPullSetup(t *testing.T, warm []uint32, evict bool) *pullSetup {
	cfg := tiered(8)
	src := newShell(t, cfg, noPeer(t))
	arrivals := []arrival{{0, sched.Request{ID: 1, Prompt: warm, MaxTokens: 1}}}
	if evict { // another prompt of 8 blocks fills the tier
		arrivals = append(arrivals, arrival{time.Second, sched.Request{ID: 2, Prompt: prompt(70000, 130), MaxTokens: 1}})
	}
	src.run(arrivals...)
	return &pullSetup{src: src.s, prof: cfg.Latency}
}

// answer is the shell's answer to a lookup: the source's CPU run, pulled
// over the links from the lookup's At; a pull past the timeout fails.
func (p *pullSetup) answer(lk sched.Lookup) (int, time.Duration, bool) {
	blocks := p.src.ServeLookup(lk.Hashes)
	end, _ := p.links.Start(lk.Source, "dst", blocks*16, lk.At, p.prof)
	if end-lk.At > transfer.PullTimeout {
		return blocks, lk.At + transfer.PullTimeout, true
	}
	return blocks, end, false
}

// TestPull: a request naming a source asks it (a lookup costing a step),
// pulls what its CPU tier holds into the local tier, loads it and
// prefills the rest; a source that evicted the blocks, or a failed pull,
// leaves it to recompute, counted as a failure. Every TTFT is exact.
func TestPull(t *testing.T) {
	warm := prompt(5000, 100) // 6 full blocks; 96 tokens can come by a pull
	for _, c := range []struct {
		name           string
		evicted        bool
		fail           bool
		pulled         int
		pulls, failed  int
		misses         int
		wantExtraDelay func(p profile.Profile) time.Duration // between the lookup's answer and the admission
		noTier         bool                                  // the consumer has no CPU tier to keep them
	}{
		{"the source holds them", false, false, 96, 1, 0, 0, func(p profile.Profile) time.Duration {
			return p.PullTime(96, 1, true) + p.LoadBack(96)
		}, false},
		{"the source evicted them", true, false, 0, 0, 1, 1, func(profile.Profile) time.Duration { return 0 }, false},
		{"the pull failed (timed out)", false, true, 0, 0, 1, 0, func(profile.Profile) time.Duration { return transfer.PullTimeout }, false},
		// The transfer ran, but nothing was kept: a miss, not a pull, and
		// no bytes counted.
		{"the consumer cannot keep them", false, false, 0, 0, 1, 1, func(p profile.Profile) time.Duration { return p.PullTime(96, 1, true) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ps := newPullSetup(t, warm, c.evicted)
			answer := ps.answer
			if c.fail {
				answer = func(lk sched.Lookup) (int, time.Duration, bool) { return 6, lk.At + transfer.PullTimeout, true }
			}
			cfg := tiered(32)
			if c.noTier {
				cfg = tiered(0)
			}
			h := newShell(t, cfg, answer)
			h.run(arrival{0, sched.Request{ID: 7, Prompt: warm, MaxTokens: 1, Source: "src"}})
			lk := h.steps[0].Lookups
			if len(lk) != 1 || lk[0].ID != 7 || lk[0].Source != "src" || lk[0].FromBlock != 0 || len(lk[0].Hashes) != 6 ||
				lk[0].At != cfg.Latency.StepBase || h.steps[0].Duration != 0 {
				t.Fatalf("first step: %+v; want one lookup of 6 blocks answerable after a step base", h.steps[0])
			}
			u := h.first[7]
			want := cfg.Latency.StepBase + c.wantExtraDelay(cfg.Latency) +
				cfg.Latency.StepCost([]profile.Chunk{{Offset: c.pulled, Tokens: 100 - c.pulled}}, 0, 0)
			if u.TTFT != want || u.PulledTokens != c.pulled || u.CachedTokens != c.pulled || u.CPUHitTokens != 0 {
				t.Fatalf("first token %+v; want a TTFT of %v, %d pulled tokens", u, want, c.pulled)
			}
			sum := func(f func(sched.Step) int) int64 { return h.sum(func(st sched.Step) int64 { return int64(f(st)) }) }
			if sum(func(st sched.Step) int { return st.Pulls }) != int64(c.pulls) ||
				sum(func(st sched.Step) int { return st.PullFailures }) != int64(c.failed) ||
				sum(func(st sched.Step) int { return st.PullMisses }) != int64(c.misses) ||
				sum(func(st sched.Step) int { return st.PulledTokens }) != int64(c.pulled) ||
				h.sum(func(st sched.Step) int64 { return st.PulledBytes }) != int64(c.pulled)*131_072 ||
				h.sum(func(st sched.Step) int64 { return st.LoadedBytes }) != int64(c.pulled)*131_072 {
				t.Fatalf("figures: pulls, failures, misses, pulled tokens, bytes wrong: %+v", h.steps)
			}
			if c.pulled > 0 && ps.src.NumCachedBlocks() == 0 {
				t.Fatal("the source's GPU was touched") // it holds its own blocks still
			}
		})
	}
}

// TestLookupCostsAStep: a lookup made in a step that computes something
// is answerable at that step's end; an answer saying earlier is held to
// it; a request with nothing beyond its local hits asks nobody; one
// without a Source never asks.
func TestLookupCostsAStep(t *testing.T) {
	cfg := config()
	s := newScheduler(t, cfg)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Add(sched.Request{ID: 1, Prompt: prompt(100, 200), MaxTokens: 1}, 0))
	must(s.Add(sched.Request{ID: 2, Prompt: prompt(5000, 100), MaxTokens: 1, Source: "peer"}, 0))
	must(s.Add(sched.Request{ID: 3, Prompt: prompt(5000, 10), MaxTokens: 1, Source: "peer"}, 0)) // no full block within the cap
	st := s.Step(0)
	if st.Duration == 0 || len(st.Lookups) != 1 || st.Lookups[0].ID != 2 || st.Lookups[0].At != st.Duration || st.Scheduled != 2 {
		t.Fatalf("step: %v, lookups %+v; want requests 1 and 3 run (3 has nothing to ask for), and 2's lookup answerable at the step's end", st.Duration, st.Lookups)
	}
	must(s.Resolve(2, 0, 0, false)) // a miss "at 0"
	if !errors.Is(s.Resolve(2, 0, 0, false), sched.ErrNoLookup) || !errors.Is(s.Resolve(1, 0, 0, false), sched.ErrNoLookup) {
		t.Fatal("a second answer, or an answer to a request that asked nothing, was taken")
	}
	if s.NextReady() != st.Duration {
		t.Fatalf("ready at %v, want the lookup's step end %v", s.NextReady(), st.Duration)
	}
	st2 := s.Step(st.Duration)
	if st2.PullFailures != 1 || st2.PullMisses != 1 || len(st2.Updates) != 1 || st2.Updates[0].ID != 2 || st2.Updates[0].CachedTokens != 0 {
		t.Fatalf("second step: %+v; want the miss counted and request 2 recomputed", st2)
	}
	if l := s.Load(); l.Waiting != 0 {
		t.Fatalf("load %+v", l)
	}
}

// TestCPUTierOffloadsPromptsOnly: with offload_prompt_only the tier gets
// the prompt's full blocks only; without, the generated ones too, as they
// fill; StoredBytes counts the copies.
func TestCPUTierOffloadsPromptsOnly(t *testing.T) {
	for _, c := range []struct {
		promptOnly bool
		stored     int // blocks: a 40-token prompt (2 full blocks) and 60 generated tokens
	}{{true, 2}, {false, 6}} {
		cfg := tiered(32)
		cfg.Cache.OffloadPromptOnly = c.promptOnly
		h := newShell(t, cfg, noPeer(t))
		h.run(arrival{0, sched.Request{ID: 1, Prompt: prompt(100, 40), MaxTokens: 60, IgnoreEOS: true}})
		if got := h.s.CPUStats().Stored; got != c.stored || h.sum(func(st sched.Step) int64 { return st.StoredBytes }) != int64(c.stored)*16*131_072 {
			t.Errorf("prompt only %v: %d blocks offloaded, want %d", c.promptOnly, got, c.stored)
		}
	}
}

// TestCPUEvents: the tier's events come after the GPU's in a step's
// batch, as placeholders by default and self-describing when asked, with
// the hashes of the GPU events; an LRU eviction publishes CPU removals of
// the oldest prompt's blocks, its tail first.
func TestCPUEvents(t *testing.T) {
	for _, selfDescribing := range []bool{false, true} {
		cfg := tiered(6)
		cfg.Cache.SelfDescribing = selfDescribing
		h := newShell(t, cfg, noPeer(t))
		a := prompt(100, 64) // 4 blocks
		h.run(arrival{0, sched.Request{ID: 1, Prompt: a, MaxTokens: 1, LoRA: "ad", LoraID: 2}})
		ev := h.steps[0].Events
		if len(ev) != 5 || ev[0].Medium != kvevents.MediumGPU || ev[0].Type != kvevents.TypeBlockStored {
			t.Fatalf("self-describing %v: events %+v; want the GPU run, then 4 CPU stores", selfDescribing, ev)
		}
		for i, e := range ev[1:] {
			ok := e.Type == kvevents.TypeBlockStored && e.Medium == kvevents.MediumCPU && len(e.BlockHashes) == 1 &&
				e.BlockHashes[0] == ev[0].BlockHashes[i] && e.GroupIdx == kvevents.Some(0) && e.ExtraKeys == nil && e.Validate() == nil
			if selfDescribing {
				ok = ok && slices.Equal(e.TokenIDs, a[16*i:16*i+16]) && e.BlockSize == 16 && e.HasParent == (i > 0) &&
					(i == 0 || e.ParentBlockHash == ev[0].BlockHashes[i-1]) && e.LoraName == "ad" && e.LoraID == kvevents.Some(2) &&
					e.KVCacheSpecKind == "full_attention"
			} else {
				ok = ok && e.Placeholder() && !e.HasParent && e.LoraName == "" && !e.LoraID.Valid && e.KVCacheSpecKind == ""
			}
			if !ok {
				t.Errorf("self-describing %v: CPU store %d: %+v", selfDescribing, i, e)
			}
		}
		// A second prompt of 4 blocks: 2 of a's go, its last two, in one removal.
		h.run(arrival{h.now, sched.Request{ID: 2, Prompt: prompt(900, 64), MaxTokens: 1}})
		var removed []kvevents.Event
		for _, st := range h.steps[1:] {
			for _, e := range st.Events {
				if e.Medium == kvevents.MediumCPU && e.Type == kvevents.TypeBlockRemoved {
					removed = append(removed, e)
				}
			}
		}
		if want := []kvevents.Hash{ev[0].BlockHashes[3], ev[0].BlockHashes[2]}; len(removed) != 1 || !slices.Equal(removed[0].BlockHashes, want) {
			t.Errorf("self-describing %v: removals %+v, want one of %v", selfDescribing, removed, want)
		}
	}
}

// TestCPUTierGuard is the guard of kv-transfer.md §8 item 1: on a
// workload whose working set (8 prompts of 12 blocks) exceeds the GPU
// cache (63 blocks) and is revisited round-robin, a larger CPU tier must
// raise the hit rate AND lower the mean TTFT; and every request's TTFT
// is exactly its load-back plus its prefill of the rest (the engine is
// idle at each arrival), so a free load-back or an uncredited CPU hit
// fails here.
func TestCPUTierGuard(t *testing.T) {
	type result struct {
		hitRate float64
		ttft    time.Duration
	}
	run := func(cpuBlocks int) result {
		cfg := tiered(cpuBlocks)
		cfg.Latency.H2DBytesPerSecond = 5e9 // 192 tokens load in 5 ms: visible beside 45 ms prefills
		h := newShell(t, cfg, noPeer(t))
		var arrivals []arrival
		for i := 0; i < 24; i++ {
			arrivals = append(arrivals, arrival{time.Duration(i) * 100 * time.Millisecond,
				sched.Request{ID: sched.ID(i + 1), Prompt: prompt(10_000*(i%8), 200), MaxTokens: 2, IgnoreEOS: true}})
		}
		h.run(arrivals...)
		var total time.Duration
		for id, u := range h.first {
			hit := u.GPUHitTokens + u.CPUHitTokens
			want := cfg.Latency.LoadBack(u.CPUHitTokens) + cfg.Latency.StepCost([]profile.Chunk{{Offset: hit, Tokens: 200 - hit}}, 0, 0)
			if u.TTFT != want || u.CachedTokens != hit {
				t.Fatalf("tier %d, request %d: %+v; want a TTFT of %v", cpuBlocks, id, u, want)
			}
			total += u.TTFT
		}
		prompts := h.sum(func(st sched.Step) int64 { return int64(st.PromptTokens) })
		hits := h.sum(func(st sched.Step) int64 { return int64(st.CachedTokens + st.CPUHitTokens) })
		return result{float64(hits) / float64(prompts), total / time.Duration(len(h.first))}
	}
	var prev result
	for i, cpu := range []int{0, 48, 128} {
		r := run(cpu)
		t.Logf("CPU tier %3d blocks: hit rate %.3f, mean TTFT %v", cpu, r.hitRate, r.ttft)
		if i > 0 && (r.hitRate < prev.hitRate || r.ttft > prev.ttft || (r.hitRate > prev.hitRate) != (r.ttft < prev.ttft)) {
			t.Fatalf("tier %d: hit rate %.3f, TTFT %v after %.3f, %v: a tier that changes the hit rate must change the latency with it", cpu, r.hitRate, r.ttft, prev.hitRate, prev.ttft)
		}
		if cpu == 0 && r.hitRate != 0 || cpu == 128 && r.hitRate < 0.6 {
			t.Fatalf("tier %d: hit rate %.3f; want none without a tier and two rounds of three hit with all prompts held", cpu, r.hitRate)
		}
		prev = r
	}
}

// TestKVWaitersLeave: a request waiting for KV (a load, or a lookup's
// answer) that is cancelled leaves at the next step, without an update;
// a restart drops them with the rest and empties the tier; a prefix-cache
// reset keeps the tier (the load still hits) while a connector reset
// empties it (the load recomputes).
func TestKVWaitersLeave(t *testing.T) {
	setup := func(t *testing.T) (*sched.Scheduler, sched.Config, time.Duration) {
		cfg := tiered(32)
		cfg.Latency.H2DBytesPerSecond = 1e8 // 96 tokens: 125.8 ms
		h := newShell(t, cfg, noPeer(t))
		h.run(arrival{0, sched.Request{ID: 1, Prompt: prompt(5000, 100), MaxTokens: 1}})
		if _, err := h.s.ResetPrefixCache(false); err != nil {
			t.Fatal(err)
		}
		now := h.now
		for _, r := range []sched.Request{
			{ID: 2, Prompt: prompt(5000, 100), MaxTokens: 1},                 // loads from the tier
			{ID: 3, Prompt: prompt(8000, 100), MaxTokens: 1, Source: "peer"}, // asks a peer
		} {
			if err := h.s.Add(r, now); err != nil {
				t.Fatal(err)
			}
		}
		if st := h.s.Step(now); st.Scheduled != 0 || len(st.Lookups) != 1 || st.Load.Waiting != 2 || st.NextReady == 0 {
			t.Fatalf("both should wait for KV: %+v", st)
		}
		return h.s, cfg, now
	}
	t.Run("cancelled", func(t *testing.T) {
		s, _, now := setup(t)
		s.Cancel(2)
		s.Cancel(3)
		st := s.Step(now + time.Millisecond)
		if !slices.Equal(st.Dropped, []sched.ID{2, 3}) || len(st.Updates) != 0 || !s.Idle() || s.NextReady() != 0 {
			t.Fatalf("%+v", st)
		}
		if !errors.Is(s.Resolve(3, 6, now, false), sched.ErrNoLookup) {
			t.Fatal("an answer to a request that left was taken")
		}
	})
	t.Run("restart", func(t *testing.T) {
		s, _, _ := setup(t)
		if ids := s.Restart(); !slices.Equal(ids, []sched.ID{2, 3}) || !s.Idle() || s.NextReady() != 0 || s.CPUStats().Used != 0 {
			t.Fatalf("restart dropped %v; tier %+v", ids, s.CPUStats())
		}
	})
	for _, c := range []struct {
		name      string
		reset     func(*sched.Scheduler) error
		cpuTokens int
	}{
		{"prefix-cache reset keeps the tier", func(s *sched.Scheduler) error { _, err := s.ResetPrefixCache(true); return err }, 96},
		{"connector reset empties it", func(s *sched.Scheduler) error { s.ResetConnectorCache(); return nil }, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, cfg, now := setup(t)
			if err := c.reset(s); err != nil {
				t.Fatal(err)
			}
			if err := s.Resolve(3, 0, now, false); err != nil {
				t.Fatal(err)
			}
			ready := now + cfg.Latency.LoadBack(96)
			st := s.Step(ready)
			var u2 sched.Update
			for _, u := range st.Updates {
				if u.ID == 2 {
					u2 = u
				}
			}
			if !u2.First || u2.CPUHitTokens != c.cpuTokens || u2.CachedTokens != c.cpuTokens {
				t.Fatalf("request 2 at its load's end: %+v; want %d CPU hit tokens", st.Updates, c.cpuTokens)
			}
		})
	}
}

// TestPreemptedRequests: a request preempted while running (here by a
// reset of running requests) comes back through the same door: with its
// prompt in the CPU tier it waits for the load-back and computes only the
// rest; with a Source (and a tier too small to hold its prompt) it asks
// its peer again.
func TestPreemptedRequests(t *testing.T) {
	t.Run("loads its prompt back", func(t *testing.T) {
		cfg := tiered(32)
		s := newScheduler(t, cfg)
		if err := s.Add(sched.Request{ID: 1, Prompt: prompt(5000, 100), MaxTokens: 20, IgnoreEOS: true}, 0); err != nil {
			t.Fatal(err)
		}
		now := s.Step(0).Duration
		now += s.Step(now).Duration // a decode: 102 tokens
		if res, err := s.ResetPrefixCache(true); err != nil || res.Preemptions != 1 {
			t.Fatalf("%+v, %v", res, err)
		}
		st := s.Step(now)
		if st.Scheduled != 0 || st.NextReady != now+cfg.Latency.LoadBack(96) {
			t.Fatalf("after the preemption: %+v; want a load of its 6 prompt blocks", st)
		}
		st = s.Step(st.NextReady)
		if want := cfg.Latency.StepBase + prefill(cfg, 102-96); st.Scheduled != 1 || st.Duration != want || st.LoadedBytes != 96*131_072 {
			t.Fatalf("readmission: %+v; want %v (the 6 tokens past the loaded blocks)", st, want)
		}
	})
	t.Run("asks its peer again", func(t *testing.T) {
		cfg := tiered(1) // holds no 6-block prompt
		s := newScheduler(t, cfg)
		if err := s.Add(sched.Request{ID: 1, Prompt: prompt(5000, 100), MaxTokens: 20, IgnoreEOS: true, Source: "peer"}, 0); err != nil {
			t.Fatal(err)
		}
		st := s.Step(0)
		if len(st.Lookups) != 1 || s.Resolve(1, 0, 0, false) != nil {
			t.Fatalf("first lookup: %+v", st)
		}
		now := st.Lookups[0].At
		now += s.Step(now).Duration
		if _, err := s.ResetPrefixCache(true); err != nil {
			t.Fatal(err)
		}
		if st := s.Step(now); len(st.Lookups) != 1 || st.Lookups[0].ID != 1 || st.Lookups[0].FromBlock != 0 {
			t.Fatalf("after the preemption: %+v; want a new lookup", st)
		}
	})
}
