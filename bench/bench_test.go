package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/score"
)

// TestSeedContinuation runs the seed scenario (4 conversations, no
// simulated waiting) under precise and round-robin routing: precise brings
// every second turn back to its first turn's engine with most of the
// prompt cached; round-robin, on two engines, sends each second turn to the
// other one. results.json and summary.txt are written with the schema's
// names.
func TestSeedContinuation(t *testing.T) {
	var mu sync.Mutex
	progress := map[string]int{}
	ends := 0
	res, err := Run(context.Background(), Options{Scenario: SeedContinuation{Conversations: 4, OutputTokens: 8},
		Policies: []score.Policy{score.Precise, score.RoundRobin}, TimeScale: 0, Seed: 7, SampleEvery: 20 * time.Millisecond,
		Progress: func(policy string, done int) {
			mu.Lock()
			defer mu.Unlock()
			if done < 0 {
				ends++
			} else {
				progress[policy] = max(progress[policy], done)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if progress["precise"] != 8 || progress["round-robin"] != 8 || ends != 2 {
		t.Fatalf("progress %v, %d ends", progress, ends)
	}
	p, rr := res.Policies["precise"], res.Policies["round-robin"]
	if p.Errors != 0 || p.Requests != 8 || p.WarmReturns != 4 || p.Conversations != 4 {
		t.Fatalf("precise: %+v", p)
	}
	if rr.WarmReturns != 0 {
		t.Fatalf("round-robin on two engines: %d warm returns", rr.WarmReturns)
	}
	if p.ContinuationHitRate < 0.9 || rr.ContinuationHitRate > 0.1 {
		t.Fatalf("continuation hit rates: precise %.3f, round-robin %.3f", p.ContinuationHitRate, rr.ContinuationHitRate)
	}
	if p.HitRate <= rr.HitRate || p.HitRate < 0.4 || res.PooledBoundHitRate < p.HitRate-0.01 {
		t.Fatalf("hit rates: precise %.3f, round-robin %.3f, pooled bound %.3f", p.HitRate, rr.HitRate, res.PooledBoundHitRate)
	}
	dir := t.TempDir()
	table, err := Write(dir, res)
	if err != nil || !strings.Contains(table, "precise") {
		t.Fatalf("%v\n%s", err, table)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"scenario", "seed", "fleet", "pooled_bound_hit_rate", "policies"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("results.json lacks %s", k)
		}
	}
	pol := doc["policies"].(map[string]any)["precise"].(map[string]any)
	if p.PickOverheadUs.P99 <= 0 || p.PickOverheadUs.P99 < p.PickOverheadUs.P50 || p.WrongPodRate > 0.5 {
		t.Fatalf("picker figures: %+v, wrong-pod rate %v", p.PickOverheadUs, p.WrongPodRate)
	}
	for _, k := range []string{"requests", "errors", "hit_rate", "ttft_ms", "continuation_ttft_ms", "conversations", "warm_returns", "load_imbalance", "throughput_rps", "pick_overhead_us", "wrong_pod_rate"} {
		if _, ok := pol[k]; !ok {
			t.Errorf("policy result lacks %s", k)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "summary.txt")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*PolicyResult{p, rr} {
		if tl := p.Timeline; tl == nil || len(tl.Seconds) < 2 || len(tl.Engines) != 2 || len(p.TTFTPercentiles) != 101 {
			t.Fatalf("timeline %+v, %d percentiles", tl, len(p.TTFTPercentiles))
		}
		last := len(p.Timeline.Seconds) - 1
		if n := p.Timeline.Engines[0].Requests[last] + p.Timeline.Engines[1].Requests[last]; n != 8 {
			t.Fatalf("timeline ends with %d requests answered, want 8", n)
		}
		if p.Timeline.Engines[0].CachedBlocks[last] == 0 && p.Timeline.Engines[1].CachedBlocks[last] == 0 {
			t.Fatal("timeline ends with no cached blocks")
		}
	}
	// The report of a real run, in a real browser: the two summary charts
	// and two per policy.
	checkReportInChromium(t, filepath.Join(dir, "report.html"), "report-seed-continuation.png", 2+2*2)
}
