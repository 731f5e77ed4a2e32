package peers_test

import (
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/peers"
)

func mustNew(t *testing.T, name string) peers.Policy {
	t.Helper()
	p, err := peers.New(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// armRequest is a turn of conversation conv: a shared prefix of
// prefixBlocks 16-token blocks, then tail blocks of its own (step's).
func armRequest(conv, prefixBlocks, tail, step int) *peers.Request {
	req := &peers.Request{Model: "m", BlockSize: 16, Stream: step%2 == 0, ID: strconv.Itoa(step)}
	for b := range prefixBlocks + tail {
		owner := conv
		if b >= prefixBlocks {
			owner = 1000 + step
		}
		req.Keys = append(req.Keys, blockkey.Key(owner<<20|b))
		for i := range 16 {
			req.Tokens = append(req.Tokens, uint32(owner<<16|b<<4|i))
		}
	}
	return req
}

// TestArmPlacementUnchanged: on the same calls (picks, dispatches, first
// chunks and tokens, ends, departures), each arm picks what its base
// picks — the same Index, Reason and Scores — and any source it names is
// a healthy candidate other than the chosen one; the run names some.
func TestArmPlacementUnchanged(t *testing.T) {
	for _, pair := range [][2]string{
		{peers.LLMDPrecise, peers.LLMDPreciseP2P},
		{peers.LLMD, peers.LLMDP2P},
		{peers.LLMDLoad, peers.LLMDLoadP2P},
		{peers.Dynamo, peers.DynamoHint},
	} {
		t.Run(pair[1], func(t *testing.T) {
			base, arm := mustNew(t, pair[0]), mustNew(t, pair[1])
			r := peers.NewRand(11)
			ids := []string{"a", "b", "c", "d"}
			now := time.Unix(1_700_000_000, 0)
			var tickets [][2]peers.Ticket
			named := 0
			for step := range 600 {
				now = now.Add(time.Duration(r.IntN(2000)) * time.Millisecond)
				req := armRequest(r.IntN(5), 50+r.IntN(300), r.IntN(40), step)
				cands := make([]peers.Candidate, len(ids))
				for i, id := range ids {
					c := peers.Candidate{ID: id, Healthy: r.IntN(8) != 0, Waiting: float64(r.IntN(4)), KVUsage: float64(r.IntN(100)) / 100, NumGPUBlocks: 2000}
					for _, tr := range tier.All() {
						if r.IntN(2) == 0 {
							c.Matched[tr] = r.IntN(len(req.Keys) + 1)
						}
					}
					cands[i] = c
				}
				rnd := r.Uint64()
				want, got := base.Pick(req, cands, rnd, now), arm.Pick(req, cands, rnd, now)
				if got.Index != want.Index || got.Reason != want.Reason || !slices.Equal(got.Scores, want.Scores) {
					t.Fatalf("step %d: the arm picked %d (%s, %v), its base %d (%s, %v)", step, got.Index, got.Reason, got.Scores, want.Index, want.Reason, want.Scores)
				}
				if want.Source != "" {
					t.Fatalf("step %d: the base named a source", step)
				}
				if got.Source != "" {
					named++
					j := slices.IndexFunc(cands, func(c peers.Candidate) bool { return c.ID == got.Source })
					if j < 0 || j == got.Index || !cands[j].Healthy {
						t.Fatalf("step %d: source %q (chosen %d, candidates %+v)", step, got.Source, got.Index, cands)
					}
				}
				if got.Index >= 0 {
					ep := cands[got.Index].ID
					tickets = append(tickets, [2]peers.Ticket{base.Dispatched(req, ep, now), arm.Dispatched(req, ep, now)})
				}
				switch k := r.IntN(10); {
				case k < 6 && len(tickets) > 0:
					i := r.IntN(len(tickets))
					tb, ta := tickets[i][0], tickets[i][1]
					switch r.IntN(3) {
					case 0:
						base.FirstChunk(tb, now)
						arm.FirstChunk(ta, now)
					case 1:
						base.FirstToken(tb, now)
						arm.FirstToken(ta, now)
					default:
						base.Done(tb, now)
						arm.Done(ta, now)
						tickets = slices.Delete(tickets, i, i+1)
					}
				case k == 9 && r.IntN(20) == 0:
					gone := ids[r.IntN(len(ids))]
					base.Forget(gone)
					arm.Forget(gone)
				}
			}
			if named == 0 {
				t.Fatal("the arm never named a source: the run did not exercise its rule")
			}
			// Ties, which only the random value breaks: fresh policies,
			// identical candidates.
			cands := []peers.Candidate{{ID: "a", Healthy: true}, {ID: "b", Healthy: true}, {ID: "c", Healthy: true}}
			picked := map[int]bool{}
			for range 200 {
				base, arm := mustNew(t, pair[0]), mustNew(t, pair[1])
				req, rnd := armRequest(0, 20, 0, 0), r.Uint64()
				want, got := base.Pick(req, cands, rnd, now), arm.Pick(req, cands, rnd, now)
				if got.Index != want.Index {
					t.Fatalf("a tie, rnd %x: the arm picked %d, its base %d", rnd, got.Index, want.Index)
				}
				picked[got.Index] = true
			}
			if len(picked) != len(cands) {
				t.Fatalf("ties went to %v only", picked)
			}
		})
	}
}

// TestLLMDP2PSource: llm-d+p2p names the endpoint its own approximate
// model says holds the prompt, whatever kvroute's index says (here:
// nothing), when the placement goes elsewhere and it holds at least the
// threshold more; never the chosen one.
func TestLLMDP2PSource(t *testing.T) {
	cases := []struct {
		name        string
		breakGate   bool // the load gate opens stickiness, so b (idle) wins
		delta       int
		chosen, src string
	}{
		{"sticky: a computes, no pull", false, 1, "a", ""},
		{"gate broken: b computes, pulls from a", true, 1, "b", "a"},
		{"at the threshold: 10 blocks of 64", true, 640, "b", "a"},
		{"one token beyond it", true, 641, "b", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := peers.NewLLMDP2P(peers.DefaultLLMDP2PConfig())
			if err != nil {
				t.Fatal(err)
			}
			req := armRequest(1, 40, 0, 0) // 640 tokens: 10 of llm-d's 64-token blocks
			p.Dispatched(req, "a", time.Time{})
			p.Dispatched(armRequest(2, 400, 0, 2), "a", time.Time{}) // a's load: 6,400 more tokens in flight
			if tc.breakGate {
				if err := p.SetLoadGate(1, 1); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.SetMinCachedTokenDelta(tc.delta); err != nil {
				t.Fatal(err)
			}
			if p.SetMinCachedTokenDelta(0) == nil || p.MinCachedTokenDelta() != tc.delta {
				t.Fatal("a threshold of 0 accepted, or it changed the threshold")
			}
			cands := []peers.Candidate{{ID: "a", Healthy: true}, {ID: "b", Healthy: true}}
			for _, id := range requestIDs(50, 3) {
				req.ID = id
				ch := p.Pick(req, cands, 0, time.Time{})
				if ch.Index < 0 || cands[ch.Index].ID != tc.chosen || ch.Source != tc.src {
					t.Fatalf("id %s: chose %d, source %q; want %s, %q", id, ch.Index, ch.Source, tc.chosen, tc.src)
				}
			}
		})
	}
}

// TestLLMDPreciseP2PSource: llm-d-precise+p2p's source is a CPU-tier
// holder within one block of the best CPU run, named when it holds 2,048
// tokens more than the chosen endpoint holds on any tier.
func TestLLMDPreciseP2PSource(t *testing.T) {
	c := func(id string, gpu, cpu int) peers.Candidate {
		x := peers.Candidate{ID: id, Healthy: true}
		x.Matched[tier.GPU], x.Matched[tier.CPU] = gpu, cpu
		return x
	}
	cases := []struct {
		name    string
		cands   []peers.Candidate
		sources []string // the sources named over the request ids; "" none
	}{
		// a: 2·700/1000 + 2 beats b's 2·int(0.8·860)/1000 + 2; b's run is
		// 160 blocks (2,560 tokens) longer than a's.
		{"the CPU holder", []peers.Candidate{c("a", 700, 0), c("b", 0, 860), c("c", 0, 0)}, []string{"b"}},
		{"a run more than a block short is no candidate", []peers.Candidate{c("a", 700, 0), c("b", 0, 860), c("c", 0, 858)}, []string{"b"}},
		{"within one block: either", []peers.Candidate{c("a", 700, 0), c("b", 0, 860), c("c", 0, 859)}, []string{"b", "c"}},
		{"under 2,048 tokens more: none", []peers.Candidate{c("a", 700, 0), c("b", 0, 827)}, []string{""}},
		// a holds 900 on CPU beyond its GPU run: it is the best CPU run
		// (so sampled) and the chosen one: never named.
		{"the chosen one holds the best run", []peers.Candidate{c("a", 700, 900), c("b", 0, 899)}, []string{""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := mustNew(t, peers.LLMDPreciseP2P)
			req := &peers.Request{Model: "m", BlockSize: 16, Tokens: make([]uint32, 16000)}
			seen := map[string]bool{}
			for _, id := range requestIDs(400, 4) {
				req.ID = id
				ch := p.Pick(req, tc.cands, 0, time.Time{})
				if ch.Index != 0 {
					t.Fatalf("chose %d, want a", ch.Index)
				}
				seen[ch.Source] = true
			}
			for _, s := range tc.sources {
				if !seen[s] {
					t.Errorf("never named %q (named %v)", s, seen)
				}
				delete(seen, s)
			}
			if len(seen) > 0 {
				t.Errorf("also named %v", seen)
			}
		})
	}
}

// TestLLMDLoadP2PSource: llm-d-load+p2p's placement ignores the prefix;
// its source rule reads the CPU tier: a GPU-only holder is no source, and
// the CPU holder is named for a cold endpoint, not for one holding more
// on GPU, nor for itself.
func TestLLMDLoadP2PSource(t *testing.T) {
	cands := []peers.Candidate{{ID: "cpu", Healthy: true}, {ID: "gpu", Healthy: true}, {ID: "cold", Healthy: true}}
	cands[0].Matched[tier.CPU] = 200 // 3,200 tokens
	cands[1].Matched[tier.GPU] = 300 // 4,800 tokens, none on CPU
	want := map[string]string{"cpu": "", "gpu": "", "cold": "cpu"}
	p := mustNew(t, peers.LLMDLoadP2P)
	req := &peers.Request{Model: "m", BlockSize: 16, Tokens: make([]uint32, 8000)}
	r := peers.NewRand(5)
	chosen := map[string]int{}
	for _, id := range requestIDs(600, 6) {
		req.ID = id
		ch := p.Pick(req, cands, r.Uint64(), time.Time{})
		at := cands[ch.Index].ID
		chosen[at]++
		if ch.Source != want[at] {
			t.Fatalf("chose %s: source %q, want %q", at, ch.Source, want[at])
		}
	}
	if len(chosen) != 3 {
		t.Fatalf("placement %v: the prefix moved it", chosen)
	}
}

// TestDynamoHint: after Dynamo's placement (unchanged), the healthy other
// candidate with the longest CPU-tier prefix, if longer than the target's
// own on any tier; ties drawn from the seeded random value, reproducibly.
func TestDynamoHint(t *testing.T) {
	c := func(id string, gpu, cpu, disk int, healthy bool) peers.Candidate {
		x := dynCand(id, gpu, cpu, disk)
		x.Healthy = healthy
		return x
	}
	// 20 blocks of prompt; with no bookings the cost is 20 − credit + 20,
	// credit = GPU + 0.75·CPU beyond it + 0.25·disk beyond both: a, with
	// 10 GPU blocks, beats every other below.
	cases := []struct {
		name    string
		cands   []peers.Candidate
		sources []string
	}{
		{"a longer CPU prefix", []peers.Candidate{c("a", 10, 0, 0, true), c("b", 0, 12, 0, true)}, []string{"b"}},
		{"the longest of several", []peers.Candidate{c("a", 10, 0, 0, true), c("b", 0, 11, 0, true), c("c", 0, 12, 0, true)}, []string{"c"}},
		{"not longer than the target's own, any tier", []peers.Candidate{c("a", 4, 12, 0, true), c("b", 0, 12, 0, true)}, []string{""}},
		{"the storage tier serves no pull", []peers.Candidate{c("a", 10, 0, 0, true), c("b", 0, 0, 30, true)}, []string{""}},
		{"an unhealthy holder", []peers.Candidate{c("a", 10, 0, 0, true), c("b", 0, 13, 0, false)}, []string{""}},
		{"a tie: either", []peers.Candidate{c("a", 10, 0, 0, true), c("b", 0, 12, 0, true), c("c", 0, 12, 0, true)}, []string{"b", "c"}},
	}
	keys := make([]uint64, 20)
	for i := range keys {
		keys[i] = uint64(i + 1)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base, arm := dynNew(t, peers.DefaultDynamoConfig()), mustNew(t, peers.DynamoHint)
			again := mustNew(t, peers.DynamoHint)
			req := dynReq(320, keys...)
			r := peers.NewRand(8)
			seen := map[string]int{}
			for range 400 {
				rnd := r.Uint64()
				want, got := base.Pick(req, tc.cands, rnd, dynT0), arm.Pick(req, tc.cands, rnd, dynT0)
				if got.Index != 0 || want.Index != 0 {
					t.Fatalf("chose %d (base %d), want a", got.Index, want.Index)
				}
				if re := again.Pick(req, tc.cands, rnd, dynT0); re.Source != got.Source {
					t.Fatalf("rnd %x: %q, then %q", rnd, got.Source, re.Source)
				}
				seen[got.Source]++
			}
			for _, s := range tc.sources {
				if seen[s] == 0 {
					t.Errorf("never named %q (named %v)", s, seen)
				}
				delete(seen, s)
			}
			if len(seen) > 0 {
				t.Errorf("also named %v", seen)
			}
		})
	}
}

