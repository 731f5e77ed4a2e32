package workload

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// AgenticPressure is many concurrent agent sessions over a few agent types
// (DESIGN.md §9): each type has its own system prompt and tools, shared by
// its sessions; a session is a task followed by turns of tool calls whose
// outputs go back in the next request, as agentic-api sends them (the whole
// conversation, rehydrated, every turn). Some sessions branch from an
// earlier turn of another. Sessions belong to tenants, each with its own
// cache_salt, so only sessions of one tenant and type share a prompt. The
// default shape's working set is about twice the fleet's KV capacity.
//
// By default the conversations go to /v1/responses (agentic-pressure);
// with Chat the same conversations go to /v1/chat/completions with the
// whole message history (agentic-chat, AgenticChat): the same draws, so
// the two send the same sessions, turns and texts for a seed.
//
// A session's turn is sent after the answer to the one before: the
// answer's text comes back in the next input with the turn's tool call and
// the tool's output, after a think (the tool running). A branch starts
// once its parent has been handed the answer to the turn it branches from
// (Planned.After), from the parent's history after that turn's call, and
// continues on the endpoint that turn went to. A session stops before a
// prompt that would not fit Options.MaxModelLen.
//
// Zero fields take the defaults in brackets.
type AgenticPressure struct {
	Engines    int // [8]
	GPUBlocks  int // KV blocks per engine [4096]
	Sessions   int // concurrent sessions, branches included [64]
	AgentTypes int // [4]
	Tenants    int // [4]
	// MinTurns and MaxTurns bound a session's tool-call turns [5, 20]; a
	// session also ends when its context would not fit the engines'.
	MinTurns, MaxTurns int
	// SystemMin and SystemMax bound an agent type's system prompt with
	// its tools, in tokens [2000, 6000].
	SystemMin, SystemMax int
	// ToolMin and ToolMax bound a tool output in tokens [200, 2000].
	ToolMin, ToolMax int
	// BranchPercent of sessions branch from an earlier turn of another
	// session [20; 0 takes the default, so a negative value means none].
	BranchPercent int
	OutputTokens  int // per turn [48]
	// Think is the longest pause between a session's turns (the tool
	// running), in simulated time; pauses are uniform in [Think/4, Think]
	// [2 s]. Start spreads the sessions' first requests at the nominal
	// rate [5 s].
	Think, Start time.Duration
	// Chat sends the conversations to /v1/chat/completions instead of
	// /v1/responses (agentic-chat).
	Chat bool
	// TTFTSLO is SLO's TTFT objective [2 s]. On the default shape
	// (docs/benchmarks.md, agentic-pressure, seed 1) precise's p90 TTFT
	// was 1.7 s, prefix-hash's 2.4 s, round-robin's 3.1 s and
	// least-loaded's 5.1 s: 2 s is met by keeping sessions warm and missed
	// by routing blind to the cache, and it is about the cold prefill of a
	// 20k-token session (10,000 prompt tokens a second), the middle of the
	// 32k context sessions grow into.
	TTFTSLO time.Duration
	// Label names the scenario in results [agentic-pressure, or
	// agentic-chat with Chat].
	Label string
}

// AgenticChat is agentic-pressure's chat-completions twin: the default
// shape with Chat.
func AgenticChat() AgenticPressure { return AgenticPressure{Chat: true} }

// Demo is `kvroute demo`'s workload: a short agentic-pressure on four
// engines — 16 sessions of 4 agent types for 4–8 turns, 2 tenants, a
// working set ≈ 1.3× the fleet's KV — about a dozen seconds per policy in
// real time. Its TTFT objective is 500 ms: in docs/benchmarks.md's demo
// run precise's p90 was 400 ms, prefix-hash's 522 ms, round-robin's
// 787 ms and least-loaded's 1,317 ms.
func Demo() AgenticPressure {
	return AgenticPressure{Label: "demo (short agentic-pressure)", Engines: 4, GPUBlocks: 768, Sessions: 16, AgentTypes: 4, Tenants: 2,
		MinTurns: 4, MaxTurns: 8, SystemMin: 1500, SystemMax: 3000, ToolMin: 150, ToolMax: 600, BranchPercent: 20,
		OutputTokens: 24, Think: time.Second, Start: 2 * time.Second, TTFTSLO: 500 * time.Millisecond}
}

