package peers

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

var sglT0 = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

// sglNew builds a policy with the defaults, changed by edit.
func sglNew(t *testing.T, edit func(*SGLangConfig)) *SGLangPolicy {
	t.Helper()
	c := DefaultSGLangConfig()
	if edit != nil {
		edit(&c)
	}
	p, err := NewSGLang(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// sglCands makes healthy candidates; an ID ending in "!" is unhealthy
// (the "!" dropped).
func sglCands(ids ...string) []Candidate {
	out := make([]Candidate, len(ids))
	for i, id := range ids {
		name, sick := strings.CutSuffix(id, "!")
		out[i] = Candidate{ID: name, Healthy: !sick}
	}
	return out
}

func sglReq(text string) *Request { return &Request{Model: "m", Text: text} }

// sglSend dispatches text to endpoint at now n times (load +n); empty
// text books load without touching the tree.
func sglSend(p *SGLangPolicy, endpoint, text string, n int, now time.Time) []Ticket {
	var ts []Ticket
	for range n {
		ts = append(ts, p.Dispatched(sglReq(text), endpoint, now))
	}
	return ts
}

// sglFinish sends and ends n requests on endpoint: processed +n, load 0.
func sglFinish(p *SGLangPolicy, endpoint string, n int) {
	for _, tk := range sglSend(p, endpoint, "", n, sglT0) {
		p.Done(tk, sglT0)
	}
}

func sglIDs(c []Candidate, ch Choice) string {
	if ch.Index < 0 {
		return "-"
	}
	return c[ch.Index].ID
}

func TestSGLangConfig(t *testing.T) {
	c := DefaultSGLangConfig()
	want := SGLangConfig{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5,
		EvictionInterval: 120 * time.Second, MaxTreeSize: 67108864}
	if c != want {
		t.Errorf("defaults %+v, want %+v", c, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
	for name, edit := range map[string]func(*SGLangConfig){
		"zero value":        func(c *SGLangConfig) { *c = SGLangConfig{} },
		"threshold below 0": func(c *SGLangConfig) { c.CacheThreshold = -0.1 },
		"threshold above 1": func(c *SGLangConfig) { c.CacheThreshold = 1.1 },
		"threshold NaN":     func(c *SGLangConfig) { c.CacheThreshold = math.NaN() },
		"negative abs":      func(c *SGLangConfig) { c.BalanceAbsThreshold = -1 },
		"zero rel":          func(c *SGLangConfig) { c.BalanceRelThreshold = 0 },
		"infinite rel":      func(c *SGLangConfig) { c.BalanceRelThreshold = math.Inf(1) },
		"NaN rel":           func(c *SGLangConfig) { c.BalanceRelThreshold = math.NaN() },
		"zero interval":     func(c *SGLangConfig) { c.EvictionInterval = 0 },
		"zero tree size":    func(c *SGLangConfig) { c.MaxTreeSize = 0 },
	} {
		c := DefaultSGLangConfig()
		edit(&c)
		if c.Validate() == nil {
			t.Errorf("%s: valid", name)
		}
		if p, err := NewSGLang(c); err == nil || p != nil {
			t.Errorf("%s: NewSGLang accepted it", name)
		}
	}
	if p := sglNew(t, nil); p.Name() != SGLang || p.Name() != "sglang" {
		t.Errorf("name %q", p.Name())
	}
}

// TestSGLangMatchThreshold: the cache is followed only when the match
// rate, in runes, exceeds 0.3; A holds the text (and so is busier), B is
// the min-load worker.
func TestSGLangMatchThreshold(t *testing.T) {
	for _, tc := range []struct {
		name, stored, query, want, reason string
	}{
		{"3 of 10 is not over 0.3", "abc", "abcdefghij", "B", "min_load"},
		{"4 of 10 is", "abcd", "abcdefghij", "A", "cache_hit"},
		// In bytes 9 of 16 would be over 0.3: the rate counts runes.
		{"3 of 10 runes, multibyte", "日本語", "日本語abcdefg", "B", "min_load"},
		{"4 of 10 runes, multibyte", "日本語a", "日本語abcdefg", "A", "cache_hit"},
		{"full match", "abcdefghij", "abcdefghij", "A", "cache_hit"},
		{"no match", "abcdefghij", "zzz", "B", "min_load"},
		{"empty text", "abcdefghij", "", "B", "min_load"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := sglNew(t, nil)
			sglSend(p, "A", tc.stored, 1, sglT0)
			c := sglCands("A", "B")
			ch := p.Pick(sglReq(tc.query), c, 0, sglT0)
			if sglIDs(c, ch) != tc.want || ch.Reason != tc.reason {
				t.Errorf("picked %s (%s), want %s (%s)", sglIDs(c, ch), ch.Reason, tc.want, tc.reason)
			}
		})
	}
}

// TestSGLangDeepestNode: the candidates are the tenants of the deepest
// matched node, and among them the least loaded wins, even when a worker
// outside them is less loaded still.
func TestSGLangDeepestNode(t *testing.T) {
	p := sglNew(t, nil)
	sys := "You are a helpful assistant. "
	sglSend(p, "A", sys+"Tell me about alpha", 3, sglT0)
	sglSend(p, "B", sys+"Tell me about beta", 2, sglT0)
	sglSend(p, "C", sys+"What is gamma", 1, sglT0)
	c := sglCands("A", "B", "C", "D")
	for _, tc := range []struct{ query, want string }{
		{sys + "Tell me about alphabets", "A"},  // A's leaf: A alone, load 3
		{sys + "Tell me about al", "A"},         // partway down A's edge
		{sys + "Tell me about gamma", "B"},      // A,B's node: B (2) over A (3)
		{sys + "Tell me about", "B"},            // inside A,B's edge
		{sys + "What is gamma rays?", "C"},      // C's leaf
		{sys + "Something else entirely", "C"},  // the shared system prompt: A,B,C: C (1)
		{"Nothing in common at all, none", "D"}, // no match: min-load, D (0)
	} {
		if ch := p.Pick(sglReq(tc.query), c, 7, sglT0); sglIDs(c, ch) != tc.want {
			t.Errorf("%q: picked %s (%s), want %s", tc.query, sglIDs(c, ch), ch.Reason, tc.want)
		}
	}
}

// TestSGLangRandomTies: equal loads among the node's tenants are broken
// by Rand from Pick's rnd: the same rnd, the same pick; over many, each
// tenant about a third of the time; never a worker that is no tenant.
func TestSGLangRandomTies(t *testing.T) {
	p := sglNew(t, nil)
	text := "shared prompt text"
	for _, id := range []string{"A", "C", "D"} {
		sglSend(p, id, text, 1, sglT0)
	}
	sglSend(p, "E", text, 2, sglT0) // a tenant, but busier
	c := sglCands("A", "B", "C", "D", "E")
	ties := []int{0, 2, 3}
	counts := map[string]int{}
	for rnd := range uint64(3000) {
		ch := p.Pick(sglReq(text), c, rnd, sglT0)
		if want := ties[NewRand(rnd).IntN(len(ties))]; ch.Index != want || ch.Reason != "cache_hit" {
			t.Fatalf("rnd %d: picked %d (%s), want %d", rnd, ch.Index, ch.Reason, want)
		}
		if again := p.Pick(sglReq(text), c, rnd, sglT0); again.Index != ch.Index {
			t.Fatalf("rnd %d: %d then %d", rnd, ch.Index, again.Index)
		}
		counts[c[ch.Index].ID]++
	}
	for _, id := range []string{"A", "C", "D"} {
		if counts[id] < 900 || counts[id] > 1100 {
			t.Errorf("%s picked %d of 3000 times: %v", id, counts[id], counts)
		}
	}
}

// TestSGLangSpillGate: the cache's choice A gives way to the min-load
// worker only when its load exceeds both 1.5 × the healthy mean and the
// mean + 64; each alone is not enough. B and C are no tenants.
func TestSGLangSpillGate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		a, b, c   int
		cHealthy  bool
		want, why string
	}{
		{"both exceeded", 200, 0, 0, true, "B", "spill"}, // mean 66.7: 100, 130.7
		{"min-load is the less processed", 200, 1, 1, true, "C", "spill"},
		{"rel only", 60, 0, 0, true, "A", "cache_hit"},              // mean 20: 30 < 60 ≤ 84
		{"abs only", 300, 200, 200, true, "A", "cache_hit"},         // mean 233.3: 297.3 < 300 ≤ 350
		{"abs at its bound", 96, 0, 0, true, "A", "cache_hit"},      // mean 32: 48, 96 = 96
		{"rel at its bound", 300, 150, 150, true, "A", "cache_hit"}, // 1.5 × 200 = 300
		{"just over both", 97, 0, 0, true, "B", "spill"},
		// With C (0) in the mean it would spill (mean 33.3: 50, 97.3).
		{"unhealthy out of the mean", 100, 0, 0, false, "A", "cache_hit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := sglNew(t, nil)
			text := "the cached conversation"
			sglSend(p, "A", text, 1, sglT0)
			sglSend(p, "A", "", tc.a-1, sglT0)
			sglSend(p, "B", "", tc.b, sglT0)
			sglSend(p, "C", "", tc.c, sglT0)
			if tc.name == "min-load is the less processed" {
				sglFinish(p, "B", 1) // B has processed one more: C wins the tie
			}
			c := sglCands("A", "B", "C")
			c[2].Healthy = tc.cHealthy
			ch := p.Pick(sglReq(text), c, 0, sglT0)
			if sglIDs(c, ch) != tc.want || ch.Reason != tc.why {
				t.Errorf("picked %s (%s), want %s (%s); scores %v", sglIDs(c, ch), ch.Reason, tc.want, tc.why, ch.Scores)
			}
		})
	}
}

