package lab

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/peers"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
	"github.com/kvroute/kvroute/test/workload"
)

// TestLadder: llm-d's ladder on each profile's pod pair gives, at every
// length and repetition, the times the profile's formulas give for the
// engine core's path — recompute: the prompt's cold prefill
// (ColdPrefill); pull: the lookup's scheduler step (StepBase), the
// warmed pull of the prompt's blocks within the len−1 cap alone on the
// links (PullTime, as transfer.Duration with both ends idle), their load
// from the CPU tier to the GPU (LoadBack), then the step computing the
// last block — and the crossover is the smallest length where the pull
// is faster. The mesh warm is the pair's first pull (PullConnect). A
// ladder wired wrong (no pull, the pull's bytes in the control, the
// connection paid at every rung, a suffix, the wrong cap) fails here.
func TestLadder(t *testing.T) {
	for _, c := range []struct {
		profile string
		lengths []int // tested: those max_model_len allows
		delta   int
		wins    []bool
	}{
		// 32,768 tokens and one output token exceed 32,768.
		{profile.SimDefault, []int{2048, 8192, 16384}, 2048, []bool{true, true, true}},
		// Two step bases (the lookup's, the last block's) and the
		// load-back on top of the transfer: on the core the pull loses at
		// 2K (≈ 84 ms against a 70 ms recompute).
		{profile.GPTOSS120BH200, []int{2048, 8192, 16384, 32768, 49152}, 8192, []bool{false, true, true, true, true}},
		{profile.Qwen332BH100TP2, []int{2048, 8192, 16384, 32768, 49152}, 2048, []bool{true, true, true, true, true}},
		// The 1.25 s floor: pulls lose at 2K and 8K, win from 16K (its
		// crossover against its single-request prefill is ≈12K).
		{profile.GLM52Rank, []int{2048, 8192, 16384, 32768, 49152}, 16384, []bool{false, false, true, true, true}},
	} {
		t.Run(c.profile, func(t *testing.T) {
			p, err := profile.Named(c.profile)
			if err != nil {
				t.Fatal(err)
			}
			l, err := RunLadder(c.profile, 1)
			if err != nil {
				t.Fatal(err)
			}
			bs := p.BlockSize
			if l.Profile != c.profile || l.BlockSize != bs || l.MaxModelLen != p.MaxModelLen || l.MinCachedTokenDelta != c.delta {
				t.Errorf("ladder %s, block %d, max_model_len %d, delta %d; want %s, %d, %d, %d",
					l.Profile, l.BlockSize, l.MaxModelLen, l.MinCachedTokenDelta, c.profile, bs, p.MaxModelLen, c.delta)
			}
			pullPath := func(n int, first bool) time.Duration {
				pulled := n - bs
				return p.StepBase + p.PullTime(pulled, 1, first) + p.LoadBack(pulled) +
					p.StepCost([]profile.Chunk{{Offset: pulled, Tokens: bs}}, 0, 0)
			}
			if l.WarmTokens != 4096 || l.WarmPullms != ladderMs(pullPath(4096, true)) {
				t.Errorf("mesh warm: %d tokens in %v ms, want 4096 in %v (the pair's first pull)", l.WarmTokens, l.WarmPullms, ladderMs(pullPath(4096, true)))
			}
			var got []int
			for _, r := range l.Rungs {
				got = append(got, r.Tokens)
			}
			if !slices.Equal(got, c.lengths) {
				t.Fatalf("lengths %v, want %v (skipped %v)", got, c.lengths, l.Skipped)
			}
			if len(l.Skipped)+len(l.Rungs) != len(peers.P2PCalibrationLengths()) {
				t.Errorf("skipped %v", l.Skipped)
			}
			for i, r := range l.Rungs {
				n, pulled := r.Tokens, r.Tokens-bs
				rec, pull := ladderMs(p.ColdPrefill(n)), ladderMs(pullPath(n, false))
				if len(r.RecomputeMs) != peers.P2PCalibrationReps || len(r.PullMs) != peers.P2PCalibrationReps {
					t.Fatalf("%d: %d and %d repetitions", n, len(r.RecomputeMs), len(r.PullMs))
				}
				for k := range r.RecomputeMs {
					if r.RecomputeMs[k] != rec || r.PullMs[k] != pull {
						t.Errorf("%d tokens, rep %d: recompute %v ms, pull %v ms; want %v, %v", n, k, r.RecomputeMs[k], r.PullMs[k], rec, pull)
					}
				}
				bytes := float64(int64(float64(pulled) * p.KVBytesPerToken))
				if r.PulledTokens != pulled || r.TransferMs != ladderMs(transfer.Duration(p, pulled, 0, 0, false)) || r.PulledMB != Num(bytes/1e6) {
					t.Errorf("%d tokens: pulled %d in %v ms, %v MB; want %d in %v ms, %v MB", n, r.PulledTokens, r.TransferMs, r.PulledMB,
						pulled, ladderMs(transfer.Duration(p, pulled, 0, 0, false)), bytes/1e6)
				}
				if r.PullWins != c.wins[i] || r.PullWins != (pull < rec) {
					t.Errorf("%d tokens: pull wins %v (recompute %v ms, pull %v ms), want %v", n, r.PullWins, rec, pull, c.wins[i])
				}
				t.Logf("%6d tokens: recompute %8.1f ms, pull %8.1f ms (transfer %7.1f ms, %7.1f MB)", n, rec, pull, r.TransferMs, r.PulledMB)
			}
		})
	}
}