// WithDefaults is a with its zero fields set to their defaults.
func (a AgenticPressure) WithDefaults() AgenticPressure {
	a.Engines = cmp.Or(a.Engines, 8)
	a.GPUBlocks = cmp.Or(a.GPUBlocks, 4096)
	a.Sessions = cmp.Or(a.Sessions, 64)
	a.AgentTypes = cmp.Or(a.AgentTypes, 4)
	a.Tenants = cmp.Or(a.Tenants, 4)
	a.MinTurns, a.MaxTurns = cmp.Or(a.MinTurns, 5), cmp.Or(a.MaxTurns, 20)
	a.SystemMin, a.SystemMax = cmp.Or(a.SystemMin, 2000), cmp.Or(a.SystemMax, 6000)
	a.ToolMin, a.ToolMax = cmp.Or(a.ToolMin, 200), cmp.Or(a.ToolMax, 2000)
	a.BranchPercent = cmp.Or(a.BranchPercent, 20)
	a.OutputTokens = cmp.Or(a.OutputTokens, 48)
	a.Think, a.Start = cmp.Or(a.Think, 2*time.Second), cmp.Or(a.Start, 5*time.Second)
	a.TTFTSLO = cmp.Or(a.TTFTSLO, 2*time.Second)
	name := "agentic-pressure"
	if a.Chat {
		name = "agentic-chat"
	}
	a.Label = cmp.Or(a.Label, name)
	return a
}

// Name is the scenario's name: agentic-pressure, agentic-chat, or Label.
func (a AgenticPressure) Name() string { return a.WithDefaults().Label }

// Fleet is the fleet the scenario is defined for (the context length is
// the driver's default).
func (a AgenticPressure) Fleet() Fleet {
	a = a.WithDefaults()
	return Fleet{Engines: a.Engines, GPUBlocks: a.GPUBlocks}
}

// SLO is the TTFT objective for goodput: TTFTSLO [2 s].
func (a AgenticPressure) SLO() time.Duration { return a.WithDefaults().TTFTSLO }

// check fails on a shape Draw cannot draw from (defaults applied).
func (a AgenticPressure) check() error {
	if a.Engines < 1 || a.GPUBlocks < 1 || a.Sessions < 1 || a.AgentTypes < 1 || a.Tenants < 1 || a.Start < 0 || a.MinTurns < 1 ||
		a.MaxTurns < a.MinTurns || a.SystemMin < 0 || a.SystemMax < a.SystemMin || a.ToolMin < 0 || a.ToolMax < a.ToolMin ||
		a.OutputTokens < 1 || a.Think <= 0 {
		return fmt.Errorf("%s scenario: bad shape %+v", a.Label, a)
	}
	return nil
}

// AgentType is an agent type: a system prompt and tools, shared by the
// sessions of the type.
type AgentType struct {
	// Instructions is the system prompt (the tools aside).
	Instructions string
	// Tools are the function tools in the Responses form:
	// {"type":"function","name","description","parameters"}.
	Tools     []any
	ToolNames []string
}

// chatTools is t's tools in the chat form:
// {"type":"function","function":{"name","description","parameters"}}.
func (t AgentType) chatTools() []any {
	out := make([]any, len(t.Tools))
	for i, x := range t.Tools {
		m := x.(map[string]any)
		out[i] = map[string]any{"type": "function", "function": map[string]any{
			"name": m["name"], "description": m["description"], "parameters": m["parameters"]}}
	}
	return out
}

// AgenticSession is a session's drawn shape.
type AgenticSession struct {
	ID, Type, Tenant int
	// Turns is the turn the session ends at, unless the context ends it
	// sooner; a branch's turns are numbered on from its parent's (its
	// first is At+1).
	Turns int
	// Parent and At: a branch starts from turn At of session Parent;
	// Parent is -1 for a root.
	Parent, At int
	// Start is a root's first request's offset at the nominal rate (drawn
	// for a branch too, unused).
	Start time.Duration
	// Thinks[k] is the pause after turn k+1's answer; ToolTokens[k] the
	// size of turn k+1's tool output.
	Thinks     []time.Duration
	ToolTokens []int
	// Seed is the session's own random stream (its task, tool calls and
	// outputs).
	Seed uint64
}