// TestSGLangMinLoadOrder: the min-load worker is the least (load,
// processed, index) among the healthy ones.
func TestSGLangMinLoadOrder(t *testing.T) {
	type w struct {
		id              string
		load, processed int
	}
	for _, tc := range []struct {
		name    string
		workers []w
		want    string
	}{
		{"load first", []w{{"A", 2, 0}, {"B", 1, 9}, {"C", 3, 0}}, "B"},
		{"then processed", []w{{"A", 1, 5}, {"B", 1, 3}, {"C", 1, 4}}, "B"},
		{"then index", []w{{"A", 1, 2}, {"B", 0, 3}, {"C", 0, 3}}, "B"},
		{"index, all equal", []w{{"C", 0, 0}, {"A", 0, 0}, {"B", 0, 0}}, "C"},
		{"unhealthy skipped", []w{{"A!", 0, 0}, {"B", 1, 0}, {"C", 1, 1}}, "B"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := sglNew(t, nil)
			var ids []string
			for _, x := range tc.workers {
				ids = append(ids, x.id)
				id := strings.TrimSuffix(x.id, "!")
				sglFinish(p, id, x.processed)
				sglSend(p, id, "", x.load, sglT0)
			}
			c := sglCands(ids...)
			for rnd := range uint64(20) {
				ch := p.Pick(sglReq("no tree holds this"), c, rnd, sglT0)
				if sglIDs(c, ch) != tc.want || ch.Reason != "min_load" {
					t.Fatalf("picked %s (%s), want %s", sglIDs(c, ch), ch.Reason, tc.want)
				}
			}
		})
	}
}

