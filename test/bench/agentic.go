package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
	"github.com/kvroute/kvroute/test/workload"
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
	// [2 s]. Start spreads the sessions' first requests [5 s].
	Think, Start time.Duration
	// Label names the scenario in results [agentic-pressure].
	Label string
}

func (a AgenticPressure) withDefaults() AgenticPressure {
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
	a.Label = cmp.Or(a.Label, "agentic-pressure")
	return a
}

// Name is the scenario's name.
func (a AgenticPressure) Name() string { return a.withDefaults().Label }

// Fleet is the fleet the scenario is defined for.
func (a AgenticPressure) Fleet() FleetConfig {
	a = a.withDefaults()
	return FleetConfig{Engines: a.Engines, GPUBlocks: a.GPUBlocks}
}

// agentType is a system prompt and tools shared by the sessions of a type.
type agentType struct {
	instructions string
	tools        []any
	toolNames    []string
}

// session is one agent conversation; a branch starts from another's turn.
type session struct {
	id, typ, tenant, turns int
	parent, at             int // branch: parent session and its turn; parent -1 otherwise
	thinks                 []time.Duration
	toolTokens             []int
	seed                   uint64
	start                  time.Duration
	forks                  map[int]*fork // turn → the history branches start from
}

// fork is a session's history after a turn's call, before its output.
type fork struct {
	ready    chan struct{}
	input    []any
	endpoint string
	tokens   int // the history's prompt tokens (≈, less the template's markers)
}

// plan draws the agent types and the sessions from rng.
func (a AgenticPressure) plan(rng *rand.Rand) ([]agentType, []*session) {
	types := make([]agentType, a.AgentTypes)
	for t := range types {
		n := 3 + rng.IntN(4)
		for k := 0; k < n; k++ {
			name := fmt.Sprintf("agent%d_%s_%d", t, workload.Words(rng, 1), k)
			types[t].toolNames = append(types[t].toolNames, name)
			types[t].tools = append(types[t].tools, map[string]any{"type": "function", "name": name, "description": workload.Text(rng, 20+rng.IntN(40)),
				"parameters": map[string]any{"type": "object", "properties": map[string]any{
					"query": map[string]any{"type": "string", "description": workload.Text(rng, 10)},
					"limit": map[string]any{"type": "integer"}}, "required": []string{"query"}}})
		}
		// The system prompt is the instructions and the tools' block.
		toolsJSON, _ := json.Marshal(types[t].tools)
		size := a.SystemMin + rng.IntN(a.SystemMax-a.SystemMin+1)
		types[t].instructions = fmt.Sprintf("You are agent type %d. ", t) + workload.Text(rng, max(100, size-len(chat.Encode(string(toolsJSON)))))
	}
	var ss []*session
	for i := 0; i < a.Sessions; i++ {
		s := &session{id: i, parent: -1, seed: rng.Uint64(), forks: map[int]*fork{}}
		s.start = time.Duration(rng.Int64N(int64(a.Start) + 1))
		var roots []*session
		for _, p := range ss {
			if p.parent < 0 && p.turns >= 2 {
				roots = append(roots, p)
			}
		}
		if len(roots) > 0 && rng.IntN(100) < a.BranchPercent {
			p := roots[rng.IntN(len(roots))]
			s.parent, s.at, s.typ, s.tenant = p.id, 1+rng.IntN(p.turns-1), p.typ, p.tenant
			if p.forks[s.at] == nil {
				p.forks[s.at] = &fork{ready: make(chan struct{})}
			}
			s.turns = s.at + 2 + rng.IntN(max(1, a.MaxTurns-s.at-1))
		} else {
			s.typ, s.tenant = rng.IntN(a.AgentTypes), rng.IntN(a.Tenants)
			s.turns = a.MinTurns + rng.IntN(a.MaxTurns-a.MinTurns+1)
		}
		for k := 0; k < s.turns; k++ {
			s.thinks = append(s.thinks, a.Think/4+time.Duration(rng.Int64N(int64(a.Think-a.Think/4)+1)))
			s.toolTokens = append(s.toolTokens, a.ToolMin+rng.IntN(a.ToolMax-a.ToolMin+1))
		}
		ss = append(ss, s)
	}
	return types, ss
}

