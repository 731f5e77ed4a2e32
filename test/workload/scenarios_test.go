package workload_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/workload"
)

// fixedAnswer is what the test driver answers every request with.
const fixedAnswer = "a fixed answer from the test driver"

// sentRequest is one request the test driver sent.
type sentRequest struct {
	session int
	start   time.Duration // the session's start
	wait    time.Duration // the wait Next returned before it
	req     workload.Request
	// With analyze: the decoded body, the prompt's rendered length and
	// its full blocks' chained keys (the first block's first).
	body   sentBody
	prompt int
	keys   []uint64
}

// drivePlan walks a plan as a driver would, answering every request OK with
// fixedAnswer, and returns the requests session by session, each
// session's in order; analyze renders every prompt (the answers then
// carry its length) and keys its blocks.
func drivePlan(t testing.TB, p workload.Plan, analyze bool) []sentRequest {
	t.Helper()
	var out []sentRequest
	for i, ps := range p.Sessions {
		if ps.After != nil {
			t.Fatalf("session %d: an After dependency, which these scenarios do not use", i)
		}
		var prev *workload.Answer
		memo := map[sentMessage][]uint32{}
		for n := 0; ; n++ {
			req, wait, done := ps.Session.Next(prev)
			if done {
				break
			}
			if n > 1000 {
				t.Fatalf("session %d: more than 1000 requests", i)
			}
			s := sentRequest{session: i, start: ps.Start, wait: wait, req: req}
			if analyze {
				s.body = decodeBody(t, req.Body)
				toks := renderPrompt(t, s.body, memo)
				s.prompt = len(toks)
				s.keys = chainedBlockKeys(s.body.CacheSalt, toks)
			}
			out = append(out, s)
			prev = &workload.Answer{Endpoint: fmt.Sprintf("engine-%d", i%8), Text: fixedAnswer, PromptTokens: s.prompt, OK: true}
		}
		if _, _, done := ps.Session.Next(prev); !done {
			t.Fatalf("session %d: a request after done", i)
		}
	}
	return out
}