// TestSGLangHealth: an unhealthy tenant is never chosen, even as the only
// owner of a full match; none healthy gives -1.
func TestSGLangHealth(t *testing.T) {
	p := sglNew(t, nil)
	text := "a conversation only A has seen"
	sglSend(p, "A", text, 1, sglT0)
	sglSend(p, "B", "", 5, sglT0)
	c := sglCands("A!", "B", "C!")
	for rnd := range uint64(50) {
		if ch := p.Pick(sglReq(text), c, rnd, sglT0); sglIDs(c, ch) != "B" || ch.Reason != "min_load" {
			t.Fatalf("picked %s (%s), want B (min_load)", sglIDs(c, ch), ch.Reason)
		}
	}
	ch := p.Pick(sglReq(text), sglCands("A!", "B!"), 0, sglT0)
	if ch.Index != -1 || ch.Reason != "none_healthy" || !slices.Equal(ch.Scores, []float64{0, 0}) {
		t.Errorf("none healthy: %+v", ch)
	}
	if ch := p.Pick(sglReq(text), nil, 0, sglT0); ch.Index != -1 || ch.Reason != "none_healthy" {
		t.Errorf("no candidates: %+v", ch)
	}
}

// TestSGLangLoadBookkeeping: Dispatched +1, Done -1 and processed +1,
// FirstChunk and FirstToken nothing; an unknown or repeated Done is
// ignored. Scores are the loads, 0 for the unhealthy.
func TestSGLangLoadBookkeeping(t *testing.T) {
	p := sglNew(t, nil)
	c := sglCands("A", "B", "C!")
	scores := func() []float64 { return p.Pick(sglReq(""), c, 0, sglT0).Scores }
	ta := sglSend(p, "A", "x", 2, sglT0)
	tb := sglSend(p, "B", "", 1, sglT0)
	sglSend(p, "C", "", 4, sglT0)
	if got := scores(); !slices.Equal(got, []float64{2, 1, 0}) {
		t.Errorf("after dispatch: %v", got)
	}
	p.FirstChunk(ta[0], sglT0)
	p.FirstToken(ta[0], sglT0)
	if got := scores(); !slices.Equal(got, []float64{2, 1, 0}) {
		t.Errorf("after FirstChunk and FirstToken: %v", got)
	}
	p.Done(ta[0], sglT0)
	p.Done(ta[0], sglT0)
	p.Done(Ticket(999), sglT0)
	if got := scores(); !slices.Equal(got, []float64{1, 1, 0}) {
		t.Errorf("after Done: %v", got)
	}
	if p.processed["A"] != 1 || p.processed["B"] != 0 {
		t.Errorf("processed %v", p.processed)
	}
	p.Done(ta[1], sglT0)
	p.Done(tb[0], sglT0)
	if got := scores(); !slices.Equal(got, []float64{0, 0, 0}) || p.processed["A"] != 2 || p.processed["B"] != 1 {
		t.Errorf("after all Done: %v, processed %v", got, p.processed)
	}
	if ch := p.Pick(sglReq(""), c, 0, sglT0); sglIDs(c, ch) != "B" {
		t.Errorf("equal loads: picked %s, want B (fewer processed)", sglIDs(c, ch))
	}
}

