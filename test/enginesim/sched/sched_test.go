package sched_test

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// config is a small engine: 63 usable blocks of 16 tokens.
func config() sched.Config {
	cfg := sched.DefaultConfig()
	cfg.Cache.NumBlocks = 64
	cfg.Cache.EmitEvents = true
	cfg.MaxModelLen = 1000
	cfg.MaxNumSeqs = 8
	cfg.MaxNumBatchedTokens = 256
	return cfg
}

func newScheduler(t *testing.T, cfg sched.Config) *sched.Scheduler {
	t.Helper()
	s, err := sched.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// prompt is n distinct tokens from base.
func prompt(base, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(base + i)
	}
	return p
}

// engine drives a scheduler in simulated time, as the shell does.
type engine struct {
	t   *testing.T
	s   *sched.Scheduler
	now time.Duration
}

func (e *engine) add(r sched.Request) {
	e.t.Helper()
	if err := e.s.Add(r, e.now); err != nil {
		e.t.Fatalf("add %d: %v", r.ID, err)
	}
}

func (e *engine) step() sched.Step {
	st := e.s.Step(e.now)
	e.now += st.Duration
	return st
}

// untilDone steps until request id finishes (at most limit steps) and
// returns its updates and the steps taken.
func (e *engine) untilDone(id sched.ID, limit int) ([]sched.Update, int) {
	e.t.Helper()
	var got []sched.Update
	for n := 1; n <= limit; n++ {
		for _, u := range e.step().Updates {
			if u.ID == id {
				got = append(got, u)
				if u.Finish != "" {
					return got, n
				}
			}
		}
	}
	e.t.Fatalf("request %d not done within %d steps", id, limit)
	return nil, 0
}

// stored counts the blocks a step's events store.
func stored(events []kvevents.Event) int {
	n := 0
	for _, ev := range events {
		if ev.Type == kvevents.TypeBlockStored {
			n += len(ev.BlockHashes)
		}
	}
	return n
}

func ids(updates []sched.Update) []sched.ID {
	var out []sched.ID
	for _, u := range updates {
		out = append(out, u.ID)
	}
	return out
}

// prefill is the latency model's cost of n prompt tokens.
func prefill(cfg sched.Config, n int) time.Duration {
	return time.Duration(float64(n) / cfg.Latency.PrefillTokensPerSecond * float64(time.Second))
}

// TestChunkedPrefill: a prompt longer than the step's token budget
// prefills over several steps, a chunk of the budget each, storing its
// full blocks as they are computed; its first token comes with the last
// chunk, and its TTFT is the sum of those steps.
func TestChunkedPrefill(t *testing.T) {
	for _, c := range []struct {
		promptLen, budget int
		chunks            []int // tokens prefilled per step
	}{
		{100, 256, []int{100}},
		{100, 32, []int{32, 32, 32, 4}},
		{100, 50, []int{50, 50}},
		{33, 16, []int{16, 16, 1}},
		{600, 256, []int{256, 256, 88}},
	} {
		t.Run(fmt.Sprintf("%d tokens, budget %d", c.promptLen, c.budget), func(t *testing.T) {
			cfg := config()
			cfg.MaxNumBatchedTokens = c.budget
			e := &engine{t: t, s: newScheduler(t, cfg), now: time.Hour} // arrives at 1h
			e.add(sched.Request{ID: 1, Prompt: prompt(1000, c.promptLen), MaxTokens: 5, IgnoreEOS: true})
			var ttft time.Duration
			done := 0
			for i, chunk := range c.chunks {
				st := e.step()
				if want := cfg.Latency.StepBase + prefill(cfg, chunk); st.Duration != want {
					t.Fatalf("step %d lasted %v, want %v (a chunk of %d)", i, st.Duration, want, chunk)
				}
				ttft += st.Duration
				blocks := (done+chunk)/cfg.Cache.BlockSize - done/cfg.Cache.BlockSize
				if got := stored(st.Events); got != blocks {
					t.Fatalf("step %d stored %d blocks, want %d", i, got, blocks)
				}
				done += chunk
				last := i == len(c.chunks)-1
				if !last && len(st.Updates) != 0 {
					t.Fatalf("step %d, prefill not done: updates %+v", i, st.Updates)
				}
				if last && (len(st.Updates) != 1 || !st.Updates[0].First || st.Updates[0].TTFT != ttft || st.Updates[0].CachedTokens != 0) {
					t.Fatalf("step %d, prefill done: updates %+v, want the first token with TTFT %v", i, st.Updates, ttft)
				}
				if st.Load.Running != 1 || st.Load.Waiting != 0 {
					t.Fatalf("step %d: load %+v", i, st.Load)
				}
			}
			st := e.step() // a decode
			if len(st.Updates) != 1 || st.Updates[0].First || st.Duration != cfg.Latency.StepBase+cfg.Latency.DecodePerSeq {
				t.Fatalf("the step after the prefill: %v, %+v", st.Duration, st.Updates)
			}
		})
	}
}

