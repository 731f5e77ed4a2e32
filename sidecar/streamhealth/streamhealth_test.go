package streamhealth

import (
	"sort"
	"strings"
	"testing"
	"time"
)

// step is one observation of a scenario, at a time offset from t0, and
// optionally the state Judge must return right after it.
type step struct {
	at time.Duration
	// One of:
	scrape  *Counters
	live    bool
	replay  bool
	partial *bool
	// judge: call Judge and compare with want (and want's reason words).
	judge bool
	want  State
	words []string
}

var t0 = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

// c is a scrape: computed tokens q (queries, no hits) with r finished
// requests and none in flight, 16-token blocks.
func c(q, r float64) *Counters {
	return &Counters{PrefixQueries: q, HaveQueries: true, Requests: r, HaveRequests: true, BlockSize: 16}
}

func yes() *bool { t := true; return &t }
func no() *bool  { f := false; return &f }

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func run(t *testing.T, cfg Config, steps []step) {
	t.Helper()
	j, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sort.SliceStable(steps, func(a, b int) bool { return steps[a].at < steps[b].at })
	for i, s := range steps {
		now := t0.Add(s.at)
		switch {
		case s.scrape != nil:
			j.Scraped(now, *s.scrape)
		case s.live:
			j.LiveBatch(now)
		case s.replay:
			j.ReplayedBatch(now)
		case s.partial != nil:
			j.SetPartial(now, *s.partial, "replay ring no longer holds the missing batches")
		}
		if !s.judge {
			continue
		}
		st := j.Judge(now)
		if st.State != s.want {
			t.Fatalf("step %d (at %v): state %s, want %s (%s)", i, s.at, st.State, s.want, st.Reason)
		}
		if st.Reason == "" {
			t.Fatalf("step %d: no reason", i)
		}
		for _, w := range s.words {
			if !strings.Contains(st.Reason, w) {
				t.Fatalf("step %d: reason %q lacks %q", i, st.Reason, w)
			}
		}
	}
}

// scrapes returns a scrape every 200 ms from `from` to `to` (inclusive),
// the counters given by f(i), each followed by a Judge expecting want
// (no Judge when want is 255).
func scrapes(from, to time.Duration, f func(i int) *Counters, want State) []step {
	var out []step
	for i, at := 0, from; at <= to; i, at = i+1, at+ms(200) {
		out = append(out, step{at: at, scrape: f(i), judge: want != 255, want: want})
	}
	return out
}