// Draw draws the agent types and the sessions from rng, as Plan does
// first; a's zero fields take their defaults, and its shape must be one
// Plan accepts.
func (a AgenticPressure) Draw(rng *rand.Rand) ([]AgentType, []AgenticSession) {
	a = a.WithDefaults()
	types := make([]AgentType, a.AgentTypes)
	for t := range types {
		n := 3 + rng.IntN(4)
		for k := 0; k < n; k++ {
			name := fmt.Sprintf("agent%d_%s_%d", t, Words(rng, 1), k)
			types[t].ToolNames = append(types[t].ToolNames, name)
			types[t].Tools = append(types[t].Tools, map[string]any{"type": "function", "name": name, "description": Text(rng, 20+rng.IntN(40)),
				"parameters": map[string]any{"type": "object", "properties": map[string]any{
					"query": map[string]any{"type": "string", "description": Text(rng, 10)},
					"limit": map[string]any{"type": "integer"}}, "required": []string{"query"}}})
		}
		// The system prompt is the instructions and the tools' block.
		toolsJSON, _ := json.Marshal(types[t].Tools)
		size := a.SystemMin + rng.IntN(a.SystemMax-a.SystemMin+1)
		types[t].Instructions = fmt.Sprintf("You are agent type %d. ", t) + Text(rng, max(100, size-len(chat.Encode(string(toolsJSON)))))
	}
	var ss []AgenticSession
	for i := 0; i < a.Sessions; i++ {
		s := AgenticSession{ID: i, Parent: -1, Seed: rng.Uint64()}
		s.Start = time.Duration(rng.Int64N(int64(a.Start) + 1))
		var roots []int
		for _, p := range ss {
			if p.Parent < 0 && p.Turns >= 2 {
				roots = append(roots, p.ID)
			}
		}
		if len(roots) > 0 && rng.IntN(100) < a.BranchPercent {
			p := ss[roots[rng.IntN(len(roots))]]
			s.Parent, s.At, s.Type, s.Tenant = p.ID, 1+rng.IntN(p.Turns-1), p.Type, p.Tenant
			s.Turns = s.At + 2 + rng.IntN(max(1, a.MaxTurns-s.At-1))
		} else {
			s.Type, s.Tenant = rng.IntN(a.AgentTypes), rng.IntN(a.Tenants)
			s.Turns = a.MinTurns + rng.IntN(a.MaxTurns-a.MinTurns+1)
		}
		for k := 0; k < s.Turns; k++ {
			s.Thinks = append(s.Thinks, a.Think/4+time.Duration(rng.Int64N(int64(a.Think-a.Think/4)+1)))
			s.ToolTokens = append(s.ToolTokens, a.ToolMin+rng.IntN(a.ToolMax-a.ToolMin+1))
		}
		ss = append(ss, s)
	}
	return types, ss
}

// agenticStream is the PCG stream Plan draws from: the bench's first
// stream, so a seed gives the workload agentic-pressure drew for it when
// it ran in test/bench alone.
const agenticStream = 1

// agenticModel is the model the requests name.
const agenticModel = "Qwen/Qwen3-0.6B"

// agenticMargin bounds the chat template's markers and a tool call's name
// in a prompt, in tokens, for the context check.
const agenticMargin = 100

// Plan draws the run for o: the agent types, the sessions and the
// tenants' salts from o.Seed; roots start at their drawn offset ÷ o.Rate
// (0 taken as 1), branches after their parent's turn.
func (a AgenticPressure) Plan(o Options) (Plan, error) {
	a = a.WithDefaults()
	if err := a.check(); err != nil {
		return Plan{}, err
	}
	rate := cmp.Or(o.Rate, 1)
	if !(rate > 0) || math.IsInf(rate, 1) || o.MaxModelLen < 0 {
		return Plan{}, fmt.Errorf("%s scenario: rate %v, context %d: want a positive rate and context", a.Label, o.Rate, o.MaxModelLen)
	}
	rng := rand.New(rand.NewPCG(o.Seed, agenticStream))
	types, ss := a.Draw(rng)
	r := &agenticRun{a: a, types: types, maxModelLen: o.MaxModelLen, forks: map[agenticForkKey]*agenticFork{}}
	for t := 0; t < a.Tenants; t++ {
		r.salts = append(r.salts, agenticJSON(fmt.Sprintf("tenant-%d-%016x", t, rng.Uint64())))
	}
	for _, t := range types {
		if a.Chat {
			r.system = append(r.system, agenticJSON(map[string]any{"role": "system", "content": t.Instructions}))
			r.tools = append(r.tools, agenticJSON(t.chatTools()))
		} else {
			r.system = append(r.system, agenticJSON(t.Instructions))
			r.tools = append(r.tools, agenticJSON(t.Tools))
		}
	}
	forkAt := make([]map[int]bool, len(ss))
	for _, s := range ss {
		if s.Parent >= 0 {
			if forkAt[s.Parent] == nil {
				forkAt[s.Parent] = map[int]bool{}
			}
			forkAt[s.Parent][s.At] = true
		}
	}
	p := Plan{Sessions: make([]Planned, len(ss))}
	for i := range ss {
		s := &agenticSession{run: r, s: ss[i], forkAt: forkAt[i]}
		p.Sessions[i].Session = s
		if s.s.Parent >= 0 {
			p.Sessions[i].After = &After{Session: s.s.Parent, Turn: s.s.At}
		} else {
			p.Sessions[i].Start = time.Duration(float64(s.s.Start) / rate)
		}
	}
	return p, nil
}