// TestPreemptionFromBack: when a running request needs a block and none
// is free, the newest running requests are preempted first (the one
// asking included, if it is the newest left), nothing is admitted in that
// step, and the preempted requests resume in order when blocks free up,
// the first taking back its still-cached prefix.
func TestPreemptionFromBack(t *testing.T) {
	cfg := config()
	cfg.Cache.NumBlocks = 4 // 3 usable blocks
	cfg.Cache.BlockSize = 4
	e := &engine{t: t, s: newScheduler(t, cfg)}
	// Three one-block prompts; A stops after two tokens.
	e.add(sched.Request{ID: 1, Prompt: prompt(100, 4), MaxTokens: 2, IgnoreEOS: true})
	e.add(sched.Request{ID: 2, Prompt: prompt(200, 4), MaxTokens: 10, IgnoreEOS: true})
	e.add(sched.Request{ID: 3, Prompt: prompt(300, 4), MaxTokens: 10, IgnoreEOS: true})
	for i, want := range []struct {
		updates          []sched.ID
		first            bool
		preemptions      int
		waiting, running int
		usedBlocks       int
		finished         sched.ID
	}{
		// All three admitted and prefilled: each has its first token.
		{updates: []sched.ID{1, 2, 3}, first: true, running: 3, usedBlocks: 3},
		// A's second token needs a block: C (newest) is preempted, then B
		// (the newest left, itself asking); A finishes and frees its two.
		{updates: []sched.ID{1}, preemptions: 2, waiting: 2, finished: 1},
		// B resumes first: its prompt block is still cached, it recomputes
		// its one generated token in a new block. C waits for blocks.
		{updates: []sched.ID{2}, waiting: 1, running: 1, usedBlocks: 2},
	} {
		st := e.step()
		if !slices.Equal(ids(st.Updates), want.updates) || st.Preemptions != want.preemptions {
			t.Fatalf("step %d: updates %v, %d preempted; want %v, %d", i, ids(st.Updates), st.Preemptions, want.updates, want.preemptions)
		}
		for _, u := range st.Updates {
			if u.First != want.first || (u.Finish != "") != (u.ID == want.finished) {
				t.Fatalf("step %d: %+v", i, u)
			}
		}
		if st.Load.Waiting != want.waiting || st.Load.Running != want.running || math.Abs(st.Load.KVUsage-float64(want.usedBlocks)/3) > 1e-9 {
			t.Fatalf("step %d: load %+v, want waiting %d running %d, %d blocks used", i, st.Load, want.waiting, want.running, want.usedBlocks)
		}
	}
	if e.s.NumFreeBlocks() != 1 {
		t.Fatalf("%d free blocks, want 1", e.s.NumFreeBlocks())
	}
}

