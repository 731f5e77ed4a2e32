package workload

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"
)

// agenticStats are the figures of a fake drive of an agentic plan.
type agenticStats struct {
	Sessions, Branches, Requests int
	// Turns are the requests a session sent (a branch counts its own).
	MeanTurns          float64
	MinTurns, MaxTurns int
	// Prompt tokens, rounded: of turn 1 (a root's first) and of the later
	// turns.
	FirstPrompt, LaterPrompt int
	// Tenants are the distinct cache_salts; SystemPrompts the distinct
	// instructions or system messages.
	Tenants, SystemPrompts int
}

func agenticStatsOf(t *testing.T, p Plan, xs []fakeExchange) agenticStats {
	t.Helper()
	st := agenticStats{Sessions: len(p.Sessions), Requests: len(xs), MinTurns: math.MaxInt}
	for _, s := range p.Sessions {
		if s.After != nil {
			st.Branches++
		}
	}
	turns := make([]int, len(p.Sessions))
	salts, systems := map[string]bool{}, map[string]bool{}
	var first, later, nFirst, nLater int
	for _, x := range xs {
		turns[x.Session]++
		if x.Req.Turn == 1 {
			first, nFirst = first+x.PromptTokens, nFirst+1
		} else {
			later, nLater = later+x.PromptTokens, nLater+1
		}
		var b struct {
			CacheSalt    string `json:"cache_salt"`
			Instructions string `json:"instructions"`
			Messages     []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(x.Req.Body, &b); err != nil {
			t.Fatal(err)
		}
		salts[b.CacheSalt] = true
		if len(b.Messages) > 0 {
			b.Instructions = b.Messages[0].Content
		}
		systems[b.Instructions] = true
	}
	for _, n := range turns {
		st.MinTurns, st.MaxTurns = min(st.MinTurns, n), max(st.MaxTurns, n)
	}
	st.MeanTurns = math.Round(100*float64(len(xs))/float64(len(turns))) / 100
	st.FirstPrompt = int(math.Round(float64(first) / float64(max(1, nFirst))))
	st.LaterPrompt = int(math.Round(float64(later) / float64(max(1, nLater))))
	st.Tenants, st.SystemPrompts = len(salts), len(systems)
	return st
}

// agenticDrive draws a's plan for o and drives it with the fake answerer.
func agenticDrive(t *testing.T, a AgenticPressure, o Options) (Plan, []fakeExchange) {
	t.Helper()
	p, err := a.Plan(o)
	if err != nil {
		t.Fatal(err)
	}
	return p, fakeDrive(t, p, "Calling the tool now.")
}

// agenticDrives are the drives made so far, by scenario and options: a
// drive of the default shape renders about 700 prompts, so the tests
// share them (they do not run in parallel).
var agenticDrives = map[string]struct {
	p  Plan
	xs []fakeExchange
}{}

// agenticDriven is agenticDrive, made once per scenario and options.
func agenticDriven(t *testing.T, a AgenticPressure, o Options) (Plan, []fakeExchange) {
	t.Helper()
	key := fmt.Sprintf("%+v %+v", a, o)
	d, ok := agenticDrives[key]
	if !ok {
		d.p, d.xs = agenticDrive(t, a, o)
		agenticDrives[key] = d
	}
	return d.p, d.xs
}

// agenticSeed1 are the options of the shape table's drives: seed 1, the
// nominal rate, the bench's default context for the default fleet.
var agenticSeed1 = Options{Seed: 1, Rate: 1, MaxModelLen: 32768}

// agenticSmall is a quarter of the default shape with more branches, for
// the tests that drive a plan more than once; agenticSmallChat its chat
// twin.
var (
	agenticSmall     = AgenticPressure{Sessions: 16, BranchPercent: 40}
	agenticSmallChat = AgenticPressure{Sessions: 16, BranchPercent: 40, Chat: true}
)

// TestAgenticShape checks the generated workload of agentic-pressure, its
// chat twin and the demo at seed 1 and the nominal rate, with the bench's
// 32k context (the demo's fleet: 767 blocks of 16 tokens), against a
// table.
func TestAgenticShape(t *testing.T) {
	for _, tc := range []struct {
		a    AgenticPressure
		ctx  int
		want agenticStats
	}{
		{AgenticPressure{}, 32768, agenticStats{Sessions: 64, Branches: 16, Requests: 713, MeanTurns: 11.14, MinTurns: 3, MaxTurns: 20,
			FirstPrompt: 3539, LaterPrompt: 12241, Tenants: 4, SystemPrompts: 4}},
		// The same sessions and turns, and the same prompts: a turn's
		// text and call are one assistant message in both forms.
		{AgenticChat(), 32768, agenticStats{Sessions: 64, Branches: 16, Requests: 713, MeanTurns: 11.14, MinTurns: 3, MaxTurns: 20,
			FirstPrompt: 3539, LaterPrompt: 12241, Tenants: 4, SystemPrompts: 4}},
		{Demo(), 767 * 16, agenticStats{Sessions: 16, Branches: 4, Requests: 86, MeanTurns: 5.38, MinTurns: 3, MaxTurns: 7,
			FirstPrompt: 2325, LaterPrompt: 3903, Tenants: 2, SystemPrompts: 4}},
	} {
		t.Run(tc.a.Name(), func(t *testing.T) {
			p, xs := agenticDriven(t, tc.a, Options{Seed: 1, Rate: 1, MaxModelLen: tc.ctx})
			if got := agenticStatsOf(t, p, xs); got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			for _, x := range xs {
				if x.PromptTokens+tc.a.WithDefaults().OutputTokens > tc.ctx {
					t.Fatalf("session %d turn %d: %d prompt tokens in a %d context", x.Session, x.Req.Turn, x.PromptTokens, tc.ctx)
				}
			}
		})
	}
}

// TestAgenticDeterministic checks that a seed gives byte-identical
// requests at the same times (a new plan keeps nothing from an earlier
// one), and another seed other sessions.
func TestAgenticDeterministic(t *testing.T) {
	o := Options{Seed: 1, Rate: 1}
	for _, a := range []AgenticPressure{agenticSmall, agenticSmallChat} {
		_, x1 := agenticDriven(t, a, o)
		_, x2 := agenticDrive(t, a, o)
		if len(x1) != len(x2) {
			t.Fatalf("%s: %d then %d requests", a.Name(), len(x1), len(x2))
		}
		for k := range x1 {
			if x1[k].Session != x2[k].Session || x1[k].At != x2[k].At || !reflect.DeepEqual(x1[k].Req, x2[k].Req) {
				t.Fatalf("%s: request %d differs for one seed", a.Name(), k)
			}
		}
	}
	// Another seed: other starts, and every root another first request.
	for _, a := range []AgenticPressure{{}, AgenticChat()} {
		p1, err1 := a.Plan(agenticSeed1)
		p2, err2 := a.Plan(Options{Seed: 2, Rate: 1, MaxModelLen: 32768})
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		same := 0
		for i := range min(len(p1.Sessions), len(p2.Sessions)) {
			s1, s2 := p1.Sessions[i], p2.Sessions[i]
			if s1.After != nil || s2.After != nil {
				continue
			}
			r1, _, _ := s1.Session.Next(nil)
			r2, _, _ := s2.Session.Next(nil)
			if s1.Start == s2.Start || bytes.Equal(r1.Body, r2.Body) {
				same++
			}
		}
		if same > 0 {
			t.Fatalf("%s: %d sessions the same for seeds 1 and 2", a.Name(), same)
		}
	}
}

// TestAgenticRate checks that rate 2 halves the roots' start offsets of
// the default shape and changes nothing else: the same branches, and (on
// the small shape) each session's requests with the same bodies and the
// same waits between them.
func TestAgenticRate(t *testing.T) {
	o1, o2 := agenticSeed1, agenticSeed1
	o2.Rate = 2
	p1, err1 := AgenticPressure{}.Plan(o1)
	p2, err2 := AgenticPressure{}.Plan(o2)
	if err1 != nil || err2 != nil || len(p1.Sessions) != len(p2.Sessions) {
		t.Fatal(err1, err2)
	}
	roots := 0
	for i := range p1.Sessions {
		s1, s2 := p1.Sessions[i], p2.Sessions[i]
		if !reflect.DeepEqual(s1.After, s2.After) {
			t.Fatalf("session %d: after %+v, then %+v", i, s1.After, s2.After)
		}
		if s1.After == nil {
			roots++
			if d := s1.Start - 2*s2.Start; d < 0 || d > 1 {
				t.Fatalf("session %d starts at %v, at rate 2 at %v", i, s1.Start, s2.Start)
			}
		}
	}
	if roots < len(p1.Sessions)/2 {
		t.Fatalf("%d roots of %d", roots, len(p1.Sessions))
	}
	o1.MaxModelLen, o2.MaxModelLen = 0, 0
	_, x1 := agenticDriven(t, agenticSmall, o1)
	_, x2 := agenticDrive(t, agenticSmall, o2)
	if len(x1) != len(x2) {
		t.Fatalf("%d, %d requests", len(x1), len(x2))
	}
	bySession := func(xs []fakeExchange) map[int][]fakeExchange {
		m := map[int][]fakeExchange{}
		for _, x := range xs {
			m[x.Session] = append(m[x.Session], x)
		}
		return m
	}
	b1, b2 := bySession(x1), bySession(x2)
	for i, s := range b1 {
		if len(s) != len(b2[i]) {
			t.Fatalf("session %d: %d requests, at rate 2 %d", i, len(s), len(b2[i]))
		}
		for k := range s {
			if !bytes.Equal(s[k].Req.Body, b2[i][k].Req.Body) {
				t.Fatalf("session %d request %d differs at rate 2", i, k)
			}
			if k > 0 && s[k].At-s[k-1].At != b2[i][k].At-b2[i][k-1].At {
				t.Fatalf("session %d: think before request %d %v, at rate 2 %v", i, k, s[k].At-s[k-1].At, b2[i][k].At-b2[i][k-1].At)
			}
		}
	}
}

// TestAgenticTwins checks that agentic-pressure and agentic-chat send the
// same conversations: the same sessions, the same requests in the same
// order, each the same messages and tools (a Responses turn's text and
// call merged into the one assistant message chat sends), the same salts,
// the chat form asking for usage: on the small shape with no context
// bound (the two forms' prompts differ by a few template tokens a turn, so
// a bound could stop one a turn before the other). On the default shape
// at seed 1 with the 32k context they send the same requests as well (the
// bodies not compared: the drives are the shape table's).
func TestAgenticTwins(t *testing.T) {
	agenticTwins(t, agenticSmall, agenticSmallChat, Options{Seed: 1, Rate: 1}, true)
	agenticTwins(t, AgenticPressure{}, AgenticChat(), agenticSeed1, false)
}

// agenticTwins compares the drives of a and its chat twin c for o, their
// bodies when deep.
func agenticTwins(t *testing.T, a, c AgenticPressure, o Options, deep bool) {
	t.Helper()
	pr, xr := agenticDriven(t, a, o)
	pc, xc := agenticDriven(t, c, o)
	if len(pr.Sessions) != len(pc.Sessions) || len(xr) != len(xc) {
		t.Fatalf("%d, %d sessions; %d, %d requests", len(pr.Sessions), len(pc.Sessions), len(xr), len(xc))
	}
	for i := range pr.Sessions {
		if pr.Sessions[i].Start != pc.Sessions[i].Start || !reflect.DeepEqual(pr.Sessions[i].After, pc.Sessions[i].After) {
			t.Fatalf("session %d: %+v, %+v", i, pr.Sessions[i], pc.Sessions[i])
		}
	}
	for k := range xr {
		r, c := xr[k], xc[k]
		if r.Req.Path != "/v1/responses" || c.Req.Path != "/v1/chat/completions" {
			t.Fatalf("paths %s, %s", r.Req.Path, c.Req.Path)
		}
		if r.Session != c.Session || r.At != c.At || r.Req.Conversation != c.Req.Conversation || r.Req.Turn != c.Req.Turn || r.Req.Prev != c.Req.Prev {
			t.Fatalf("request %d: %+v, %+v", k, r, c)
		}
		if !deep {
			continue
		}
		mr, tr := fakeMessages(t, r.Req)
		mc, tc := fakeMessages(t, c.Req)
		if !reflect.DeepEqual(mr, mc) || !reflect.DeepEqual(tr, tc) {
			t.Fatalf("request %d (session %d turn %d): the conversations differ\n%+v\n%+v", k, r.Session, r.Req.Turn, mr, mc)
		}
		var br struct {
			Salt string `json:"cache_salt"`
			Max  int    `json:"max_output_tokens"`
		}
		var bc struct {
			Salt          string `json:"cache_salt"`
			Max           int    `json:"max_tokens"`
			Stream        bool   `json:"stream"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if json.Unmarshal(r.Req.Body, &br) != nil || json.Unmarshal(c.Req.Body, &bc) != nil || br.Salt != bc.Salt || br.Salt == "" ||
			br.Max != 48 || bc.Max != 48 || !bc.Stream || !bc.StreamOptions.IncludeUsage {
			t.Fatalf("request %d: responses %+v, chat %+v", k, br, bc)
		}
	}
}

// TestAgenticBranches checks that a branch continues its parent's fork:
// its first request, sent as the parent's turn is answered, holds the
// parent's conversation through that turn's call, goes on with the next
// turn's number, and names the endpoint the parent's turn went to; and
// that a branch whose parent ended before its turn never sends.
func TestAgenticBranches(t *testing.T) {
	p, xs := agenticDriven(t, AgenticPressure{}, agenticSeed1)
	byTurn := map[[2]int]fakeExchange{}
	for _, x := range xs {
		byTurn[[2]int{x.Session, x.Req.Turn}] = x
	}
	checked := 0
	for i, s := range p.Sessions {
		if s.After == nil {
			continue
		}
		first, ok := byTurn[[2]int{i, s.After.Turn + 1}]
		if !ok {
			continue
		}
		if first.Req.Prev != "e1" || first.Req.Conversation != i {
			t.Fatalf("branch %d: first request %+v", i, first.Req)
		}
		parent, ok := byTurn[[2]int{s.After.Session, s.After.Turn + 1}]
		if !ok {
			continue // the parent's context was full
		}
		checked++
		// The parent's next turn and the branch's first share the history
		// through the call; only the tool output differs.
		mp, _ := fakeMessages(t, parent.Req)
		mb, _ := fakeMessages(t, first.Req)
		if len(mp) != len(mb) || !reflect.DeepEqual(mp[:len(mp)-1], mb[:len(mb)-1]) || mp[len(mp)-1].Role != "tool" ||
			mp[len(mp)-1].ToolCallID != mb[len(mb)-1].ToolCallID || mp[len(mp)-1].Content == mb[len(mb)-1].Content {
			t.Fatalf("branch %d does not continue session %d's turn %d", i, s.After.Session, s.After.Turn)
		}
		if fork := byTurn[[2]int{s.After.Session, s.After.Turn}]; first.At != fork.At {
			t.Fatalf("branch %d starts at %v, its fork's answer came at %v", i, first.At, fork.At)
		}
	}
	if checked < 5 {
		t.Fatalf("%d branches checked", checked)
	}
	// A parent that ends at once (its first answer fails) leaves its
	// branches nothing to start from.
	q, err := AgenticPressure{Sessions: 2, BranchPercent: 100}.Plan(Options{Seed: 3})
	if err != nil || q.Sessions[1].After == nil {
		t.Fatalf("%v %+v", err, q.Sessions)
	}
	root, branch := q.Sessions[0].Session, q.Sessions[1].Session
	if _, _, done := root.Next(nil); done {
		t.Fatal("the root sent nothing")
	}
	if _, _, done := root.Next(&Answer{Endpoint: "e1"}); !done {
		t.Fatal("the root went on after a failed answer")
	}
	if _, _, done := branch.Next(nil); !done {
		t.Fatal("the branch started without its fork")
	}
}

// TestAgenticBadOptions checks that a bad shape or rate is an error.
func TestAgenticBadOptions(t *testing.T) {
	for _, c := range []struct {
		a AgenticPressure
		o Options
	}{
		{AgenticPressure{}, Options{Rate: -1}},
		{AgenticPressure{}, Options{Rate: math.NaN()}},
		{AgenticPressure{}, Options{MaxModelLen: -1}},
		{AgenticPressure{MinTurns: 6, MaxTurns: 5}, Options{}},
		{AgenticPressure{Start: -time.Second}, Options{}},
	} {
		if _, err := c.a.Plan(c.o); err == nil {
			t.Errorf("%+v %+v: no error", c.a, c.o)
		}
	}
}

// TestAgenticBodies checks that the bodies, assembled from encoded parts,
// are what json.Marshal gives for them as maps (keys sorted, the same
// escaping): the bytes agentic-pressure sent when it built each body as a
// map.
func TestAgenticBodies(t *testing.T) {
	for _, a := range []AgenticPressure{agenticSmall, agenticSmallChat} {
		_, xs := agenticDriven(t, a, Options{Seed: 1, Rate: 1})
		for k, x := range xs {
			if k%5 != 0 {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal(x.Req.Body, &m); err != nil {
				t.Fatalf("%s request %d: %v", a.Name(), k, err)
			}
			if b, _ := json.Marshal(m); !bytes.Equal(b, x.Req.Body) {
				t.Fatalf("%s request %d is not in json.Marshal's form:\n%s\n%s", a.Name(), k, x.Req.Body, b)
			}
		}
	}
}

// TestAgenticTurns follows one root by hand: the answer's text comes back
// in the next request with the turn's call and the tool's output, after a
// think in [Think/4, Think], continuing the answer's endpoint; a failed
// answer or a full context ends the session.
func TestAgenticTurns(t *testing.T) {
	for _, a := range []AgenticPressure{{Sessions: 1}, {Sessions: 1, Chat: true}} {
		p, err := a.Plan(Options{Seed: 5})
		if err != nil {
			t.Fatal(err)
		}
		s := p.Sessions[0].Session
		r1, wait, done := s.Next(nil)
		if done || wait != 0 || r1.Turn != 1 || r1.Conversation != 0 || r1.Prev != "" {
			t.Fatalf("%s turn 1: %+v %v %v", a.Name(), r1, wait, done)
		}
		n := fakePromptTokens(t, r1)
		r2, wait, done := s.Next(&Answer{Endpoint: "e7", Text: "the answer", PromptTokens: n, OK: true})
		if think := a.WithDefaults().Think; done || wait < think/4 || wait > think || r2.Turn != 2 || r2.Prev != "e7" {
			t.Fatalf("%s turn 2: %+v %v %v", a.Name(), r2, wait, done)
		}
		m1, _ := fakeMessages(t, r1)
		m2, _ := fakeMessages(t, r2)
		if len(m2) != len(m1)+2 || !reflect.DeepEqual(m2[:len(m1)], m1) {
			t.Fatalf("%s: turn 2 does not continue turn 1:\n%+v\n%+v", a.Name(), m1, m2)
		}
		reply, out := m2[len(m1)], m2[len(m1)+1]
		if reply.Role != "assistant" || reply.Content != "the answer" || len(reply.ToolCalls) != 1 || reply.ToolCalls[0].ID != "call_0_1" ||
			out.Role != "tool" || out.ToolCallID != "call_0_1" || out.Content == "" {
			t.Fatalf("%s: turn 2 ends %+v, %+v", a.Name(), reply, out)
		}
		if _, _, done := s.Next(&Answer{Endpoint: "e7"}); !done {
			t.Fatalf("%s: a failed answer did not end the session", a.Name())
		}
		// A context that holds turn 1 but not turn 2.
		p, _ = a.Plan(Options{Seed: 5, MaxModelLen: n + 200})
		s = p.Sessions[0].Session
		s.Next(nil)
		if _, _, done := s.Next(&Answer{Endpoint: "e7", Text: "the answer", PromptTokens: n, OK: true}); !done {
			t.Fatalf("%s: turn 2 sent past the context", a.Name())
		}
	}
}
