package sched_test

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// TestPriorityOrder: the order requests are admitted in, one at a time
// (max_num_seqs 1, one token each), under each policy. fcfs ignores the
// priority; priority takes the lowest value first, ties by arrival, then
// by the order they were added (vLLM's request id).
func TestPriorityOrder(t *testing.T) {
	type req struct {
		id       sched.ID
		priority int
		arrival  time.Duration
	}
	for _, c := range []struct {
		name   string
		policy string
		reqs   []req // added in this order
		want   []sched.ID
	}{
		{"fcfs ignores priority", sched.PolicyFCFS,
			[]req{{1, 5, 0}, {2, 0, 1}, {3, -3, 2}}, []sched.ID{1, 2, 3}},
		{"empty policy is fcfs", "",
			[]req{{1, 5, 0}, {2, 0, 1}}, []sched.ID{1, 2}},
		{"lower value first", sched.PolicyPriority,
			[]req{{1, 5, 0}, {2, 0, 1}, {3, -3, 2}, {4, 1, 3}}, []sched.ID{3, 2, 4, 1}},
		{"ties by arrival", sched.PolicyPriority,
			[]req{{1, 1, 30}, {2, 1, 10}, {3, 1, 20}, {4, 0, 40}}, []sched.ID{4, 2, 3, 1}},
		{"same arrival: the order added", sched.PolicyPriority,
			[]req{{7, 2, 5}, {3, 2, 5}, {9, 2, 5}, {1, 3, 0}}, []sched.ID{7, 3, 9, 1}},
		{"all default priority is fcfs", sched.PolicyPriority,
			[]req{{1, 0, 0}, {2, 0, 1}, {3, 0, 2}}, []sched.ID{1, 2, 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config()
			cfg.MaxNumSeqs = 1
			cfg.Policy = c.policy
			s := newScheduler(t, cfg)
			for i, r := range c.reqs {
				if err := s.Add(sched.Request{ID: r.id, Prompt: prompt(1000*(i+1), 20), MaxTokens: 1, Priority: r.priority}, r.arrival*time.Millisecond); err != nil {
					t.Fatal(err)
				}
			}
			var got []sched.ID
			now := 100 * time.Millisecond
			for n := 0; n < 3*len(c.reqs) && !s.Idle(); n++ {
				st := s.Step(now)
				now += st.Duration
				got = append(got, ids(st.Updates)...)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("admitted %v, want %v", got, c.want)
			}
		})
	}
}

// TestPriorityPreemption: when a running request needs a block and none
// is free, fcfs preempts the newest running request; priority preempts
// the lowest-priority one (the greatest value, then the latest arrival),
// even one already scheduled earlier in the step (its tokens go back to
// the budget and it samples nothing), and the preempted request goes
// back to the waiting queue at its place in the order, not at its head.
//
// Two usable blocks of 4 tokens. X (2-token prompt, priority 9) runs
// alone first; A (4-token prompt, priority 0, two tokens) is admitted
// next, taking the second block; W (2-token prompt, priority 5, one
// token) arrives then and waits. In the third step X's decode fits its
// block but A's needs a third block.
func TestPriorityPreemption(t *testing.T) {
	for _, c := range []struct {
		name             string
		policy           string
		updates          []sched.ID // the third step's tokens
		running, waiting int        // after it
		next             []sched.ID // the fourth step's tokens
	}{
		// fcfs: A, the newest, is the victim (it is also the asker) and
		// goes back to the head of the queue; X samples and goes on into
		// A's freed block. A (two blocks) waits for blocks, W behind it.
		{"fcfs preempts the newest", sched.PolicyFCFS, []sched.ID{1}, 1, 2, []sched.ID{1}},
		// priority: X (9) is the victim though it was scheduled first; A
		// takes its block and finishes. X goes back behind W (5): W is
		// admitted first, then X, recomputing.
		{"priority preempts the lowest", sched.PolicyPriority, []sched.ID{2}, 0, 2, []sched.ID{3, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config()
			cfg.Cache.NumBlocks = 3 // 2 usable
			cfg.Cache.BlockSize = 4
			cfg.Policy = c.policy
			e := &engine{t: t, s: newScheduler(t, cfg)}
			e.add(sched.Request{ID: 1, Prompt: prompt(100, 2), MaxTokens: 20, IgnoreEOS: true, Priority: 9}) // X
			if st := e.step(); !slices.Equal(ids(st.Updates), []sched.ID{1}) {
				t.Fatalf("step 1: %v", ids(st.Updates))
			}
			e.add(sched.Request{ID: 2, Prompt: prompt(200, 4), MaxTokens: 2, IgnoreEOS: true, Priority: 0}) // A
			if st := e.step(); !slices.Equal(ids(st.Updates), []sched.ID{1, 2}) {
				t.Fatalf("step 2: %v", ids(st.Updates))
			}
			e.add(sched.Request{ID: 3, Prompt: prompt(300, 2), MaxTokens: 1, IgnoreEOS: true, Priority: 5}) // W
			st := e.step()
			if !slices.Equal(ids(st.Updates), c.updates) || st.Preemptions != 1 || st.Scheduled != 1 {
				t.Fatalf("step 3: updates %v, %d preempted, %d scheduled; want %v, 1, 1", ids(st.Updates), st.Preemptions, st.Scheduled, c.updates)
			}
			if st.Load.Running != c.running || st.Load.Waiting != c.waiting {
				t.Fatalf("step 3: load %+v, want %d running, %d waiting", st.Load, c.running, c.waiting)
			}
			if got := ids(e.step().Updates); !slices.Equal(got, c.next) {
				t.Fatalf("step 4: updates %v, want %v", got, c.next)
			}
		})
	}
}