// TestCachedPrefixAdmission: a request whose prefix is cached is admitted
// with cached tokens = the full blocks it shares (at most len−1 tokens),
// and prefills only the rest, so its step is shorter; the cache salt and
// the LoRA adapter are part of the key.
func TestCachedPrefixAdmission(t *testing.T) {
	warm := prompt(5000, 100) // 6 full blocks and 4 tokens
	for _, c := range []struct {
		name   string
		req    sched.Request
		cached int
	}{
		{"same prompt: 6 blocks", sched.Request{Prompt: warm}, 96},
		{"longer prompt: the 6 blocks", sched.Request{Prompt: append(slices.Clone(warm), prompt(9000, 40)...)}, 96},
		{"shared 64 tokens", sched.Request{Prompt: append(slices.Clone(warm[:64]), prompt(9000, 40)...)}, 64},
		{"the first 64 tokens alone: capped at len−1", sched.Request{Prompt: slices.Clone(warm[:64])}, 48},
		{"another salt", sched.Request{Prompt: warm, Salt: "tenant-b"}, 0},
		{"an adapter", sched.Request{Prompt: warm, LoRA: "Alice", LoraID: 1}, 0},
		{"another prompt", sched.Request{Prompt: prompt(7000, 100)}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config()
			e := &engine{t: t, s: newScheduler(t, cfg)}
			e.add(sched.Request{ID: 1, Prompt: warm, MaxTokens: 1})
			if st := e.step(); len(st.Updates) != 1 || st.Updates[0].Finish == "" || st.CachedTokens != 0 || st.PromptTokens != 100 {
				t.Fatalf("warm-up: %+v", st)
			}
			r := c.req
			r.ID, r.MaxTokens = 2, 1
			e.add(r)
			st := e.step()
			if len(st.Updates) != 1 || !st.Updates[0].First || st.Updates[0].CachedTokens != c.cached {
				t.Fatalf("updates %+v, want the first token with %d cached tokens", st.Updates, c.cached)
			}
			if st.PromptTokens != len(r.Prompt) || st.CachedTokens != c.cached {
				t.Fatalf("prompt figures %d, %d cached; want %d, %d", st.PromptTokens, st.CachedTokens, len(r.Prompt), c.cached)
			}
			if want := cfg.Latency.StepBase + prefill(cfg, len(r.Prompt)-c.cached); st.Duration != want {
				t.Fatalf("the step lasted %v, want %v (%d tokens to prefill)", st.Duration, want, len(r.Prompt)-c.cached)
			}
		})
	}
}