func cat(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestRules(t *testing.T) {
	connect, bind := DefaultConfig(), DefaultConfig()
	bind.Bind = true
	flat := func(int) *Counters { return c(1000, 10) }
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"unknown until evidence", connect, cat(
			[]step{{at: 0, judge: true, want: Unknown, words: []string{"not been scraped"}}},
			scrapes(0, 10*time.Second, flat, Unknown),
			[]step{{at: 10 * time.Second, judge: true, want: Unknown, words: []string{"no new block"}}},
		)},
		{"no prefix-cache counters: unknown", connect, cat(
			scrapes(0, 5*time.Second, func(i int) *Counters { return &Counters{PromptTokens: float64(i * 1000), BlockSize: 16} }, Unknown),
			[]step{{at: 5 * time.Second, judge: true, want: Unknown, words: []string{"exports no vllm:prefix_cache_queries_total"}}},
		)},
		{"a live batch is live at once", connect, []step{
			{at: 0, scrape: c(0, 0)},
			{at: ms(10), live: true, judge: true, want: Live},
		}},
		// The engine stores 10 blocks (160 tokens, one request) between
		// the scrapes at 1.0 and 1.2 s; nothing arrives: silent at
		// 1.0 + 2.5 s, not a nanosecond before.
		{"connect/connect: silent after the window, with the bind hint", connect, cat(
			scrapes(0, ms(1000), flat, Unknown),
			[]step{{at: ms(1200), scrape: c(1160, 11), judge: true, want: Unknown}},
			scrapes(ms(1400), ms(3400), func(int) *Counters { return c(1160, 11) }, Unknown),
			[]step{
				{at: ms(3500) - 1, judge: true, want: Unknown},
				{at: ms(3500), judge: true, want: Silent, words: []string{"at least 9 new blocks", "no event batch arrived", "--kv-events-mode bind", "wildcard"}},
			},
			scrapes(ms(3600), 10*time.Second, func(int) *Counters { return c(1160, 11) }, Silent),
		)},
		{"bind/bind: silent, with the connect hint", bind, cat(
			[]step{{at: 0, scrape: c(0, 0)}, {at: ms(200), scrape: c(160, 1)}},
			[]step{{at: ms(2500), judge: true, want: Silent, words: []string{"the sidecar binds", "--kv-events-mode connect"}}},
		)},
		{"replayed batches only: replay_only", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}, {at: ms(200), scrape: c(160, 1)}},
			[]step{{at: ms(1900), replay: true, judge: true, want: Unknown}},
			[]step{{at: ms(2500), judge: true, want: ReplayOnly, words: []string{"only through the replay socket", "--kv-events-mode bind"}}},
			// A busy engine, catch-ups every 2.1 s: replay_only throughout.
			scrapes(ms(2600), 20*time.Second, func(i int) *Counters { return c(160+float64(i)*320, 1+float64(i)*2) }, 255),
			[]step{
				{at: ms(4000), replay: true}, {at: ms(6100), replay: true}, {at: ms(8200), replay: true}, {at: ms(10300), replay: true},
				{at: ms(12400), replay: true}, {at: ms(14500), replay: true}, {at: ms(16600), replay: true}, {at: ms(18700), replay: true},
				{at: 21 * time.Second, judge: true, want: ReplayOnly},
			},
		)},
		{"a live batch a little before the counters move answers them", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}, {at: ms(150), live: true}},
			// The counters trail the events by more than a scrape.
			[]step{{at: ms(200), scrape: c(0, 0)}, {at: ms(400), scrape: c(160, 1)}},
			scrapes(ms(600), 6*time.Second, func(int) *Counters { return c(160, 1) }, Live),
		)},
		{"a live stream that stops: silent", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}, {at: ms(100), live: true}, {at: ms(200), scrape: c(160, 1), judge: true, want: Live}},
			scrapes(ms(400), 10*time.Second, func(int) *Counters { return c(160, 1) }, Live),
			[]step{{at: ms(10200), scrape: c(480, 2)}},
			[]step{{at: ms(12500) - 1, judge: true, want: Live}, {at: ms(12500), judge: true, want: Silent}},
		)},
		{"silent, then a live batch: live", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}, {at: ms(200), scrape: c(160, 1)}},
			[]step{{at: ms(2500), judge: true, want: Silent}, {at: ms(3000), live: true, judge: true, want: Live}},
		)},
		// A fully cached repeat prompt recomputes at most a block (the
		// last token is always recomputed): no evidence, however many.
		{"fully cached repeats are no evidence", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}},
			scrapes(ms(200), 20*time.Second, func(i int) *Counters {
				return c(float64(i+1)*5*16, float64(i+1)*5) // five requests a scrape, 16 tokens each
			}, Unknown),
		)},
		{"repeats in flight are no evidence either", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}},
			scrapes(ms(200), 20*time.Second, func(i int) *Counters {
				x := c(float64(i+1)*40*16, 0)
				x.InFlight = float64(i+1) * 40 // forty a scrape, none finished yet
				return x
			}, Unknown),
		)},
		{"without a request counter the raw difference counts", connect, cat(
			[]step{{at: 0, scrape: &Counters{HaveQueries: true, BlockSize: 16}}},
			[]step{{at: ms(200), scrape: &Counters{PrefixQueries: 32, HaveQueries: true, BlockSize: 16}}},
			[]step{{at: ms(2500), judge: true, want: Silent}},
		)},
		{"one new block is not enough", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}, {at: ms(200), scrape: c(33, 1)}}, // 33 − 16 = 17 tokens: one block
			scrapes(ms(400), 10*time.Second, func(int) *Counters { return c(33, 1) }, Unknown),
		)},
		{"hits are not computed tokens", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}},
			[]step{{at: ms(200), scrape: &Counters{PrefixQueries: 1600, PrefixHits: 1584, HaveQueries: true, Requests: 1, HaveRequests: true, BlockSize: 16}}},
			scrapes(ms(400), 10*time.Second, func(int) *Counters {
				return &Counters{PrefixQueries: 1600, PrefixHits: 1584, HaveQueries: true, Requests: 1, HaveRequests: true, BlockSize: 16}
			}, Unknown),
		)},
		// History before the sidecar started, then a long idle spell: the
		// window runs from the new activity, not from the first scrape.
		{"the baseline follows an idle engine", connect, cat(
			[]step{{at: 0, scrape: c(50000, 300)}},
			scrapes(ms(200), 60*time.Second, func(int) *Counters { return c(50000, 300) }, Unknown),
			[]step{{at: ms(60200), scrape: c(50160, 301), judge: true, want: Unknown}},
			[]step{{at: ms(62500) - 1, judge: true, want: Unknown}, {at: ms(62500), judge: true, want: Silent}},
		)},
		// Growth too slow to prove blocks within a window starts over.
		{"a trickle below the threshold per window is no evidence", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}},
			scrapes(ms(200), 30*time.Second, func(i int) *Counters { return c(float64(i+1)*2, 0) }, Unknown), // 10 tokens a second
		)},
		{"an engine restart (counters reset) is no evidence", connect, cat(
			[]step{{at: 0, scrape: c(50000, 300)}, {at: ms(200), scrape: c(0, 0)}},
			scrapes(ms(400), 5*time.Second, func(int) *Counters { return c(0, 0) }, Unknown),
		)},
		{"partial overrides, then gives way", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}, {at: ms(100), live: true}},
			[]step{{at: ms(200), partial: yes(), judge: true, want: Partial, words: []string{"lost for good", "replay ring"}}},
			[]step{{at: ms(300), live: true, judge: true, want: Partial}},
			[]step{{at: ms(400), partial: no(), judge: true, want: Live}},
		)},
		{"partial and silent: both named", connect, cat(
			[]step{{at: 0, scrape: c(0, 0)}, {at: ms(200), scrape: c(160, 1)}, {at: ms(300), partial: yes()}},
			[]step{{at: ms(2500), judge: true, want: Partial, words: []string{"lost for good", "the live stream is silent", "--kv-events-mode bind"}}},
			[]step{{at: ms(2600), partial: no(), judge: true, want: Silent}},
		)},
		{"a scrape without a block size judges nothing", connect, cat(
			[]step{{at: 0, scrape: &Counters{HaveQueries: true}}, {at: ms(200), scrape: &Counters{PrefixQueries: 1600, HaveQueries: true}}},
			[]step{{at: 5 * time.Second, judge: true, want: Unknown, words: []string{"block size"}}},
		)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { run(t, tc.cfg, tc.steps) })
	}
}

