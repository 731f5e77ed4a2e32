package lab

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/workload"
)

// tierRun is one run of a small uniform pool (600 requests, 8 engines of
// 4,800 blocks) with each engine's CPU tier cpu blocks (negative: none).
func tierRun(t *testing.T, pol score.Policy, cpu int) Figures {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Policy, cfg.CPUBlocks = pol, cpu
	s := workload.UniformPool{Requests: 600}
	outs, err := Run(cfg, s, workload.Options{Seed: 1, Rate: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	return figuresOf(outs, engineURLs(cfg, s))
}

// TestTierGuard is the model's guard (kv-transfer.md §8: in llm-d's own
// simulator a CPU tier once changed the hit rate and not the latency).
// A cache-blind load balancer (llm-d's load-only arm) on a pool five
// times one engine's GPU cache: growing the CPU tier (none, twice the
// GPU's blocks, six times: more than the pool) raises the hit rate, and
// every rise of the hit rate must lower the mean and median TTFT with it
// (a tier no larger than the GPU only mirrors it, as vLLM says). It fails if CPU hits were
// counted but not priced (or priced as recomputes), or loaded for free
// without being counted.
func TestTierGuard(t *testing.T) {
	var prev *Figures
	for _, cpu := range []int{-1, 9600, 28800} {
		f := tierRun(t, score.LLMDLoad, cpu)
		t.Logf("CPU %d blocks: hit %.3f, TTFT mean %.0f ms, p50 %.0f ms", cpu, f.HitRate, f.TTFTMean, f.TTFTP50)
		if f.Failed != 0 || f.Refused429 != 0 {
			t.Fatalf("CPU %d: %d failed, %d refused", cpu, f.Failed, f.Refused429)
		}
		if prev != nil {
			if !(f.HitRate > prev.HitRate+0.05) {
				t.Fatalf("CPU %d: hit rate %.3f, want above %.3f: the tier serves nothing", cpu, f.HitRate, prev.HitRate)
			}
			if !(f.TTFTMean < 0.9*prev.TTFTMean && f.TTFTP50 < prev.TTFTP50) {
				t.Errorf("CPU %d: hit rate %.3f → %.3f but TTFT mean %.0f → %.0f ms, p50 %.0f → %.0f: a tier that changes the hit rate must change the latency",
					cpu, prev.HitRate, f.HitRate, prev.TTFTMean, f.TTFTMean, prev.TTFTP50, f.TTFTP50)
			}
			if f.Tiers == nil || !(f.Tiers.CPUHit > 0) || f.Tiers.Pulls != 0 {
				t.Errorf("CPU %d: tiers %+v, want CPU hits and no pulls (the arm names no source)", cpu, f.Tiers)
			}
		}
		prev = &f
	}
}

// TestPullsInTheLab: with CPU tiers, llm-d's load-only arm with the
// p2p-source-producer and kvroute's precise both name sources that
// serve; the tokens add up, the bytes are the profile's per token, no
// request fails for a pull; the pull arm beats its recompute control.
func TestPullsInTheLab(t *testing.T) {
	control := tierRun(t, score.LLMDLoad, 9600)
	arm := tierRun(t, score.LLMDLoadP2P, 9600)
	if arm.Tiers == nil || arm.Tiers.Pulls == 0 || !(arm.Tiers.Pulled > 0.1) {
		t.Fatalf("llm-d-load+p2p: tiers %+v, want pulls", arm.Tiers)
	}
	if arm.Failed != 0 || arm.Tiers.FailedWithPull != 0 {
		t.Errorf("llm-d-load+p2p: %d failed, %d with a source", arm.Failed, arm.Tiers.FailedWithPull)
	}
	tt := arm.Tiers
	if sum := float64(tt.GPUHit + tt.CPUHit + tt.Pulled); sum > 1.0001 || !(tt.Recomputed >= 0) {
		t.Errorf("GPU, CPU and pulled shares add up to %.4f, recomputed %.4f: a token counted twice", sum, tt.Recomputed)
	}
	if !(arm.HitRate > control.HitRate+0.1 && arm.TTFTMean < control.TTFTMean) {
		t.Errorf("pulls: hit %.3f, mean %.0f ms against the control's %.3f, %.0f ms: want more hits and a lower TTFT",
			arm.HitRate, arm.TTFTMean, control.HitRate, control.TTFTMean)
	}
	t.Logf("llm-d-load: hit %.3f mean %.0f ms; +p2p: hit %.3f mean %.0f ms, %d pulls (%d missed), %.1f GB, busiest source %.2f",
		control.HitRate, control.TTFTMean, arm.HitRate, arm.TTFTMean, tt.Pulls, tt.MissedPulls, tt.PulledGB, tt.MaxSourceShare)
}

// TestTierTables: the text and HTML reports carry the tier table when a
// policy touched a tier, and only then.
func TestTierTables(t *testing.T) {
	ci := func(x float64) CI { return CI{Mean: Num(x), Lo: Num(x), Hi: Num(x), N: 1} }
	r := &Results{Scenario: "doc-qa", Rates: []float64{1}, Policies: []string{"precise", "llm-d-precise"}, Summary: []Summary{
		{Policy: "precise", Rate: 1, Tiers: &TierSummary{GPUHit: ci(0.5), CPUHit: ci(0.1), Pulled: ci(0.3), Recomputed: ci(0.1), PulledGB: ci(12.5),
			MaxSourceShare: ci(0.4), SourcesNamed: 7, Pulls: 6, MissedPulls: 1}},
		{Policy: "llm-d-precise", Rate: 1}}}
	text := Table(r)
	var page bytes.Buffer
	if err := WriteReport(&page, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"where the prompt tokens' KV came from", "30.0%", "12.5"} {
		if !strings.Contains(text, want) {
			t.Errorf("summary lacks %q:\n%s", want, text)
		}
	}
	if !strings.Contains(page.String(), "busiest source") || !strings.Contains(page.String(), "12.5 GB") {
		t.Errorf("report.html lacks the tier table")
	}
	r.Summary[0].Tiers = nil
	page.Reset()
	_ = WriteReport(&page, r)
	if strings.Contains(Table(r), "KV came from") || strings.Contains(page.String(), "busiest source") {
		t.Errorf("a tier table without tiers")
	}
}