// TestLadderDeterministic: the same seed gives the same ladder; another
// seed draws other prompts and, the engines idle, the same times.
func TestLadderDeterministic(t *testing.T) {
	a, errA := RunLadder(profile.GLM52Rank, 7)
	b, errB := RunLadder(profile.GLM52Rank, 7)
	c, errC := RunLadder(profile.GLM52Rank, 8)
	if err := errors.Join(errA, errB, errC); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) || !reflect.DeepEqual(a, c) {
		t.Fatalf("ladders differ:\n%+v\n%+v\n%+v", a, b, c)
	}
}

// TestLadderRefusals: an unknown profile is refused.
func TestLadderRefusals(t *testing.T) {
	if _, err := RunLadder("no-such-profile", 1); err == nil {
		t.Error("an unknown profile ran")
	}
}

// TestCalibratedArmNames: the names run their arms, count as peers and
// pass a sweep's validation.
func TestCalibratedArmNames(t *testing.T) {
	for name, arm := range map[string]score.Policy{
		LLMDPreciseP2PCalibrated: score.LLMDPreciseP2P,
		LLMDP2PCalibrated:        score.LLMDP2P,
		LLMDLoadP2PCalibrated:    score.LLMDLoadP2P,
	} {
		if p, err := policyOf(name); err != nil || p != arm {
			t.Errorf("%s runs %q (%v), want %s", name, p, err, arm)
		}
		if !isPeer(name) || !isCalibratedArm(name) {
			t.Errorf("%s: not a peer", name)
		}
	}
	if isCalibratedArm(string(score.LLMDLoadP2P)) || isCalibratedArm(LLMDCalibratedP2P) {
		t.Error("an arm at its upstream threshold counted as calibrated")
	}
}

// TestCalibratedArmSweep: a small sweep on gptoss120b-h200 (a pool of
// 6,000-token prefixes over two engines with CPU tiers) with
// llm-d-load+p2p at its upstream threshold (2,048) and at the ladder's
// (8,192 on this profile) runs the ladder once and records it, counts
// both as peers, and the calibrated runs hold the ladder's threshold in
// every picker (read back from the arm): the upstream arm names sources
// for the prefixes a peer holds, the calibrated one, whose threshold is
// above every prefix, names none.
func TestCalibratedArmSweep(t *testing.T) {
	sc := workload.UniformPool{Engines: 2, GPUBlocks: 800, Prefixes: 4, Requests: 40}
	cfg := DefaultConfig()
	cfg.CPUBlocks, cfg.Pickers, cfg.Profile = 2048, 2, profile.GPTOSS120BH200
	res, err := RunSweep(Sweep{Scenario: sc, Policies: []string{string(score.LLMDLoadP2P), LLMDLoadP2PCalibrated}, Seeds: []uint64{1}, Rates: []float64{0.25}, Fleet: cfg, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	l := res.P2PLadder
	if l == nil || l.Profile != profile.GPTOSS120BH200 || l.MinCachedTokenDelta != 8192 || len(l.Rungs) != 5 {
		t.Fatalf("ladder %+v, want gptoss120b-h200's, 8192", l)
	}
	if !slices.Equal(res.Peers, []string{string(score.LLMDLoadP2P), LLMDLoadP2PCalibrated}) || len(res.Runs) != 2 || res.Runs[1].Policy != LLMDLoadP2PCalibrated {
		t.Fatalf("peers %v, %d runs", res.Peers, len(res.Runs))
	}
	up, cal := res.Runs[0].Figures, res.Runs[1].Figures
	if up.Failed != 0 || cal.Failed != 0 || up.Completed != 40 || cal.Completed != 40 || up.Tiers == nil {
		t.Fatalf("upstream %+v, calibrated %+v", up, cal)
	}
	named := 0
	if cal.Tiers != nil {
		named = cal.Tiers.SourcesNamed
	}
	t.Logf("llm-d-load+p2p: %d sources named, %d pulls; at %d: %d named", up.Tiers.SourcesNamed, up.Tiers.Pulls, l.MinCachedTokenDelta, named)
	if up.Tiers.SourcesNamed == 0 || named != 0 {
		t.Errorf("sources named: %d at 2048, %d at %d; want some, then none", up.Tiers.SourcesNamed, named, l.MinCachedTokenDelta)
	}
	// The threshold each picker's arm holds in such a run.
	var held []int
	one := cfg
	one.Policy = score.LLMDLoadP2P
	_, _, err = runWith(one, sc, workload.Options{Seed: 1, Rate: 0.25}, func(r *run) {
		withMinCachedTokenDelta(l.MinCachedTokenDelta)(r)
		for _, p := range r.pickers {
			p.router.WithPeerPolicy(func(pp peers.Policy) { held = append(held, pp.(peers.SourceThreshold).MinCachedTokenDelta()) })
		}
	})
	if err != nil || !slices.Equal(held, []int{8192, 8192}) {
		t.Errorf("thresholds held %v (%v), want 8192 in both pickers", held, err)
	}
}
