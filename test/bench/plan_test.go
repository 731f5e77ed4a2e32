package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/workload"
)

// planScript is a test session: its requests in order, each sent after
// the answer to the one before; it records what it was handed.
type planScript struct {
	reqs  []workload.Request
	waits []time.Duration
	// onStart, when set, runs at the first Next.
	onStart func()

	mu      sync.Mutex
	next    int
	answers []workload.Answer
}

func (s *planScript) Next(prev *workload.Answer) (workload.Request, time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev != nil {
		s.answers = append(s.answers, *prev)
		if !prev.OK {
			return workload.Request{}, 0, true
		}
	} else if s.onStart != nil {
		s.onStart()
	}
	if s.next == len(s.reqs) {
		return workload.Request{}, 0, true
	}
	k := s.next
	s.next++
	var wait time.Duration
	if k < len(s.waits) {
		wait = s.waits[k]
	}
	return s.reqs[k], wait, false
}

func (s *planScript) handed() []workload.Answer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.answers)
}

// planScenario is a workload.Scenario of fixed sessions; it records the
// options it was planned with.
type planScenario struct {
	plan workload.Plan
	mu   sync.Mutex
	opts []workload.Options
}

func (p *planScenario) Name() string { return "script" }
func (p *planScenario) Fleet() workload.Fleet {
	return workload.Fleet{Engines: 3, GPUBlocks: 64, MaxModelLen: 1000}
}
func (p *planScenario) SLO() time.Duration { return time.Second }
func (p *planScenario) Plan(o workload.Options) (workload.Plan, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.opts = append(p.opts, o)
	return p.plan, nil
}

