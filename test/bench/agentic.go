package bench

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/test/workload"
)

// AgenticPressure is workload.AgenticPressure (agentic-pressure, or with
// Chat agentic-chat) as a bench Scenario: the same fields and defaults,
// run by the plan driver (RunPlan). Its plan's seed is drawn from the
// run's random stream; Plan(workload.AgenticPressure{…}, seed, rate) runs
// a given seed, as `kvroute bench` does. The faults scenario's load reuses
// its shape and agent types.
type AgenticPressure workload.AgenticPressure

// Demo is `kvroute demo`'s workload, workload.Demo.
func Demo() AgenticPressure { return AgenticPressure(workload.Demo()) }

// Name is the scenario's name.
func (a AgenticPressure) Name() string { return workload.AgenticPressure(a).Name() }

// Fleet is the fleet the scenario is defined for.
func (a AgenticPressure) Fleet() FleetConfig { return fleetOf(workload.AgenticPressure(a).Fleet()) }

// Run draws the plan from rng and drives every session.
func (a AgenticPressure) Run(ctx context.Context, c *Client, rng *rand.Rand) ([]Outcome, error) {
	return RunPlan(ctx, c, workload.AgenticPressure(a), workload.Options{Seed: rng.Uint64(), Rate: 1, MaxModelLen: c.MaxModelLen})
}

func (a AgenticPressure) withDefaults() AgenticPressure {
	return AgenticPressure(workload.AgenticPressure(a).WithDefaults())
}

// agentType is a drawn agent type as the faults scenario's sessions send
// it.
type agentType struct {
	instructions string
	tools        []any
	toolNames    []string
}

// session is a drawn session's shape.
type session struct {
	id, typ, tenant, turns int
	parent, at             int // branch: parent session and its turn; parent -1 otherwise
	thinks                 []time.Duration
	toolTokens             []int
	forks                  map[int][]int // turn → the branches starting from it
}

// plan draws the agent types and the sessions from rng (workload's Draw).
func (a AgenticPressure) plan(rng *rand.Rand) ([]agentType, []*session) {
	ts, drawn := workload.AgenticPressure(a).Draw(rng)
	types := make([]agentType, len(ts))
	for i, t := range ts {
		types[i] = agentType{instructions: t.Instructions, tools: t.Tools, toolNames: t.ToolNames}
	}
	ss := make([]*session, len(drawn))
	for i, d := range drawn {
		s := &session{id: d.ID, typ: d.Type, tenant: d.Tenant, turns: d.Turns, parent: d.Parent, at: d.At,
			thinks: d.Thinks, toolTokens: d.ToolTokens, forks: map[int][]int{}}
		if d.Parent >= 0 {
			p := ss[d.Parent]
			p.forks[d.At] = append(p.forks[d.At], d.ID)
		}
		ss[i] = s
	}
	return types, ss
}

// toolOutput is a function_call_output item of n tokens.
func toolOutput(rng *rand.Rand, callID string, n int) map[string]any {
	return map[string]any{"type": "function_call_output", "call_id": callID, "output": workload.Text(rng, n)}
}