// TestLLMDLoad: epp-load.yaml's profile — total = 3·queue + 2·(1 − KV
// usage), and the weighted-random picker draws P ∝ total; a zero total
// never wins unless all are zero (then uniform); unhealthy never.
func TestLLMDLoad(t *testing.T) {
	c := func(id string, healthy bool, waiting, kv float64) peers.Candidate {
		return peers.Candidate{ID: id, Healthy: healthy, Waiting: waiting, KVUsage: kv}
	}
	cases := []struct {
		name   string
		cfg    peers.LLMDLoadConfig
		cands  []peers.Candidate
		scores []float64
		share  []float64
	}{
		// queue 1, 0.5, 0; KV 0.5, 1, 0: totals 4, 3.5, 0.
		{"P ∝ score", peers.DefaultLLMDLoadConfig(), []peers.Candidate{c("a", true, 0, 0.5), c("b", true, 2, 0), c("c", true, 4, 1)},
			[]float64{4, 3.5, 0}, []float64{4 / 7.5, 3.5 / 7.5, 0}},
		{"equal: uniform", peers.DefaultLLMDLoadConfig(), []peers.Candidate{c("a", true, 1, 0.2), c("b", true, 1, 0.2), c("c", true, 1, 0.2)},
			[]float64{4.6, 4.6, 4.6}, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}},
		// queue over the healthy two: 1 and 0; KV 1 and 0.9.
		{"unhealthy never", peers.DefaultLLMDLoadConfig(), []peers.Candidate{c("a", true, 0, 0), c("down", false, 0, 0), c("b", true, 3, 0.1)},
			[]float64{5, 0, 1.8}, []float64{5 / 6.8, 0, 1.8 / 6.8}},
		{"all zero: uniform", peers.LLMDLoadConfig{KVUtilizationWeight: 2}, []peers.Candidate{c("a", true, 0, 1), c("b", true, 5, 1), c("c", true, 9, 1.2)},
			[]float64{0, 0, 0}, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := peers.NewLLMDLoad(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := peers.NewRand(9)
			const n = 30000
			counts := make([]int, len(tc.cands))
			for range n {
				ch := p.Pick(nil, tc.cands, r.Uint64(), time.Time{})
				for i := range tc.scores {
					if math.Abs(ch.Scores[i]-tc.scores[i]) > 1e-9 {
						t.Fatalf("scores %v, want %v", ch.Scores, tc.scores)
					}
				}
				if ch.Reason != "load" || ch.Source != "" {
					t.Fatalf("reason %q, source %q", ch.Reason, ch.Source)
				}
				counts[ch.Index]++
			}
			for i, want := range tc.share {
				if got := float64(counts[i]) / n; math.Abs(got-want) > 0.01 || want == 0 && counts[i] > 0 {
					t.Errorf("%s chosen %.4f of the time, want %.4f", tc.cands[i].ID, got, want)
				}
			}
		})
	}
	p := mustNew(t, peers.LLMDLoad)
	if ch := p.Pick(nil, []peers.Candidate{c("down", false, 0, 0)}, 1, time.Time{}); ch.Index != -1 || ch.Reason != "none_healthy" {
		t.Fatalf("nothing healthy: %+v", ch)
	}
}

// TestArmNames: every arm is made by name with its defaults, and the arm
// names are apart from the peers'.
func TestArmNames(t *testing.T) {
	for _, name := range peers.ArmNames() {
		p := mustNew(t, name)
		if p.Name() != name || slices.Contains(peers.Names(), name) {
			t.Errorf("%s: named %s", name, p.Name())
		}
		_, threshold := p.(peers.SourceThreshold)
		if want := name == peers.LLMDPreciseP2P || name == peers.LLMDP2P || name == peers.LLMDLoadP2P; threshold != want {
			t.Errorf("%s: a source threshold %v, want %v", name, threshold, want)
		}
	}
}