// TestCancel: a cancelled request leaves the engine at the next step that
// reaches it, with no update, reported as dropped, its blocks freed; the
// others run on.
func TestCancel(t *testing.T) {
	for _, c := range []struct {
		name string
		// steps before the cancel; the engine runs request 1 (a 200-token
		// prompt) and request 2, which waits behind it when maxSeqs is 1.
		before, maxSeqs, budget int
		cancel                  sched.ID
		// the steps until the cancelled request leaves
		dropAfter int
	}{
		{"running, decoding", 2, 8, 256, 1, 1},
		{"running, mid-prefill", 1, 8, 64, 1, 1},
		{"waiting, never started", 0, 8, 256, 2, 1},
		// The admission pass reaches it once request 1 (30 tokens, the
		// first at step 1) has finished, at step 30.
		{"waiting behind a full batch", 1, 1, 256, 2, 30},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config()
			cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens = c.maxSeqs, c.budget
			e := &engine{t: t, s: newScheduler(t, cfg)}
			e.add(sched.Request{ID: 1, Prompt: prompt(1000, 200), MaxTokens: 30, IgnoreEOS: true})
			e.add(sched.Request{ID: 2, Prompt: prompt(2000, 20), MaxTokens: 3, IgnoreEOS: true})
			for i := 0; i < c.before; i++ {
				e.step()
			}
			if !e.s.Cancel(c.cancel) {
				t.Fatal("Cancel: not in the engine")
			}
			var st sched.Step
			for n := 1; n <= c.dropAfter; n++ {
				st = e.step()
				if slices.Contains(ids(st.Updates), c.cancel) || (len(st.Dropped) > 0) != (n == c.dropAfter) {
					t.Fatalf("step %d after the cancel: updates %v, dropped %v; want %d dropped, without an update, at step %d",
						n, ids(st.Updates), st.Dropped, c.cancel, c.dropAfter)
				}
			}
			if !slices.Equal(st.Dropped, []sched.ID{c.cancel}) {
				t.Fatalf("dropped %v, want [%d]", st.Dropped, c.cancel)
			}
			// The other request runs to its end; then nothing is left.
			other := 3 - c.cancel
			for n := 0; n < 100 && !e.s.Idle(); n++ {
				st = e.step()
				if slices.Contains(ids(st.Updates), c.cancel) || len(st.Dropped) > 0 {
					t.Fatalf("after the cancel: %+v", st)
				}
			}
			if !e.s.Idle() || st.Load != (sched.Load{}) || e.s.NumFreeBlocks() != cfg.Cache.NumBlocks-1 {
				t.Fatalf("not idle with every block free: load %+v, %d free", st.Load, e.s.NumFreeBlocks())
			}
			if e.s.Cancel(c.cancel) || e.s.Cancel(other) {
				t.Fatal("Cancel found a request that left")
			}
		})
	}
}

// TestFinishReasons: a reply ends with "stop" at its natural length, with
// "length" at max_tokens when that comes first, past the natural length
// with ignore_eos, and with "length" at max_model_len; the request's
// blocks are freed in its last step.
func TestFinishReasons(t *testing.T) {
	p := prompt(3000, 40)
	natural := sched.NaturalLength(p, "")
	if natural < 16 || natural > 63 || sched.NaturalLength(p, "salt") == natural && sched.NaturalLength(prompt(3001, 40), "") == natural {
		t.Fatalf("natural length %d: want 16..63, depending on the prompt and salt", natural)
	}
	for _, c := range []struct {
		name        string
		maxTokens   int
		ignoreEOS   bool
		maxModelLen int
		wantTokens  int
		wantFinish  string
	}{
		{"natural length", 200, false, 1000, natural, sched.FinishStop},
		{"max_tokens equal to the natural length", natural, false, 1000, natural, sched.FinishStop},
		{"max_tokens first", natural - 1, false, 1000, natural - 1, sched.FinishLength},
		{"one token", 1, false, 1000, 1, sched.FinishLength},
		{"ignore_eos: past the natural length", natural + 10, true, 1000, natural + 10, sched.FinishLength},
		{"ignore_eos at the natural length", natural, true, 1000, natural, sched.FinishLength},
		{"max_model_len first", 200, true, 40 + 7, 7, sched.FinishLength},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config()
			cfg.MaxModelLen = c.maxModelLen
			e := &engine{t: t, s: newScheduler(t, cfg)}
			e.add(sched.Request{ID: 7, Prompt: p, MaxTokens: c.maxTokens, IgnoreEOS: c.ignoreEOS})
			got, _ := e.untilDone(7, 300)
			if len(got) != c.wantTokens || got[len(got)-1].Finish != c.wantFinish {
				t.Fatalf("%d tokens, finish %q; want %d, %q", len(got), got[len(got)-1].Finish, c.wantTokens, c.wantFinish)
			}
			for _, u := range got[:len(got)-1] {
				if u.Finish != "" {
					t.Fatalf("finished early: %+v", u)
				}
			}
			if !e.s.Idle() || e.s.NumFreeBlocks() != cfg.Cache.NumBlocks-1 {
				t.Fatalf("after the last token: idle %v, %d free blocks", e.s.Idle(), e.s.NumFreeBlocks())
			}
		})
	}
}