// Run runs every session concurrently and returns the outcomes in the
// order they were sent.
func (a AgenticPressure) Run(ctx context.Context, c *Client, rng *rand.Rand) ([]Outcome, error) {
	a = a.withDefaults()
	if a.Engines < 1 || a.Sessions < 1 || a.AgentTypes < 1 || a.Tenants < 1 || a.Start < 0 || a.MinTurns < 1 || a.MaxTurns < a.MinTurns || a.SystemMax < a.SystemMin || a.ToolMax < a.ToolMin || a.Think <= 0 {
		return nil, fmt.Errorf("agentic scenario: bad shape %+v", a)
	}
	types, sessions := a.plan(rng)
	salts := make([]string, a.Tenants)
	for t := range salts {
		salts[t] = fmt.Sprintf("tenant-%d-%016x", t, rng.Uint64())
	}
	var mu sync.Mutex
	var outcomes []Outcome
	record := func(o Outcome) {
		mu.Lock()
		outcomes = append(outcomes, o)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.runSession(ctx, c, s, sessions, types[s.typ], salts[s.tenant], record)
		}()
	}
	wg.Wait()
	// Arrival order: the order the pooled bound replays.
	slices.SortStableFunc(outcomes, func(x, y Outcome) int { return x.Start.Compare(y.Start) })
	return outcomes, ctx.Err()
}

// runSession sends one session's turns; it publishes the forks branches
// wait for, and on leaving releases any it did not reach.
func (a AgenticPressure) runSession(ctx context.Context, c *Client, s *session, all []*session, t agentType, salt string, record func(Outcome)) {
	defer func() {
		for _, f := range s.forks {
			select {
			case <-f.ready:
			default:
				close(f.ready) // not reached: the branch gives up
			}
		}
	}()
	rng := rand.New(rand.NewPCG(s.seed, uint64(s.id)))
	var input []any
	prev, turn := "", 1
	if s.parent >= 0 {
		f := all[s.parent].forks[s.at]
		select {
		case <-ctx.Done():
			return
		case <-f.ready:
		}
		if f.input == nil {
			return
		}
		out := toolOutput(rng, fmt.Sprintf("call_%d_%d", s.parent, s.at), s.toolTokens[s.at-1])
		if c.MaxModelLen > 0 && f.tokens+len(chat.Encode(out["output"].(string)))+100+a.OutputTokens > c.MaxModelLen {
			return // the branch's first prompt would not fit
		}
		input, prev, turn = append(slices.Clone(f.input), out), f.endpoint, s.at+1
	} else {
		if !c.Wait(ctx, s.start) {
			return
		}
		input = []any{map[string]any{"role": "user", "content": fmt.Sprintf("Task %d: ", s.id) + workload.Text(rng, 60+rng.IntN(200))}}
	}
	for ; turn <= s.turns; turn++ {
		o, answer := c.Responses(ctx, map[string]any{"model": "Qwen/Qwen3-0.6B", "instructions": t.instructions, "tools": t.tools,
			"input": input, "max_output_tokens": a.OutputTokens, "cache_salt": salt})
		o.Conversation, o.Turn, o.PrevEndpoint = s.id, turn, prev
		record(o)
		if o.Err != nil || turn == s.turns {
			return
		}
		prev = o.Endpoint
		call := fmt.Sprintf("call_%d_%d", s.id, turn)
		args := fmt.Sprintf(`{"query":%q,"limit":%d}`, workload.Words(rng, 6), 1+rng.IntN(50))
		input = append(input,
			map[string]any{"type": "message", "role": "assistant", "content": answer},
			map[string]any{"type": "function_call", "call_id": call, "name": t.toolNames[rng.IntN(len(t.toolNames))], "arguments": args})
		history := o.PromptTokens + len(chat.Encode(answer)) + len(chat.Encode(args))
		if f := s.forks[turn]; f != nil {
			f.input, f.endpoint, f.tokens = slices.Clone(input), o.Endpoint, history
			close(f.ready)
		}
		out := toolOutput(rng, call, s.toolTokens[turn-1])
		input = append(input, out)
		// The next prompt must fit the engines' context with its output
		// (the template's markers and the tool's name ≤ 100 tokens).
		if c.MaxModelLen > 0 && history+len(chat.Encode(out["output"].(string)))+100+a.OutputTokens > c.MaxModelLen {
			return
		}
		if !c.Wait(ctx, s.thinks[turn-1]) {
			return
		}
	}
}

// toolOutput is a function_call_output item of n tokens.
func toolOutput(rng *rand.Rand, callID string, n int) map[string]any {
	return map[string]any{"type": "function_call_output", "call_id": callID, "output": workload.Text(rng, n)}
}

// Demo is `kvroute demo`'s workload: a short agentic-pressure on four
// engines — 16 sessions of 4 agent types for 4–8 turns, 2 tenants, a
// working set ≈ 1.3× the fleet's KV — about a dozen seconds per policy in
// real time.
func Demo() AgenticPressure {
	return AgenticPressure{Label: "demo (short agentic-pressure)", Engines: 4, GPUBlocks: 768, Sessions: 16, AgentTypes: 4, Tenants: 2,
		MinTurns: 4, MaxTurns: 8, SystemMin: 1500, SystemMax: 3000, ToolMin: 150, ToolMax: 600, BranchPercent: 20,
		OutputTokens: 24, Think: time.Second, Start: 2 * time.Second}
}