// TestSGLangEviction: trees are brought under MaxTreeSize at most once
// per interval, at Pick or Dispatched, by dropping the least recently
// used tenant leaves across tenants; each model has its own budget.
func TestSGLangEviction(t *testing.T) {
	p := sglNew(t, func(c *SGLangConfig) { c.MaxTreeSize = 10 })
	at := func(s int) time.Time { return sglT0.Add(time.Duration(s) * time.Second) }
	c := sglCands("A", "B")
	chars := func(model, tenant string) int {
		if tr := p.trees[model]; tr != nil {
			return tr.TenantChars(tenant)
		}
		return 0
	}
	p.Pick(sglReq(""), c, 0, at(0)) // the clock starts
	p.Dispatched(&Request{Model: "m", Text: "0123456789"}, "A", at(1))
	p.Dispatched(&Request{Model: "m", Text: "abcdefghij"}, "B", at(2))
	p.Dispatched(&Request{Model: "n", Text: "0123456789"}, "A", at(3))
	p.Pick(sglReq(""), c, 0, at(119))
	if chars("m", "A") != 10 || chars("m", "B") != 10 {
		t.Fatalf("evicted before the interval: A %d B %d", chars("m", "A"), chars("m", "B"))
	}
	p.Pick(sglReq(""), c, 0, at(120))
	if chars("m", "A") != 0 || chars("m", "B") != 10 || chars("n", "A") != 10 {
		t.Fatalf("at the interval: m A %d B %d, n A %d; want 0 10 10", chars("m", "A"), chars("m", "B"), chars("n", "A"))
	}
	// A writes two texts; B then refreshes its own: A's are the older.
	p.Dispatched(&Request{Model: "m", Text: "ABCDEFGHIJ"}, "A", at(130))
	p.Dispatched(&Request{Model: "m", Text: "KLMNO"}, "A", at(200))
	p.Dispatched(&Request{Model: "m", Text: "abcdefghij"}, "B", at(201))
	if got := p.trees["m"].Total(); got != 25 {
		t.Fatalf("total %d before the next run, want 25", got)
	}
	p.Dispatched(&Request{Model: "n", Text: ""}, "B", at(240)) // Dispatched runs it too
	if chars("m", "A") != 0 || chars("m", "B") != 10 {
		t.Errorf("second run: A %d B %d, want 0 10 (A's leaves, at 130 and 200, were the oldest)",
			chars("m", "A"), chars("m", "B"))
	}
	if ch := p.Pick(&Request{Model: "m", Text: "abcdefghij"}, c, 0, at(241)); sglIDs(c, ch) != "B" || ch.Reason != "cache_hit" {
		t.Errorf("B's text after eviction: %s (%s)", sglIDs(c, ch), ch.Reason)
	}
}