// sentMessage is a chat message as these scenarios send them: text only.
type sentMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// sentBody is what the tests read of a request body.
type sentBody struct {
	Model         string        `json:"model"`
	Prompt        any           `json:"prompt"` // a string or token ids (numbers)
	Messages      []sentMessage `json:"messages"`
	MaxTokens     int           `json:"max_tokens"`
	IgnoreEOS     bool          `json:"ignore_eos"`
	CacheSalt     string        `json:"cache_salt"`
	Stream        bool          `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func decodeBody(t testing.TB, raw []byte) sentBody {
	t.Helper()
	var b sentBody
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatalf("body: %v", err)
	}
	return b
}

// renderPrompt renders a body's prompt as the simulated engine does: a
// text prompt tokenized, token ids as they are, chat messages through the
// template with the generation prompt (each message renders on its own,
// so memo keeps a session's messages rendered).
func renderPrompt(t testing.TB, b sentBody, memo map[sentMessage][]uint32) []uint32 {
	t.Helper()
	switch {
	case len(b.Messages) > 0:
		var toks []uint32
		for _, m := range b.Messages {
			r, ok := memo[m]
			if !ok {
				var err error
				if r, err = chat.Render([]chat.Message{{Role: m.Role, Content: m.Content}}, nil, chat.RenderOptions{}); err != nil {
					t.Fatal(err)
				}
				memo[m] = r
			}
			toks = append(toks, r...)
		}
		gen, err := chat.Render(nil, nil, chat.RenderOptions{AddGenerationPrompt: true})
		if err != nil {
			t.Fatal(err)
		}
		return append(toks, gen...)
	default:
		switch p := b.Prompt.(type) {
		case string:
			return chat.Encode(p)
		case []any:
			toks := make([]uint32, len(p))
			for i, v := range p {
				f, ok := v.(float64)
				if !ok || f < 0 || f != math.Trunc(f) || f >= 1<<32 {
					t.Fatalf("prompt token %d: %v", i, v)
				}
				toks[i] = uint32(f)
			}
			return toks
		}
		t.Fatalf("prompt %T", b.Prompt)
		return nil
	}
}

// chainedBlockKeys are the chained keys of the full blocks of a prompt under
// salt (FNV-1a over the salt, then each token).
func chainedBlockKeys(salt string, toks []uint32) []uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for i := 0; i < len(salt); i++ {
		h = (h ^ uint64(salt[i])) * prime
	}
	keys := make([]uint64, 0, len(toks)/simBlockTokens)
	for k := 0; k+simBlockTokens <= len(toks); k += simBlockTokens {
		for _, tok := range toks[k : k+simBlockTokens] {
			h = (h ^ uint64(tok)) * prime
		}
		keys = append(keys, h)
	}
	return keys
}

// planShape is a plan's generated statistics.
type planShape struct {
	sessions, requests, convs  int
	meanPrompt                 float64
	minPrompt, p90, maxPrompt  int
	prefixes                   int     // distinct first blocks (16 tokens, with the salt)
	shared                     float64 // share of requests whose first block another request has too
	rate                       float64 // sessions started a second
	meanOutput                 float64 // max_tokens
	workingSet, reused         int     // distinct full blocks × 16 tokens; those in more than one request
	maxPromptPlusOutput, turns int     // the longest prompt with its output; the most turns of a conversation
}

// simBlockTokens is the simulated engines' block size.
const simBlockTokens = 16

// measurePlan drives p and computes its shape; every body is checked for the
// fields every scenario sends.
func measurePlan(t testing.TB, p workload.Plan) (planShape, []sentRequest) {
	t.Helper()
	reqs := drivePlan(t, p, true)
	s := planShape{sessions: len(p.Sessions), requests: len(reqs), minPrompt: math.MaxInt}
	firsts := map[uint64]int{}
	blocks := map[uint64]int{}
	convs := map[int]bool{}
	var lens []int
	for _, r := range reqs {
		b := r.body
		if b.Model != "Qwen/Qwen3-0.6B" || !b.Stream || !b.StreamOptions.IncludeUsage || b.MaxTokens < 1 {
			t.Fatalf("body: model %q, stream %v, include_usage %v, max_tokens %d", b.Model, b.Stream, b.StreamOptions.IncludeUsage, b.MaxTokens)
		}
		if (len(b.Messages) > 0) != (r.req.Path == "/v1/chat/completions") || (b.Prompt != nil) != (r.req.Path == "/v1/completions") {
			t.Fatalf("path %s for a body with messages %v, prompt %v", r.req.Path, len(b.Messages) > 0, b.Prompt != nil)
		}
		lens = append(lens, r.prompt)
		s.meanPrompt += float64(r.prompt)
		s.minPrompt, s.maxPrompt = min(s.minPrompt, r.prompt), max(s.maxPrompt, r.prompt)
		s.maxPromptPlusOutput = max(s.maxPromptPlusOutput, r.prompt+b.MaxTokens)
		s.meanOutput += float64(b.MaxTokens)
		s.turns = max(s.turns, r.req.Turn)
		convs[r.req.Conversation] = true
		if len(r.keys) > 0 {
			firsts[r.keys[0]]++
		}
		for _, k := range r.keys {
			blocks[k]++
		}
	}
	s.convs, s.prefixes = len(convs), len(firsts)
	for _, n := range blocks {
		s.workingSet += simBlockTokens
		if n > 1 {
			s.reused += simBlockTokens
		}
	}
	if n := float64(len(reqs)); n > 0 {
		s.meanPrompt /= n
		s.meanOutput /= n
		slices.Sort(lens)
		s.p90 = lens[int(0.9*n)]
		shared := 0
		for _, r := range reqs {
			if len(r.keys) > 0 && firsts[r.keys[0]] > 1 {
				shared++
			}
		}
		s.shared = float64(shared) / n
	}
	if n := len(p.Sessions); n > 1 {
		starts := make([]time.Duration, n)
		for i, ps := range p.Sessions {
			starts[i] = ps.Start
		}
		slices.Sort(starts)
		s.rate = float64(n-1) / (starts[n-1] - starts[0]).Seconds()
	}
	return s, reqs
}

func (s planShape) String() string {
	return fmt.Sprintf("sessions %d, requests %d, conversations %d (≤ %d turns), prompt mean %.0f [%d, p90 %d, %d], distinct first blocks %d, shared %.1f%%, %.2f sessions/s, output mean %.1f, working set %d tokens (%d reused)",
		s.sessions, s.requests, s.convs, s.turns, s.meanPrompt, s.minPrompt, s.p90, s.maxPrompt, s.prefixes, 100*s.shared, s.rate, s.meanOutput, s.workingSet, s.reused)
}

// withinFrac reports whether got is within frac of want.
func withinFrac(got, want, frac float64) bool { return math.Abs(got-want) <= frac*math.Abs(want) }

// planDigest fingerprints a plan's driven requests: starts, waits, labels and
// sentBody bytes, in order.
func planDigest(reqs []sentRequest) [32]byte {
	h := sha256.New()
	for _, r := range reqs {
		fmt.Fprintf(h, "%d %d %d %s %s %d %d %q %d\n", r.session, r.start, r.wait, r.req.Path, r.req.Tenant, r.req.Conversation, r.req.Turn, r.req.Prev, len(r.req.Body))
		h.Write(r.req.Body)
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// syntheticScenarios are the scenarios without a trace file, at their defaults.
func syntheticScenarios() []workload.Scenario {
	return []workload.Scenario{workload.B2BSaaS{}, workload.HotPrefix{}, workload.CodingAgent{}, workload.UniformPool{},
		workload.DocQA{}, workload.HotSet{}, workload.TieredEviction{}}
}

// smallScenarios are the synthetic scenarios with fewer requests (as fast under
// the race detector), for the checks that need no full run.
func smallScenarios() []workload.Scenario {
	return []workload.Scenario{workload.B2BSaaS{Requests: 300}, workload.HotPrefix{Requests: 300}, workload.CodingAgent{Conversations: 40}, workload.UniformPool{Requests: 300},
		workload.DocQA{Conversations: 20}, workload.HotSet{Requests: 300}, workload.TieredEviction{Requests: 300, Groups: 40}}
}

// TestShapes draws each synthetic scenario at seed 1, rate 1 and checks
// its generated statistics against the shape its doc comment states.
func TestShapes(t *testing.T) {
	type want struct {
		requests                [2]int  // bounds
		meanPrompt              float64 // ± 5%
		minPrompt, maxPrompt    [2]int  // bounds
		prefixes                [2]int
		shared                  [2]float64
		rate                    float64 // ± 10%
		meanOutput              float64 // ± 10%
		kvPerEngine, kvPerFleet [2]float64
		// wsPerFleet and wsPerFleetCPU bound the working set (every
		// distinct block) against the fleet's GPU and CPU tiers.
		wsPerFleet, wsPerFleetCPU [2]float64
		convs                     int
		sessions                  int
		checkTurns                bool
		turns                     int // when set, the most turns of a conversation
	}
	for _, c := range []struct {
		sc   workload.Scenario
		want want
	}{
		// 150 × 5 prompts of ≈ 3,600 tokens; the prompts' blocks 3.5× an
		// engine, 0.44× the fleet; 20 a second; 100 out.
		{workload.B2BSaaS{}, want{sessions: 3000, requests: [2]int{3000, 3000}, meanPrompt: 3615, minPrompt: [2]int{3590, 3650}, maxPrompt: [2]int{3590, 3650},
			prefixes: [2]int{150, 150}, shared: [2]float64{1, 1}, rate: 20, meanOutput: 100, convs: 150,
			kvPerEngine: [2]float64{3.2, 3.8}, kvPerFleet: [2]float64{0.4, 0.48}}},
		// 32 prefixes of 8,000 plus 128–384; 30 a second; 128 out; the
		// prefixes' blocks 2.5× an engine (the suffixes add 3,000 × 256).
		{workload.HotPrefix{}, want{sessions: 3000, requests: [2]int{3000, 3000}, meanPrompt: 8266, minPrompt: [2]int{8130, 8160}, maxPrompt: [2]int{8390, 8420},
			prefixes: [2]int{32, 32}, shared: [2]float64{0.99, 1}, rate: 30, meanOutput: 128, convs: 32,
			kvPerEngine: [2]float64{2.4, 2.6}, kvPerFleet: [2]float64{0.3, 0.33}}},
		// 400 conversations of 2–20 turns (≈ 5.9), prompts ≈ 7.7K, 4/3
		// conversations a second, ≈ 100 out, no overlap.
		{workload.CodingAgent{}, want{sessions: 400, requests: [2]int{2000, 2600}, meanPrompt: 7700, minPrompt: [2]int{380, 2000}, maxPrompt: [2]int{12000, 20000},
			prefixes: [2]int{400, 400}, shared: [2]float64{0.99, 1}, rate: 4.0 / 3, meanOutput: 100, convs: 400, checkTurns: true}},
		// 64 prefixes of 6,000 plus 256; 12 a second; 64 out; the pool 5×
		// an engine, 0.63× the fleet.
		{workload.UniformPool{}, want{sessions: 2400, requests: [2]int{2400, 2400}, meanPrompt: 6270, minPrompt: [2]int{6250, 6290}, maxPrompt: [2]int{6250, 6295},
			prefixes: [2]int{64, 64}, shared: [2]float64{1, 1}, rate: 12, meanOutput: 64, convs: 64,
			kvPerEngine: [2]float64{4.9, 5.3}, kvPerFleet: [2]float64{0.6, 0.67}}},
		// 144 documents of 16K–32K (mean ≈ 24K) with 6 turns each of 256
		// in (the driver's answers are short); 4 conversations a second;
		// 64 out; the documents with their histories ≈ 0.9× the fleet's
		// GPU and about half its CPU tiers.
		{workload.DocQA{}, want{sessions: 144, requests: [2]int{864, 864}, meanPrompt: 25000, minPrompt: [2]int{16260, 16300}, maxPrompt: [2]int{32000, 34500},
			prefixes: [2]int{144, 144}, shared: [2]float64{1, 1}, rate: 4, meanOutput: 64, convs: 144, turns: 6,
			kvPerEngine: [2]float64{3.3, 3.9}, kvPerFleet: [2]float64{0.82, 0.97}, wsPerFleet: [2]float64{0.85, 0.99}, wsPerFleetCPU: [2]float64{0.45, 0.55}}},
		// 4 prefixes of 12,000 plus 256; 100 a second; 128 out; the
		// prefixes 0.3× an engine (each fits everywhere). The first
		// 1,000 of the 3,000 requests (the same draws), for time.
		{workload.HotSet{Requests: 1000}, want{sessions: 1000, requests: [2]int{1000, 1000}, meanPrompt: 12270, minPrompt: [2]int{12260, 12280}, maxPrompt: [2]int{12260, 12285},
			prefixes: [2]int{4, 4}, shared: [2]float64{1, 1}, rate: 100, meanOutput: 128, convs: 4,
			kvPerEngine: [2]float64{0.29, 0.31}, kvPerFleet: [2]float64{0.035, 0.04}}},
		// 200 × 5 prompts of ≈ 16,270 tokens; 30 a second; 64 out; the
		// working set 1.32× the fleet's GPU and 0.83× its CPU tiers.
		{workload.TieredEviction{}, want{sessions: 2400, requests: [2]int{2400, 2400}, meanPrompt: 16275, minPrompt: [2]int{16265, 16285}, maxPrompt: [2]int{16265, 16285},
			prefixes: [2]int{200, 200}, shared: [2]float64{1, 1}, rate: 30, meanOutput: 64, convs: 200,
			kvPerEngine: [2]float64{10, 10.8}, kvPerFleet: [2]float64{1.25, 1.35}, wsPerFleet: [2]float64{1.3, 1.34}, wsPerFleetCPU: [2]float64{0.81, 0.85}}},
	} {
		t.Run(c.sc.Name(), func(t *testing.T) {
			t.Parallel()
			p, err := c.sc.Plan(workload.Options{Seed: 1, Rate: 1, MaxModelLen: c.sc.Fleet().MaxModelLen})
			if err != nil {
				t.Fatal(err)
			}
			s, reqs := measurePlan(t, p)
			f := c.sc.Fleet()
			engineKV := float64(f.GPUBlocks * simBlockTokens)
			fleetKV, fleetCPU := engineKV*float64(f.Engines), float64(f.CPUBlocks*simBlockTokens*f.Engines)
			t.Logf("%s: %v; fleet %d × %d blocks (CPU %d, profile %q); reused blocks %.2f× an engine, %.2f× the fleet; working set %.2f× the fleet's GPU, %.2f× its CPU; SLO %v",
				c.sc.Name(), s, f.Engines, f.GPUBlocks, f.CPUBlocks, f.Profile, float64(s.reused)/engineKV, float64(s.reused)/fleetKV,
				float64(s.workingSet)/fleetKV, float64(s.workingSet)/fleetCPU, c.sc.SLO())
			w := c.want
			in := func(v int, b [2]int) bool { return v >= b[0] && v <= b[1] }
			inF := func(v float64, b [2]float64) bool { return v >= b[0] && v <= b[1] }
			if s.sessions != w.sessions || !in(s.requests, w.requests) || !withinFrac(s.meanPrompt, w.meanPrompt, 0.05) ||
				!in(s.minPrompt, w.minPrompt) || !in(s.maxPrompt, w.maxPrompt) || !in(s.prefixes, w.prefixes) ||
				!inF(s.shared, w.shared) || !withinFrac(s.rate, w.rate, 0.1) || !withinFrac(s.meanOutput, w.meanOutput, 0.1) || s.convs != w.convs {
				t.Errorf("shape %v, want %+v", s, w)
			}
			if w.kvPerEngine[1] > 0 {
				// The distinct blocks more than one request has, against
				// one engine's KV and the fleet's.
				if e := float64(s.reused) / engineKV; !inF(e, w.kvPerEngine) || !inF(e/float64(f.Engines), w.kvPerFleet) {
					t.Errorf("reused blocks %d tokens: %.2f× an engine, %.2f× the fleet; want %v, %v", s.reused, e, e/float64(f.Engines), w.kvPerEngine, w.kvPerFleet)
				}
			}
			// Every prompt with its output fits the fleet's context (the
			// driver's default: the cache less a block, at most 32,768).
			ctx := f.MaxModelLen
			if ctx == 0 {
				ctx = min(32768, (f.GPUBlocks-1)*simBlockTokens)
			}
			if s.maxPromptPlusOutput > ctx {
				t.Errorf("a prompt with its output takes %d tokens, over the fleet's %d", s.maxPromptPlusOutput, ctx)
			}
			if w.checkTurns && (s.turns < 15 || s.turns > 20) {
				t.Errorf("the longest conversation has %d turns, want 15–20", s.turns)
			}
			if w.turns > 0 && s.turns != w.turns {
				t.Errorf("the longest conversation has %d turns, want %d", s.turns, w.turns)
			}
			if w.wsPerFleet[1] > 0 && !inF(float64(s.workingSet)/fleetKV, w.wsPerFleet) {
				t.Errorf("working set %d tokens: %.2f× the fleet's GPU, want %v", s.workingSet, float64(s.workingSet)/fleetKV, w.wsPerFleet)
			}
			if w.wsPerFleetCPU[1] > 0 && !inF(float64(s.workingSet)/fleetCPU, w.wsPerFleetCPU) {
				t.Errorf("working set %d tokens: %.2f× the fleet's CPU tiers, want %v", s.workingSet, float64(s.workingSet)/fleetCPU, w.wsPerFleetCPU)
			}
			checkProfileSLO(t, c.sc, s)
			checkLabels(t, reqs)
		})
	}
}

// checkProfileSLO checks, for a scenario scaled to an engine profile,
// the rule its SLO states: about twice the cold prefill of its mean
// prompt on an idle engine of the profile (from 2× to 2.5×, rounding up),
// and no less than the cold prefill of its longest prompt (a miss on an
// idle engine meets it).
func checkProfileSLO(t *testing.T, sc workload.Scenario, s planShape) {
	t.Helper()
	name := sc.Fleet().Profile
	if name == "" {
		return
	}
	p, err := profile.Named(name)
	if err != nil {
		t.Fatalf("%s: %v", sc.Name(), err)
	}
	mean, longest := p.ColdPrefill(int(s.meanPrompt)), p.ColdPrefill(s.maxPrompt)
	if slo := sc.SLO(); slo < 2*mean || float64(slo) > 2.5*float64(mean) || slo < longest {
		t.Errorf("%s: SLO %v against a cold mean prompt (%d tokens) of %v and a cold longest (%d) of %v on %s", sc.Name(), slo, int(s.meanPrompt), mean, s.maxPrompt, longest, name)
	}
}

// checkLabels checks that every conversation's turns run 1, 2, … in
// arrival order and that Prev is the previous answer's endpoint in a
// closed-loop session and "" (for the driver) otherwise.
func checkLabels(t *testing.T, reqs []sentRequest) {
	t.Helper()
	type key struct{ session, conv int }
	order := slices.Clone(reqs)
	slices.SortStableFunc(order, func(x, y sentRequest) int { return int(x.start - y.start) })
	next := map[int]int{}
	perSession := map[int]int{}
	for _, r := range order {
		next[r.req.Conversation]++
		if r.req.Turn != next[r.req.Conversation] {
			t.Fatalf("conversation %d: turn %d, want %d", r.req.Conversation, r.req.Turn, next[r.req.Conversation])
		}
		perSession[r.session]++
		closedLoop := perSession[r.session] > 1
		if want := fmt.Sprintf("engine-%d", r.session%8); closedLoop && r.req.Prev != want || !closedLoop && r.req.Prev != "" {
			t.Fatalf("session %d turn %d: prev %q", r.session, r.req.Turn, r.req.Prev)
		}
	}
}

// TestDeterminism: the same seed gives byte-identical requests in the
// same order; another seed another workload (other bodies and, open-loop,
// other arrival times).
func TestDeterminism(t *testing.T) {
	for _, sc := range smallScenarios() {
		t.Run(sc.Name(), func(t *testing.T) {
			t.Parallel()
			run := func(seed uint64) ([32]byte, workload.Plan, []sentRequest) {
				p, err := sc.Plan(workload.Options{Seed: seed, Rate: 1, MaxModelLen: sc.Fleet().MaxModelLen})
				if err != nil {
					t.Fatal(err)
				}
				reqs := drivePlan(t, p, false)
				return planDigest(reqs), p, reqs
			}
			a, pa, ra := run(7)
			if b, _, _ := run(7); a != b {
				t.Fatal("seed 7 twice: different requests")
			}
			c, pc, rc := run(8)
			if a == c {
				t.Fatal("seeds 7 and 8: the same requests")
			}
			sameStarts := 0
			for i := range min(len(pa.Sessions), len(pc.Sessions)) {
				if pa.Sessions[i].Start == pc.Sessions[i].Start {
					sameStarts++
				}
			}
			sameBodies := 0
			for i := range min(len(ra), len(rc)) {
				if bytes.Equal(ra[i].req.Body, rc[i].req.Body) {
					sameBodies++
				}
			}
			if sameStarts > 1 || sameBodies > 0 {
				t.Fatalf("seeds 7 and 8: %d equal starts, %d equal bodies", sameStarts, sameBodies)
			}
		})
	}
}

// TestRate: Rate 2 halves every start offset and leaves the requests and
// the waits inside a session as they were.
func TestRate(t *testing.T) {
	for _, sc := range append(smallScenarios(), workload.CodingAgent{Conversations: 40, Think: 1500 * time.Millisecond},
		workload.DocQA{Conversations: 20, Think: time.Second}) {
		t.Run(sc.Name(), func(t *testing.T) {
			t.Parallel()
			var plans [2]workload.Plan
			var reqs [2][]sentRequest
			for i, rate := range []float64{1, 2} {
				p, err := sc.Plan(workload.Options{Seed: 3, Rate: rate, MaxModelLen: sc.Fleet().MaxModelLen})
				if err != nil {
					t.Fatal(err)
				}
				plans[i], reqs[i] = p, drivePlan(t, p, false)
			}
			if len(plans[0].Sessions) != len(plans[1].Sessions) || len(reqs[0]) != len(reqs[1]) {
				t.Fatalf("rate 2: %d sessions, %d requests; rate 1: %d, %d", len(plans[1].Sessions), len(reqs[1]), len(plans[0].Sessions), len(reqs[0]))
			}
			for i := range plans[0].Sessions {
				if d := plans[0].Sessions[i].Start - 2*plans[1].Sessions[i].Start; d < -2 || d > 2 {
					t.Fatalf("session %d: start %v at rate 1, %v at rate 2", i, plans[0].Sessions[i].Start, plans[1].Sessions[i].Start)
				}
			}
			waits := 0
			for i := range reqs[0] {
				x, y := reqs[0][i], reqs[1][i]
				if x.wait != y.wait || !bytes.Equal(x.req.Body, y.req.Body) {
					t.Fatalf("request %d: wait %v / %v, bodies equal %v", i, x.wait, y.wait, bytes.Equal(x.req.Body, y.req.Body))
				}
				if x.wait > 0 {
					waits++
				}
			}
			if cs, ok := sc.(workload.CodingAgent); ok && cs.Think > 0 && waits == 0 {
				t.Fatal("no think time inside a session")
			}
			if d, ok := sc.(workload.DocQA); ok && d.Think > 0 && waits == 0 {
				t.Fatal("no think time inside a session")
			}
		})
	}
}

// TestOptionErrors: a rate that is not positive, and a context too short
// for a single-turn shape, fail the plan.
func TestOptionErrors(t *testing.T) {
	for _, sc := range syntheticScenarios() {
		for _, rate := range []float64{0, -1, math.NaN(), math.Inf(1)} {
			if _, err := sc.Plan(workload.Options{Seed: 1, Rate: rate}); err == nil {
				t.Errorf("%s: rate %v accepted", sc.Name(), rate)
			}
		}
	}
	for _, sc := range []workload.Scenario{workload.B2BSaaS{}, workload.HotPrefix{}, workload.UniformPool{}, workload.DocQA{}, workload.HotSet{}, workload.TieredEviction{}} {
		if _, err := sc.Plan(workload.Options{Seed: 1, Rate: 1, MaxModelLen: 2048}); err == nil || !strings.Contains(err.Error(), "fit") {
			t.Errorf("%s: context 2048: %v", sc.Name(), err)
		}
	}
	if _, err := (workload.HotPrefix{SuffixMin: 10, SuffixMax: 5}).Plan(workload.Options{Seed: 1, Rate: 1}); err == nil {
		t.Error("hot-prefix: suffix bounds reversed accepted")
	}
	if _, err := (workload.DocQA{DocMin: 20000, DocMax: 10000}).Plan(workload.Options{Seed: 1, Rate: 1}); err == nil {
		t.Error("doc-qa: document bounds reversed accepted")
	}
	if _, err := (workload.DocQA{Think: -time.Second}).Plan(workload.Options{Seed: 1, Rate: 1}); err == nil {
		t.Error("doc-qa: a negative think accepted")
	}
}

// TestZipf: the hot prefix's picks follow k^-1.1 over 32 ranks (the
// hottest ≈ 28%), on short prefixes for many draws.
func TestZipf(t *testing.T) {
	cdf := make([]float64, 32) // cumulative k^-1.1
	for k := range cdf {
		cdf[k] = math.Pow(float64(k+1), -1.1)
		if k > 0 {
			cdf[k] += cdf[k-1]
		}
	}
	if top := cdf[0] / cdf[31]; !withinFrac(top, 0.284, 0.01) {
		t.Fatalf("top share %.3f", top)
	}
	p, err := workload.HotPrefix{PrefixTokens: 16, SuffixMin: 1, SuffixMax: 1, Requests: 20000}.Plan(workload.Options{Seed: 1, Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, 32)
	for _, ps := range p.Sessions {
		req, _, _ := ps.Session.Next(nil)
		counts[req.Conversation]++
	}
	n := float64(len(p.Sessions))
	for k, c := range counts[:4] {
		want := cdf[k] / cdf[31]
		if k > 0 {
			want = (cdf[k] - cdf[k-1]) / cdf[31]
		}
		if !withinFrac(float64(c)/n, want, 0.08) {
			t.Errorf("prefix %d: %.3f of the requests, want %.3f", k, float64(c)/n, want)
		}
	}
}

// TestTiers: the scenarios of the KV-tiers issue are scaled to a named
// engine profile and give each engine a CPU tier larger than its GPU (a
// tier no larger only mirrors it), at their sources' ratios; a negative
// CPUBlocks is the GPU-only arm, the same fleet and the same requests
// without the tier. uniform-pool has a tier of 2× its GPU on sim-default;
// the other scenarios keep their fleets (no tier, sim-default).
func TestTiers(t *testing.T) {
	for _, c := range []struct {
		sc, gpuOnly workload.Scenario
		small       [2]workload.Scenario // a small plan with and without the tier
		profile     string
		cpuOverGPU  float64 // ± 2%
	}{
		// The doc-Q&A rig's 88 GiB ≈ 2.22M tokens against ≈ 1.22M of GPU.
		{workload.DocQA{}, workload.DocQA{CPUBlocks: -1}, [2]workload.Scenario{workload.DocQA{Conversations: 4}, workload.DocQA{Conversations: 4, CPUBlocks: -1}},
			profile.GPTOSS120BH200, 1.8},
		// The P2P guide's 2× the pod's GPU KV.
		{workload.HotSet{}, workload.HotSet{CPUBlocks: -1}, [2]workload.Scenario{workload.HotSet{Requests: 40}, workload.HotSet{Requests: 40, CPUBlocks: -1}},
			profile.GPTOSS120BH200, 2},
		// The multi-tier report's 100 GiB ≈ 2.59M tokens against 1,630,790.
		{workload.TieredEviction{}, workload.TieredEviction{CPUBlocks: -1},
			[2]workload.Scenario{workload.TieredEviction{Requests: 40, Groups: 10}, workload.TieredEviction{Requests: 40, Groups: 10, CPUBlocks: -1}},
			profile.GPTOSS120BH200, 1.59},
		{workload.UniformPool{}, workload.UniformPool{CPUBlocks: -1}, [2]workload.Scenario{workload.UniformPool{Requests: 40}, workload.UniformPool{Requests: 40, CPUBlocks: -1}},
			"", 2},
	} {
		f, g := c.sc.Fleet(), c.gpuOnly.Fleet()
		if f.Profile != c.profile || f.CPUBlocks <= f.GPUBlocks || !withinFrac(float64(f.CPUBlocks)/float64(f.GPUBlocks), c.cpuOverGPU, 0.02) {
			t.Errorf("%s: fleet %+v, want profile %q and a CPU tier %.2f× the GPU", c.sc.Name(), f, c.profile, c.cpuOverGPU)
		}
		if f.Profile != "" {
			if _, err := profile.Named(f.Profile); err != nil {
				t.Errorf("%s: %v", c.sc.Name(), err)
			}
		}
		if f.CPUBlocks = 0; g != f {
			t.Errorf("%s: the GPU-only arm's fleet %+v, want %+v", c.sc.Name(), g, f)
		}
		var digests [2][32]byte
		for i, sc := range c.small {
			p, err := sc.Plan(workload.Options{Seed: 2, Rate: 1, MaxModelLen: sc.Fleet().MaxModelLen})
			if err != nil {
				t.Fatal(err)
			}
			digests[i] = planDigest(drivePlan(t, p, false))
		}
		if digests[0] != digests[1] {
			t.Errorf("%s: the GPU-only arm sends other requests", c.sc.Name())
		}
	}
	for _, sc := range []workload.Scenario{workload.B2BSaaS{}, workload.HotPrefix{}, workload.CodingAgent{}, workload.AgenticPressure{}, workload.AgenticChat(), workload.Demo()} {
		if f := sc.Fleet(); f.CPUBlocks != 0 || f.Profile != "" {
			t.Errorf("%s: fleet %+v, want no CPU tier on sim-default", sc.Name(), f)
		}
	}
}

// TestRegistry: every name Names lists (the trace aside, which needs a
// file) is a scenario of that name, and an unknown name is an error that
// lists them.
func TestRegistry(t *testing.T) {
	for _, name := range workload.Names() {
		if name == "trace" {
			continue
		}
		sc, err := workload.Named(name, workload.NamedOptions{})
		if err != nil || !strings.HasPrefix(sc.Name(), name) {
			t.Errorf("%s: %v, %v", name, sc, err)
		}
	}
	for _, name := range []string{"doc-qa", "hot-set", "tiered-eviction"} {
		if !slices.Contains(workload.Names(), name) {
			t.Errorf("%s is not listed", name)
		}
	}
	if _, err := workload.Named("no-such", workload.NamedOptions{}); err == nil || !strings.Contains(err.Error(), "tiered-eviction") {
		t.Errorf("an unknown name: %v", err)
	}
}