// agenticRun is a plan's shared state: what its sessions read, and the
// forks branches start from, written by one session's driver and read by
// another's (so guarded by mu).
type agenticRun struct {
	a     AgenticPressure
	types []AgentType
	// The bodies' constant parts, encoded: by tenant its cache_salt, by
	// type its instructions (Responses) or system message (chat) and its
	// tools in the form's shape.
	salts, system, tools []json.RawMessage
	maxModelLen          int

	mu    sync.Mutex
	forks map[agenticForkKey]*agenticFork
}

type agenticForkKey struct{ session, turn int }

// agenticFork is a session's history after a turn's call, before its
// output: where a branch starts.
type agenticFork struct {
	history  []json.RawMessage // the input items or chat messages (the system message aside)
	endpoint string
	tokens   int // the history's prompt tokens (≈, less the template's markers)
}

// agenticSession is one agent conversation as a Session.
type agenticSession struct {
	run    *agenticRun
	s      AgenticSession
	forkAt map[int]bool // turns branches start from

	rng     *rand.Rand
	turn    int // the last turn sent (0: none yet)
	over    bool
	history []json.RawMessage // input items (Responses) or messages after the system message (chat)
	prev    string            // the endpoint of the last answer
}

// Next returns the session's first turn (a root's task, or a branch's
// tool output on its parent's fork), then each turn after the answer to
// the one before.
func (s *agenticSession) Next(prev *Answer) (Request, time.Duration, bool) {
	switch {
	case s.over:
		return Request{}, 0, true
	case s.turn == 0:
		return s.first()
	case prev == nil || !prev.OK || s.turn >= s.s.Turns:
		return s.end()
	}
	r, a := s.run, s.run.a
	turn := s.turn
	s.prev = prev.Endpoint
	call := fmt.Sprintf("call_%d_%d", s.s.ID, turn)
	args := fmt.Sprintf(`{"query":%q,"limit":%d}`, Words(s.rng, 6), 1+s.rng.IntN(50))
	name := r.types[s.s.Type].ToolNames[s.rng.IntN(len(r.types[s.s.Type].ToolNames))]
	s.history = append(s.history, r.answerItems(prev.Text, call, name, args)...)
	history := prev.PromptTokens + len(chat.Encode(prev.Text)) + len(chat.Encode(args))
	if s.forkAt[turn] {
		r.mu.Lock()
		r.forks[agenticForkKey{s.s.ID, turn}] = &agenticFork{history: slices.Clone(s.history), endpoint: prev.Endpoint, tokens: history}
		r.mu.Unlock()
	}
	out := Text(s.rng, s.s.ToolTokens[turn-1])
	s.history = append(s.history, r.outputItem(call, out))
	// The next prompt must fit the engines' context with its output.
	if r.maxModelLen > 0 && history+len(chat.Encode(out))+agenticMargin+a.OutputTokens > r.maxModelLen {
		return s.end()
	}
	s.turn++
	return r.request(s.s, s.turn, s.history, s.prev), s.s.Thinks[turn-1], false
}