// TestSGLangEvictionBudgetPerModel: a model under budget keeps all.
func TestSGLangEvictionBudgetPerModel(t *testing.T) {
	p := sglNew(t, func(c *SGLangConfig) { c.MaxTreeSize = 12; c.EvictionInterval = time.Second })
	p.Dispatched(&Request{Model: "m", Text: "0123456789"}, "A", sglT0)
	p.Dispatched(&Request{Model: "m", Text: "abc"}, "B", sglT0.Add(time.Millisecond))
	p.Dispatched(&Request{Model: "n", Text: "0123456789"}, "A", sglT0)
	p.Dispatched(&Request{Model: "n", Text: "ab"}, "B", sglT0)
	p.Pick(sglReq(""), nil, 0, sglT0.Add(time.Second))
	if m, n := p.trees["m"], p.trees["n"]; m.TenantChars("A") != 0 || m.TenantChars("B") != 3 || n.Total() != 12 {
		t.Errorf("m A %d B %d, n total %d; want 0 3 12", m.TenantChars("A"), m.TenantChars("B"), n.Total())
	}
}

// TestSGLangModelsIsolated: a text cached for one model is no match for
// another.
func TestSGLangModelsIsolated(t *testing.T) {
	p := sglNew(t, nil)
	text := "the same words, another model"
	p.Dispatched(&Request{Model: "m1", Text: text}, "A", sglT0)
	c := sglCands("A", "B")
	if ch := p.Pick(&Request{Model: "m1", Text: text}, c, 0, sglT0); sglIDs(c, ch) != "A" || ch.Reason != "cache_hit" {
		t.Errorf("m1: %s (%s)", sglIDs(c, ch), ch.Reason)
	}
	if ch := p.Pick(&Request{Model: "m2", Text: text}, c, 0, sglT0); sglIDs(c, ch) != "B" || ch.Reason != "min_load" {
		t.Errorf("m2: %s (%s)", sglIDs(c, ch), ch.Reason)
	}
}