// TestSameOutput: the output is a function of the prompt and the salt
// only: the same prompt gives the same tokens alone or in a batch, at
// any time.
func TestSameOutput(t *testing.T) {
	run := func(others int, salt string) []uint32 {
		e := &engine{t: t, s: newScheduler(t, config()), now: time.Duration(others) * time.Hour}
		for i := 0; i < others; i++ {
			e.add(sched.Request{ID: sched.ID(100 + i), Prompt: prompt(10000*i, 30), MaxTokens: 50})
		}
		e.add(sched.Request{ID: 1, Prompt: prompt(3000, 40), MaxTokens: 100, Salt: salt})
		got, _ := e.untilDone(1, 300)
		var toks []uint32
		for _, u := range got {
			toks = append(toks, u.Token)
		}
		return toks
	}
	alone := run(0, "")
	if batched := run(3, ""); !slices.Equal(alone, batched) {
		t.Fatalf("alone %v, in a batch %v", alone, batched)
	}
	if salted := run(0, "x"); slices.Equal(alone, salted) {
		t.Fatal("another salt, the same output")
	}
}

// TestResetAndRestart: a prefix-cache reset fails while requests hold
// blocks unless running requests are preempted first, and publishes
// AllBlocksCleared; a restart drops every request (running first) and
// empties the cache without events.
func TestResetAndRestart(t *testing.T) {
	cfg := config()
	cfg.MaxNumSeqs = 1
	e := &engine{t: t, s: newScheduler(t, cfg)}
	e.add(sched.Request{ID: 1, Prompt: prompt(100, 40), MaxTokens: 20, IgnoreEOS: true})
	e.add(sched.Request{ID: 2, Prompt: prompt(200, 40), MaxTokens: 20, IgnoreEOS: true})
	e.step()
	if _, err := e.s.ResetPrefixCache(false); err == nil {
		t.Fatal("reset while a request holds blocks")
	}
	res, err := e.s.ResetPrefixCache(true)
	if err != nil || res.Preemptions != 1 || len(res.Events) != 1 || res.Events[0].Type != kvevents.TypeAllBlocksCleared {
		t.Fatalf("reset with reset_running: %+v, %v", res, err)
	}
	if l := e.s.Load(); l.Running != 0 || l.Waiting != 2 || e.s.NumCachedBlocks() != 0 {
		t.Fatalf("after the reset: %+v, %d cached", l, e.s.NumCachedBlocks())
	}
	e.step() // request 1 again
	if got := e.s.Restart(); !slices.Equal(got, []sched.ID{1, 2}) {
		t.Fatalf("restart dropped %v, want [1 2]", got)
	}
	if st := e.step(); !e.s.Idle() || e.s.NumCachedBlocks() != 0 || e.s.NumFreeBlocks() != cfg.Cache.NumBlocks-1 || len(st.Events) != 0 || st.Scheduled != 0 || st.Duration != 0 {
		t.Fatalf("after the restart: %+v, %d cached, %d free", st, e.s.NumCachedBlocks(), e.s.NumFreeBlocks())
	}
}