// TestReplayOnlyDoesNotFlap: a busy engine on a one-sided stream whose
// catch-ups come every 2.1 s (the idle check): once replay_only, never
// silent.
func TestReplayOnlyDoesNotFlap(t *testing.T) {
	j, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	nextReplay := ms(2100)
	seen := map[State]bool{}
	for at, i := time.Duration(0), 0; at < 60*time.Second; at, i = at+ms(50), i+1 {
		now := t0.Add(at)
		if at >= nextReplay {
			j.ReplayedBatch(now)
			nextReplay += ms(2100)
		}
		if i%4 == 0 {
			j.Scraped(now, *c(float64(i)*40, float64(i)/4))
		}
		st := j.Judge(now)
		seen[st.State] = true
		if at > 3*time.Second && st.State != ReplayOnly {
			t.Fatalf("at %v: %s (%s)", at, st.State, st.Reason)
		}
	}
	if seen[Silent] || seen[Live] {
		t.Fatalf("states seen: %v", seen)
	}
}

// TestSince: Since is when the state began; the initial unknown has none.
func TestSince(t *testing.T) {
	j, _ := New(DefaultConfig())
	if st := j.Judge(t0); !st.Since.IsZero() {
		t.Fatalf("unknown since %v", st.Since)
	}
	j.Scraped(t0, *c(0, 0))
	j.Scraped(t0.Add(ms(200)), *c(160, 1))
	if st := j.Judge(t0.Add(ms(2600))); st.State != Silent || !st.Since.Equal(t0.Add(ms(2600))) {
		t.Fatalf("%+v", st)
	}
	j.Scraped(t0.Add(ms(2800)), *c(160, 1))
	if st := j.Judge(t0.Add(ms(9000))); st.State != Silent || !st.Since.Equal(t0.Add(ms(2600))) {
		t.Fatalf("since moved: %+v", st)
	}
	j.SetPartial(t0.Add(10*time.Second), true, "x")
	j.SetPartial(t0.Add(11*time.Second), true, "y")
	if st := j.Judge(t0.Add(12 * time.Second)); st.State != Partial || !st.Since.Equal(t0.Add(10*time.Second)) || !strings.Contains(st.Reason, "y") {
		t.Fatalf("%+v", st)
	}
}

func TestNonFiniteCountersAreIgnored(t *testing.T) {
	for _, bad := range []float64{nan(), inf(), -1} {
		j, _ := New(DefaultConfig())
		j.Scraped(t0, *c(0, 0))
		j.Scraped(t0.Add(ms(200)), *c(bad, 1))
		j.Scraped(t0.Add(ms(400)), *c(160, 1))
		j.Scraped(t0.Add(ms(600)), *c(160, 1))
		// The bad scrape broke the baseline: the jump to 160 is measured
		// from the first good scrape after it.
		if st := j.Judge(t0.Add(10 * time.Second)); st.State != Unknown {
			t.Fatalf("%v: %+v", bad, st)
		}
	}
}

func TestStateNames(t *testing.T) {
	want := []string{"unknown", "live", "replay_only", "silent", "partial"}
	for i, s := range States() {
		if s.String() != want[i] {
			t.Errorf("%d: %q, want %q", i, s, want[i])
		}
	}
	if len(States()) != len(want) || State(99).String() != "state(99)" {
		t.Fatal(States())
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{}); err == nil || !strings.Contains(err.Error(), "window") || !strings.Contains(err.Error(), "slack") || !strings.Contains(err.Error(), "min new blocks") {
		t.Fatalf("the zero config: %v", err)
	}
	for _, f := range []func(*Config){
		func(c *Config) { c.Window = -time.Second },
		func(c *Config) { c.Slack = 0 },
		func(c *Config) { c.MinNewBlocks = 0 },
	} {
		cfg := DefaultConfig()
		f(&cfg)
		if cfg.Validate() == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}