// TestSGLangForget: a forgotten endpoint leaves every tree and its
// counters; its old tickets no longer count against it.
func TestSGLangForget(t *testing.T) {
	p := sglNew(t, nil)
	shared := "a long shared system prompt, "
	old := sglSend(p, "A", shared+"and A's question", 2, sglT0)
	p.Dispatched(&Request{Model: "n", Text: shared}, "A", sglT0)
	sglFinish(p, "A", 3)
	sglSend(p, "B", shared+"and B's", 1, sglT0)
	p.Forget("A")
	for model, tr := range p.trees {
		if tr.TenantChars("A") != 0 {
			t.Errorf("%s: A still owns %d", model, tr.TenantChars("A"))
		}
		if err := ctCheck(tr); err != nil {
			t.Errorf("%s: %v", model, err)
		}
	}
	if _, ok := p.trees["n"]; ok {
		t.Errorf("model n's tree, now empty, kept")
	}
	if p.load["A"] != 0 || p.processed["A"] != 0 {
		t.Errorf("A's counters: load %d processed %d", p.load["A"], p.processed["A"])
	}
	if got := p.trees["m"].TenantChars("B"); got != len(shared+"and B's") {
		t.Errorf("B owns %d", got)
	}
	c := sglCands("A", "B")
	sglSend(p, "A", "", 1, sglT0) // A is back
	p.Done(old[0], sglT0)         // a ticket from before: ignored
	if ch := p.Pick(sglReq(shared+"and A's question"), c, 0, sglT0); !slices.Equal(ch.Scores, []float64{1, 1}) || sglIDs(c, ch) != "B" || ch.Reason != "cache_hit" {
		t.Errorf("after Forget: %s (%s), scores %v", sglIDs(c, ch), ch.Reason, ch.Scores)
	}
}

// TestSGLangRandomRun: a long random run of the whole lifecycle never
// chooses an unhealthy candidate, keeps the trees consistent and the
// loads equal to the open bookings.
func TestSGLangRandomRun(t *testing.T) {
	p := sglNew(t, func(c *SGLangConfig) { c.MaxTreeSize = 200; c.EvictionInterval = 10 * time.Second })
	r := NewRand(42)
	ids := []string{"A", "B", "C", "D"}
	words := []string{"alpha ", "beta ", "γάμμα ", "デルタ ", "e "}
	var open []Ticket
	now := sglT0
	for step := range 5000 {
		now = now.Add(time.Duration(r.IntN(2000)) * time.Millisecond)
		var sb strings.Builder
		for range r.IntN(12) {
			sb.WriteString(words[r.IntN(len(words))])
		}
		req := &Request{Model: []string{"m", "n"}[r.IntN(2)], Text: sb.String()}
		c := sglCands(ids...)
		for i := range c {
			c[i].Healthy = r.IntN(4) > 0
		}
		ch := p.Pick(req, c, r.Uint64(), now)
		switch {
		case ch.Index >= 0 && !c[ch.Index].Healthy:
			t.Fatalf("step %d: chose unhealthy %s", step, c[ch.Index].ID)
		case ch.Index >= 0:
			open = append(open, p.Dispatched(req, c[ch.Index].ID, now))
		}
		for len(open) > 0 && r.IntN(3) == 0 {
			i := r.IntN(len(open))
			p.Done(open[i], now)
			open = slices.Delete(open, i, i+1)
		}
		if r.IntN(500) == 0 {
			p.Forget(ids[r.IntN(len(ids))])
		}
	}
	for model, tr := range p.trees {
		if err := ctCheck(tr); err != nil {
			t.Fatalf("%s: %v", model, err)
		}
	}
	total := 0
	for _, n := range p.load {
		total += n
	}
	if total != len(p.bookings) {
		t.Errorf("loads sum to %d, %d bookings open", total, len(p.bookings))
	}
}