// TestAddRefuses: a request without a prompt or output budget, or with
// the id of one in the engine, is refused.
func TestAddRefuses(t *testing.T) {
	s := newScheduler(t, config())
	if err := s.Add(sched.Request{ID: 1, Prompt: prompt(1, 3), MaxTokens: 1}, 0); err != nil {
		t.Fatal(err)
	}
	for _, r := range []sched.Request{{ID: 1, Prompt: prompt(1, 3), MaxTokens: 1}, {ID: 2, MaxTokens: 1}, {ID: 3, Prompt: prompt(1, 3)}} {
		if err := s.Add(r, 0); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
	if _, err := sched.New(sched.Config{}); err == nil {
		t.Error("the zero config accepted")
	}
	if err := sched.DefaultConfig().Validate(); err != nil {
		t.Error(err)
	}
}

// TestQueuedAndPrefill: a request's last update carries vLLM's queued
// interval (arrival to the start of the step that first admitted it) and
// prefill interval (from there to its first token), which add up to its
// TTFT; a request queued behind another waits, one admitted at once does
// not, and a preemption does not move the first admission.
func TestQueuedAndPrefill(t *testing.T) {
	t.Run("queued behind another", func(t *testing.T) {
		cfg := config()
		cfg.MaxNumSeqs = 1 // B waits until A is done
		e := &engine{t: t, s: newScheduler(t, cfg), now: time.Minute}
		e.add(sched.Request{ID: 1, Prompt: prompt(1000, 300), MaxTokens: 3, IgnoreEOS: true}) // two chunks
		e.now += 7 * time.Millisecond                                                         // B arrives later, while nothing runs yet
		e.add(sched.Request{ID: 2, Prompt: prompt(2000, 40), MaxTokens: 2, IgnoreEOS: true})
		arrivalB := e.now
		first := map[sched.ID]sched.Update{}
		last := map[sched.ID]sched.Update{}
		var admittedB time.Duration
		for n := 0; len(last) < 2; n++ {
			if n > 20 {
				t.Fatal("not done in 20 steps")
			}
			start, running := e.now, e.s.Load().Running
			st := e.step()
			if running == 0 && admittedB == 0 && len(last) == 1 {
				admittedB = start // A left in the step before: B is admitted in this one
			}
			for _, u := range st.Updates {
				if u.First {
					first[u.ID] = u
				}
				if u.Finish != "" {
					last[u.ID] = u
				} else if u.Queued != 0 || u.Prefill != 0 {
					t.Fatalf("an update before the last carries intervals: %+v", u)
				}
			}
		}
		a, b := last[1], last[2]
		if a.Queued != 7*time.Millisecond || a.Prefill <= 0 {
			t.Fatalf("A: queued %v, prefill %v; want 7ms (the step began when B arrived), > 0", a.Queued, a.Prefill)
		}
		if b.Queued != admittedB-arrivalB || b.Queued <= first[1].TTFT-7*time.Millisecond {
			t.Fatalf("B: queued %v; want %v, from its arrival to the step after A's end", b.Queued, admittedB-arrivalB)
		}
		for id, u := range last {
			if u.Queued+u.Prefill != first[id].TTFT || u.Prefill <= 0 {
				t.Fatalf("request %d: queued %v + prefill %v, TTFT %v", id, u.Queued, u.Prefill, first[id].TTFT)
			}
		}
	})
	t.Run("preempted after its first token", func(t *testing.T) {
		cfg := config()
		cfg.Cache.NumBlocks = 4 // 3 usable blocks, as TestPreemptionFromBack
		cfg.Cache.BlockSize = 4
		e := &engine{t: t, s: newScheduler(t, cfg)}
		e.add(sched.Request{ID: 1, Prompt: prompt(100, 4), MaxTokens: 2, IgnoreEOS: true})
		e.add(sched.Request{ID: 2, Prompt: prompt(200, 4), MaxTokens: 3, IgnoreEOS: true})
		e.add(sched.Request{ID: 3, Prompt: prompt(300, 4), MaxTokens: 3, IgnoreEOS: true})
		st := e.step() // all three admitted at 0, each with its first token
		ttft := st.Updates[2].TTFT
		if st2 := e.step(); st2.Preemptions == 0 {
			t.Fatalf("the second step preempted nothing: %+v", st2)
		}
		ups, _ := e.untilDone(3, 50) // readmitted later
		u := ups[len(ups)-1]
		if u.Queued != 0 || u.Prefill != ttft {
			t.Fatalf("C: queued %v, prefill %v; want 0 and its TTFT %v (the first admission counts)", u.Queued, u.Prefill, ttft)
		}
	})
}
