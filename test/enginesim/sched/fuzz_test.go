package sched_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/sched"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
)

// FuzzKVWaits runs a workload of requests from four shared prefixes,
// some naming a peer (whose tier holds those prefixes) and some of those
// pulls failing, on an engine with or without a CPU tier (chunks of one
// or two blocks), and checks: the engine drains (no request stuck
// waiting for KV), under either scheduling policy; every request's cached tokens are its split's sum and
// within its len−1 cap; the steps' figures add up to the requests'; every
// lookup ends in a pull or a failure; every event is valid.
func FuzzKVWaits(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7})
	f.Add([]byte{255, 17, 33, 64, 129, 3, 3, 3, 200, 91})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) == 0 || len(ops) > 64 {
			return
		}
		cfg := config()
		cfg.Cache.CPUBlocks = []int{0, 24, 48}[ops[0]%3]
		cfg.Cache.OffloadBlocks = 1 + int(ops[0]/3)%2
		if ops[0]&128 != 0 {
			cfg.Policy = sched.PolicyPriority
		}
		peer := newShell(t, tiered(48), noPeer(t))
		var warm []arrival
		for i := 0; i < 4; i++ {
			warm = append(warm, arrival{time.Duration(i) * time.Second, sched.Request{ID: sched.ID(i + 1), Prompt: prompt(10_000*i, 150), MaxTokens: 1}})
		}
		peer.run(warm...)
		var links transfer.Links
		lookups := 0
		h := newShell(t, cfg, func(lk sched.Lookup) (int, time.Duration, bool) {
			lookups++
			blocks := peer.s.ServeLookup(lk.Hashes)
			end, _ := links.Start("peer", "me", blocks*16, lk.At, cfg.Latency)
			return blocks, end, lk.Hashes[0][0]%5 == 0
		})
		var arrivals []arrival
		prompts := map[sched.ID]int{}
		for i, op := range ops {
			r := sched.Request{ID: sched.ID(i + 1), Prompt: prompt(10_000*int(op%4), 20+int(op)%180), MaxTokens: 1 + int(op)%5}
			if op&16 != 0 {
				r.Source = "peer"
			}
			r.Priority = int(op%3) - 1
			prompts[r.ID] = len(r.Prompt)
			arrivals = append(arrivals, arrival{time.Duration(i) * time.Duration(op%8) * 10 * time.Millisecond, r})
		}
		h.run(arrivals...)
		if len(h.first) != len(ops) {
			t.Fatalf("%d of %d requests got a first token", len(h.first), len(ops))
		}
		var cached int64
		for id, u := range h.first {
			if u.CachedTokens != u.GPUHitTokens+u.CPUHitTokens+u.PulledTokens || u.CachedTokens > prompts[id]-1 || u.CPUHitTokens < 0 {
				t.Fatalf("request %d (%d tokens): %+v", id, prompts[id], u)
			}
			cached += int64(u.CachedTokens)
		}
		if got := h.sum(func(st sched.Step) int64 { return int64(st.CachedTokens + st.CPUHitTokens + st.PulledTokens) }); got != cached {
			t.Fatalf("steps count %d cached tokens, requests %d", got, cached)
		}
		if got := h.sum(func(st sched.Step) int64 { return int64(st.Pulls + st.PullFailures) }); got != int64(lookups) {
			t.Fatalf("%d lookups, %d pulls and failures", lookups, got)
		}
		for _, st := range h.steps {
			for _, e := range st.Events {
				if err := e.Validate(); err != nil {
					t.Fatalf("%+v: %v", e, err)
				}
			}
		}
	})
}