// first is a root's first turn, or a branch's on its parent's fork (none
// when the parent ended before the fork, or its prompt would not fit).
func (s *agenticSession) first() (Request, time.Duration, bool) {
	r := s.run
	s.rng = rand.New(rand.NewPCG(s.s.Seed, uint64(s.s.ID)))
	if s.s.Parent < 0 {
		s.history = []json.RawMessage{agenticJSON(map[string]any{"role": "user", "content": fmt.Sprintf("Task %d: ", s.s.ID) + Text(s.rng, 60+s.rng.IntN(200))})}
		s.turn = 1
		return r.request(s.s, 1, s.history, ""), 0, false
	}
	r.mu.Lock()
	f := r.forks[agenticForkKey{s.s.Parent, s.s.At}]
	r.mu.Unlock()
	if f == nil {
		return s.end()
	}
	out := Text(s.rng, s.s.ToolTokens[s.s.At-1])
	if r.maxModelLen > 0 && f.tokens+len(chat.Encode(out))+agenticMargin+r.a.OutputTokens > r.maxModelLen {
		return s.end()
	}
	s.history = append(slices.Clone(f.history), r.outputItem(fmt.Sprintf("call_%d_%d", s.s.Parent, s.s.At), out))
	s.turn, s.prev = s.s.At+1, f.endpoint
	return r.request(s.s, s.turn, s.history, s.prev), 0, false
}

func (s *agenticSession) end() (Request, time.Duration, bool) {
	s.over, s.history = true, nil
	return Request{}, 0, true
}

// answerItems is a turn's answer in the history: its text and its tool
// call — a message and a function_call item (Responses), or an assistant
// message with a tool_calls entry (chat).
func (r *agenticRun) answerItems(text, call, name, args string) []json.RawMessage {
	if r.a.Chat {
		return []json.RawMessage{agenticJSON(map[string]any{"role": "assistant", "content": text, "tool_calls": []any{
			map[string]any{"id": call, "type": "function", "function": map[string]any{"name": name, "arguments": args}}}})}
	}
	return []json.RawMessage{
		agenticJSON(map[string]any{"type": "message", "role": "assistant", "content": text}),
		agenticJSON(map[string]any{"type": "function_call", "call_id": call, "name": name, "arguments": args})}
}

// outputItem is a tool's output in the history: a function_call_output
// item (Responses) or a tool message (chat).
func (r *agenticRun) outputItem(call, out string) json.RawMessage {
	if r.a.Chat {
		return agenticJSON(map[string]any{"role": "tool", "tool_call_id": call, "content": out})
	}
	return agenticJSON(map[string]any{"type": "function_call_output", "call_id": call, "output": out})
}

// request is s's turn with history: a streaming Responses request with
// the type's instructions and tools, or a chat one with the system
// message first and usage asked for; the tenant's cache_salt either way.
// The body is assembled from the encoded parts, in the bytes json.Marshal
// gives for the body as a map (keys sorted), without encoding the history
// again each turn.
func (r *agenticRun) request(s AgenticSession, turn int, history []json.RawMessage, prev string) Request {
	n := 256 + len(r.salts[s.Tenant]) + len(r.system[s.Type]) + len(r.tools[s.Type])
	for _, h := range history {
		n += len(h) + 1
	}
	b := make([]byte, 0, n)
	b = append(append(b, `{"cache_salt":`...), r.salts[s.Tenant]...)
	// items appends the history, each item after a comma or the first
	// after none.
	items := func(b []byte, first bool) []byte {
		for _, h := range history {
			if !first {
				b = append(b, ',')
			}
			b, first = append(b, h...), false
		}
		return append(b, ']')
	}
	path := "/v1/responses"
	if r.a.Chat {
		path = "/v1/chat/completions"
		b = strconv.AppendInt(append(b, `,"max_tokens":`...), int64(r.a.OutputTokens), 10)
		b = items(append(append(b, `,"messages":[`...), r.system[s.Type]...), false)
		b = append(b, `,"model":"`+agenticModel+`","stream":true,"stream_options":{"include_usage":true},"tools":`...)
	} else {
		b = items(append(b, `,"input":[`...), true)
		b = append(append(b, `,"instructions":`...), r.system[s.Type]...)
		b = strconv.AppendInt(append(b, `,"max_output_tokens":`...), int64(r.a.OutputTokens), 10)
		b = append(b, `,"model":"`+agenticModel+`","stream":true,"tools":`...)
	}
	b = append(append(b, r.tools[s.Type]...), '}')
	return Request{Path: path, Body: b, Conversation: s.ID, Turn: turn, Prev: prev}
}

// agenticJSON is v encoded.
func agenticJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // strings, numbers and maps of them always encode
	}
	return b
}
