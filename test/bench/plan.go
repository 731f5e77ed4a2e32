package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/test/workload"
)

// Plan is workload scenario s as a bench Scenario, run on the real clock
// by the plan driver: Run draws s's plan for seed and rate (with the
// client's context length) and drives its sessions.
//
// The plan's seed is seed when Run is handed the seed's first stream,
// rand.NewPCG(seed, 1) — a single run (Options.Seed = seed) and the first
// of --duration's repeats — so a seed is the same workload here and in
// the lab; a later repeat (another stream) draws its seed from its
// stream, so each repeat is a new workload, as for the other scenarios.
func Plan(s workload.Scenario, seed uint64, rate float64) Scenario {
	return planned{s: s, seed: seed, rate: rate}
}

// planned is Plan's Scenario.
type planned struct {
	s    workload.Scenario
	seed uint64
	rate float64
}

// Name is the workload's name.
func (p planned) Name() string { return p.s.Name() }

// Fleet is the fleet the workload is defined for.
func (p planned) Fleet() FleetConfig { return fleetOf(p.s.Fleet()) }

// SLO is the workload's TTFT objective.
func (p planned) SLO() time.Duration { return p.s.SLO() }

// Run draws the plan and drives it through c.
func (p planned) Run(ctx context.Context, c *Client, rng *rand.Rand) ([]Outcome, error) {
	seed := rng.Uint64()
	if seed == rand.New(rand.NewPCG(p.seed, 1)).Uint64() {
		seed = p.seed
	}
	return RunPlan(ctx, c, p.s, workload.Options{Seed: seed, Rate: p.rate, MaxModelLen: c.MaxModelLen})
}

// fleetOf is a workload's fleet as the bench's.
func fleetOf(f workload.Fleet) FleetConfig {
	return FleetConfig{Engines: f.Engines, GPUBlocks: f.GPUBlocks, MaxModelLen: f.MaxModelLen, CPUBlocks: f.CPUBlocks, Profile: f.Profile}
}

// RunPlan draws s's plan for o and drives it through c on the real clock:
// one goroutine per session, a root starting at its Start (simulated time
// from the run's start), a session with After once its parent has been
// handed the answer to that turn or has ended; each request sent after
// the session's wait (simulated, through c.Wait) and its answer handed
// back to the session. A request's PrevEndpoint is its Prev or, when that
// is empty on a turn after the first, the endpoint of the conversation's
// latest answered turn before it at send time. Outcomes are returned in
// the order they were sent; an error means the plan could not be drawn
// (or ctx ended).
func RunPlan(ctx context.Context, c *Client, s workload.Scenario, o workload.Options) ([]Outcome, error) {
	plan, err := s.Plan(o)
	if err != nil {
		return nil, err
	}
	n := len(plan.Sessions)
	// waiters[i]: the sessions starting after one of i's turns, and the
	// channel each waits on.
	type waiter struct {
		turn  int
		ready chan struct{}
	}
	waiters := make([][]waiter, n)
	ready := make([]chan struct{}, n)
	for i, p := range plan.Sessions {
		if p.Session == nil {
			return nil, fmt.Errorf("%s: session %d is nil", s.Name(), i)
		}
		if p.After == nil {
			continue
		}
		if err := checkAfter(plan, i); err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name(), err)
		}
		ready[i] = make(chan struct{})
		waiters[p.After.Session] = append(waiters[p.After.Session], waiter{p.After.Turn, ready[i]})
	}
	d := &planDriver{c: c, answered: map[int]map[int]string{}}
	start := time.Now()
	var wg sync.WaitGroup
	for i, p := range plan.Sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws := waiters[i]
			// release starts the waiters on turns up to turn (all: -1).
			release := func(turn int) {
				ws = slices.DeleteFunc(ws, func(w waiter) bool {
					if turn >= 0 && w.turn > turn {
						return false
					}
					close(w.ready)
					return true
				})
			}
			defer release(-1)
			if p.After != nil {
				select {
				case <-ctx.Done():
					return
				case <-ready[i]:
				}
			} else if !c.WaitUntil(ctx, start.Add(c.Wall(p.Start))) {
				return
			}
			d.drive(ctx, p.Session, release)
		}()
	}
	wg.Wait()
	// Arrival order: the order the pooled bound replays.
	slices.SortStableFunc(d.outcomes, func(x, y Outcome) int { return x.Start.Compare(y.Start) })
	return d.outcomes, ctx.Err()
}

// checkAfter fails when session i's After names no session, or a chain of
// Afters from it comes back to it (the sessions would wait for each other).
func checkAfter(plan workload.Plan, i int) error {
	for j, hops := i, 0; plan.Sessions[j].After != nil; hops++ {
		j = plan.Sessions[j].After.Session
		if j < 0 || j >= len(plan.Sessions) {
			return fmt.Errorf("session %d starts after session %d of %d", i, j, len(plan.Sessions))
		}
		if j == i || hops > len(plan.Sessions) {
			return fmt.Errorf("session %d starts after itself", i)
		}
	}
	return nil
}

// planDriver is a plan's run: the client, the outcomes, and each
// conversation's answered turns (for PrevEndpoint).
type planDriver struct {
	c        *Client
	mu       sync.Mutex
	outcomes []Outcome
	answered map[int]map[int]string // conversation → turn → endpoint
}

// drive runs one session to its end: each request after its wait, its
// answer handed back; release(turn) is called once turn's answer has been
// handed. It ends at the session's done, a failed request, or ctx.
func (d *planDriver) drive(ctx context.Context, s workload.Session, release func(turn int)) {
	var prev *workload.Answer
	for sent := 0; ; {
		req, wait, done := s.Next(prev)
		if prev != nil {
			release(sent)
			if !prev.OK {
				return // a session ends at its first failure
			}
		}
		if done || wait > 0 && !d.c.Wait(ctx, wait) {
			return
		}
		if req.Prev == "" && req.Turn > 1 {
			req.Prev = d.latest(req.Conversation, req.Turn)
		}
		o, a := d.c.Send(ctx, req)
		d.mu.Lock()
		d.outcomes = append(d.outcomes, o)
		if a.OK {
			if d.answered[req.Conversation] == nil {
				d.answered[req.Conversation] = map[int]string{}
			}
			d.answered[req.Conversation][req.Turn] = a.Endpoint
		}
		d.mu.Unlock()
		prev, sent = &a, req.Turn
	}
}

// latest is the endpoint of conversation's highest answered turn before
// turn ("" when none).
func (d *planDriver) latest(conversation, turn int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	best, endpoint := 0, ""
	for t, e := range d.answered[conversation] {
		if t < turn && t > best {
			best, endpoint = t, e
		}
	}
	return endpoint
}