// fakeOpenAI answers the three streaming paths as an engine behind the
// picker would: the text "<path> <conversation>/<turn>" in two pieces, the
// body's endpoint in X-Kvroute-Endpoint, usage with the body's length as
// its prompt tokens; a body holding "fail" gets a 500. gate runs before
// each answer.
func fakeOpenAI(t *testing.T, gate func(conversation, turn int)) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b struct {
			Conversation, Turn int
			Endpoint           string
		}
		if err := json.Unmarshal(body, &b); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		gate(b.Conversation, b.Turn)
		w.Header().Set("X-Kvroute-Endpoint", b.Endpoint)
		if strings.Contains(string(body), "fail") {
			http.Error(w, "failed", http.StatusInternalServerError)
			return
		}
		text := fmt.Sprintf("%s %d/%d", r.URL.Path, b.Conversation, b.Turn)
		pieces := []string{text[:4], text[4:]}
		n := len(body)
		var events []string
		switch r.URL.Path {
		case "/v1/responses":
			for _, p := range pieces {
				events = append(events, fmt.Sprintf(`{"type":"response.output_text.delta","delta":%q}`, p))
			}
			events = append(events, fmt.Sprintf(`{"type":"response.completed","response":{"usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":2}}}}`, n))
		case "/v1/chat/completions":
			events = append(events, `{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
			for _, p := range pieces {
				events = append(events, fmt.Sprintf(`{"choices":[{"index":0,"delta":{"content":%q}}]}`, p))
			}
			events = append(events, fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d,"prompt_tokens_details":{"cached_tokens":2}}}`, n))
		case "/v1/completions":
			for _, p := range pieces {
				events = append(events, fmt.Sprintf(`{"choices":[{"index":0,"text":%q}]}`, p))
			}
			events = append(events, fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d}}`, n))
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			fmt.Fprintf(w, "data: %s\n\n", e)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// planReq is a request of the script: a body naming its conversation,
// turn and the endpoint the fake answers from.
func planReq(path string, conv, turn int, endpoint string) workload.Request {
	b, _ := json.Marshal(map[string]any{"conversation": conv, "turn": turn, "endpoint": endpoint, "stream": true})
	return workload.Request{Path: path, Body: b, Conversation: conv, Turn: turn}
}

// TestPlanDriver drives a scripted plan through a fake OpenAI server: the
// three paths' text, usage and endpoint handed back; branches starting
// once their turn is answered, or once their parent ended before it;
// PrevEndpoint filled from the conversation's latest answered turn when
// the session leaves it empty; labels copied; a failure ending its
// session; outcomes in the order sent; Plan's seed.
func TestPlanDriver(t *testing.T) {
	// The root's third answer waits for the branch after its second to
	// have started, so the branch sees exactly two answers handed.
	branchStarted := make(chan struct{})
	srv := fakeOpenAI(t, func(conversation, turn int) {
		if conversation == 1 && turn == 3 {
			<-branchStarted
		}
	})
	root := &planScript{reqs: []workload.Request{
		planReq("/v1/responses", 1, 1, "e1"),
		planReq("/v1/responses", 1, 2, "e2"),
		planReq("/v1/responses", 1, 3, "e3"),
	}, waits: []time.Duration{0, time.Millisecond, time.Millisecond}}
	// The branch after turn 2 must see the root handed two answers; the
	// late one (after turn 9, never reached) the root ended.
	var branchSaw, lateSaw []workload.Answer
	branch := &planScript{reqs: []workload.Request{planReq("/v1/responses", 2, 3, "e4")},
		onStart: func() { branchSaw = root.handed(); close(branchStarted) }}
	late := &planScript{reqs: []workload.Request{planReq("/v1/chat/completions", 3, 1, "e5")},
		onStart: func() { lateSaw = root.handed() }}
	withPrev := planReq("/v1/completions", 4, 2, "e6")
	withPrev.Prev, withPrev.Tenant, withPrev.Step = "given", "t1", 3
	completions := &planScript{reqs: []workload.Request{planReq("/v1/completions", 4, 1, "e6"), withPrev}}
	failing := &planScript{reqs: []workload.Request{planReq("/v1/chat/completions", 5, 1, "fail"), planReq("/v1/chat/completions", 5, 2, "e7")}}
	sc := &planScenario{plan: workload.Plan{Sessions: []workload.Planned{
		{Session: root},
		{Session: branch, After: &workload.After{Session: 0, Turn: 2}, Start: time.Hour},
		{Session: late, After: &workload.After{Session: 0, Turn: 9}},
		{Session: completions, Start: 5 * time.Millisecond},
		{Session: failing, Start: 2 * time.Millisecond},
	}}}
	c := NewClient(srv.URL)
	c.MaxModelLen = 777
	p := Plan(sc, 42, 2)
	if p.Name() != "script" || p.Fleet() != (FleetConfig{Engines: 3, GPUBlocks: 64, MaxModelLen: 1000}) {
		t.Fatalf("%s %+v", p.Name(), p.Fleet())
	}
	outs, err := p.Run(context.Background(), c, rand.New(rand.NewPCG(42, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if want := (workload.Options{Seed: 42, Rate: 2, MaxModelLen: 777}); len(sc.opts) != 1 || sc.opts[0] != want {
		t.Fatalf("planned with %+v, want %+v", sc.opts, want)
	}
	if len(branchSaw) != 2 || len(lateSaw) != 3 {
		t.Fatalf("the branch started after %d answers (want 2), the late one after %d (want 3)", len(branchSaw), len(lateSaw))
	}
	got := map[[2]int]Outcome{}
	for k, o := range outs {
		if k > 0 && o.Start.Before(outs[k-1].Start) {
			t.Fatal("outcomes not in the order sent")
		}
		got[[2]int{o.Conversation, o.Turn}] = o
	}
	if len(outs) != 8 || len(got) != 8 {
		t.Fatalf("%d outcomes: %+v", len(outs), got)
	}
	for key, want := range map[[2]int]struct {
		prev string
		err  bool
	}{
		{1, 1}: {}, {1, 2}: {prev: "e1"}, {1, 3}: {prev: "e2"}, {2, 3}: {}, {3, 1}: {},
		{4, 1}: {}, {4, 2}: {prev: "given"}, {5, 1}: {err: true},
	} {
		o := got[key]
		if o.PrevEndpoint != want.prev || (o.Err != nil) != want.err {
			t.Errorf("conversation %d turn %d: prev %q, err %v", key[0], key[1], o.PrevEndpoint, o.Err)
		}
		if !want.err && (o.PromptTokens != len(o.Body) || o.TTFT <= 0 || o.Status != http.StatusOK || o.Endpoint == "") {
			t.Errorf("conversation %d turn %d: %+v", key[0], key[1], o)
		}
	}
	if o := got[[2]int{4, 2}]; o.Tenant != "t1" || o.Step != 3 || o.CachedTokens != 0 {
		t.Errorf("labels: %+v", o)
	}
	if o := got[[2]int{1, 1}]; o.CachedTokens != 2 || o.Path != "/v1/responses" {
		t.Errorf("responses usage: %+v", o)
	}
	for s, want := range map[*planScript][]string{
		root:        {"/v1/responses 1/1", "/v1/responses 1/2", "/v1/responses 1/3"},
		late:        {"/v1/chat/completions 3/1"},
		completions: {"/v1/completions 4/1", "/v1/completions 4/2"},
		failing:     {""},
	} {
		var texts []string
		for _, a := range s.handed() {
			texts = append(texts, a.Text)
		}
		if !slices.Equal(texts, want) {
			t.Errorf("handed %q, want %q", texts, want)
		}
	}
	if a := root.handed()[1]; a.Endpoint != "e2" || !a.OK || a.PromptTokens == 0 {
		t.Errorf("answer: %+v", a)
	}
	if a := failing.handed()[0]; a.OK || a.Endpoint != "fail" {
		t.Errorf("a failed answer: %+v", a)
	}
	// Another stream (a --duration repeat) plans another seed.
	sc.plan = workload.Plan{}
	if _, err := p.Run(context.Background(), c, rand.New(rand.NewPCG(42, 2))); err != nil || len(sc.opts) != 2 || sc.opts[1].Seed == 42 {
		t.Fatalf("a repeat planned %+v (%v)", sc.opts, err)
	}
	// A plan whose sessions wait for each other is refused.
	sc.plan = workload.Plan{Sessions: []workload.Planned{
		{Session: &planScript{}, After: &workload.After{Session: 1, Turn: 1}},
		{Session: &planScript{}, After: &workload.After{Session: 0, Turn: 1}},
	}}
	if _, err := p.Run(context.Background(), c, rand.New(rand.NewPCG(1, 1))); err == nil {
		t.Fatal("a cycle of Afters was run")
	}
	// A path the client does not know fails its request, not the run.
	if o, a := c.Send(context.Background(), workload.Request{Path: "/v1/embeddings"}); o.Err == nil || a.OK {
		t.Fatalf("%+v %+v", o, a)
	}
}

// TestPlanAgenticChat runs a small agentic-chat shape — the
// agentic-pressure conversations as chat completions — under precise and
// round-robin routing, through the plan driver: every request answered,
// the chat bodies accepted by the engines and routed by the picker, and
// precise keeping the sessions warm.
func TestPlanAgenticChat(t *testing.T) {
	w := workload.AgenticPressure{Engines: 3, GPUBlocks: 1024, Sessions: 10, AgentTypes: 2, Tenants: 2, MinTurns: 3, MaxTurns: 5,
		SystemMin: 300, SystemMax: 500, ToolMin: 40, ToolMax: 120, BranchPercent: 40, OutputTokens: 8,
		Think: 40 * time.Millisecond, Start: 100 * time.Millisecond, Chat: true}
	res, err := Run(context.Background(), Options{Scenario: Plan(w, 11, 1), Policies: []score.Policy{score.Precise, score.RoundRobin},
		TimeScale: 0, Seed: 11, SampleEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p, rr := res.Policies["precise"], res.Policies["round-robin"]
	t.Logf("\n%s", Table(res))
	if res.Scenario != "agentic-chat" || res.Fleet.Engines != 3 {
		t.Fatalf("results header: %+v", res)
	}
	if p.Errors != 0 || rr.Errors != 0 || p.Requests != rr.Requests || p.Requests < 20 || p.Conversations != 10 {
		t.Fatalf("precise %+v\nround-robin %+v", p, rr)
	}
	if p.HitRate <= rr.HitRate || p.ContinuationHitRate < 0.8 || p.WarmReturns < (p.Requests-p.Conversations)*3/4 {
		t.Fatalf("precise hit %.3f (continuations %.3f, %d warm of %d) vs round-robin %.3f", p.HitRate, p.ContinuationHitRate,
			p.WarmReturns, p.Requests-p.Conversations, rr.HitRate)
	}
}

// TestPlanDemo runs `kvroute bench --scenario demo`'s scenario (the demo
// through the plan driver) under precise with no simulated waiting: its
// 16 sessions, every request answered, as many as the plan drew.
func TestPlanDemo(t *testing.T) {
	res, err := Run(context.Background(), Options{Scenario: Plan(workload.Demo(), 1, 1), Policies: []score.Policy{score.Precise},
		TimeScale: 0, Seed: 1, SampleEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Policies["precise"]
	if res.Scenario != "demo (short agentic-pressure)" || res.Fleet.Engines != 4 || p.Errors != 0 || p.Conversations != 16 ||
		p.Requests < 70 || p.Requests > 100 || p.HitRate < 0.5 {
		t.Fatalf("%s on %d engines: %+v", res.Scenario, res.Fleet.Engines, p)
	}
}
