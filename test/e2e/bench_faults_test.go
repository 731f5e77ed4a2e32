package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestBenchFaultsShort runs `kvroute bench --scenario faults` at a small
// size — real engine, sidecar and picker processes, three faults (an
// engine SIGKILL, a picker's drain, a picker SIGKILL) with short gaps —
// and checks that the router failed no request, a drained picker failed
// none of its streams in flight, and results.json carries the figures.
func TestBenchFaultsShort(t *testing.T) {
	bin := buildKvroute(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "--scenario", "faults", "--faults", "engine-sigkill,picker-sigterm,picker-sigkill",
		"--fault-warmup", "10s", "--fault-gap", "12s", "--time-scale", "0.5", "--out", out)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) } // the bench stops its fleet
	cmd.WaitDelay = 30 * time.Second
	log, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench faults: %v\n%s", err, log)
	}
	raw, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Faults *struct {
			Requests          *int    `json:"requests"`
			RouterFailed      *int    `json:"router_failed"`
			UnavoidableFailed *int    `json:"unavoidable_failed"`
			Rule              *string `json:"classification_rule"`
			Faults            []struct {
				Name              string          `json:"name"`
				RouterFailed      *int            `json:"router_failed"`
				UnavoidableFailed *int            `json:"unavoidable_failed"`
				InFlightFailed    *int            `json:"in_flight_failed"`
				HitRateBefore     *float64        `json:"hit_rate_before"`
				HitRateAfter      *float64        `json:"hit_rate_after"`
				Recovery          json.RawMessage `json:"recovery_s"`
				Outcomes          map[string]int  `json:"outcomes_after_recovery"`
			} `json:"faults"`
			Timeline struct {
				Seconds []float64 `json:"t_s"`
				Router  []int     `json:"router_failed"`
			} `json:"timeline"`
		} `json:"faults"`
		Policies map[string]struct {
			Resources *struct {
				Components []struct {
					Name   string    `json:"name"`
					RSSMiB []float64 `json:"rss_mib"`
				} `json:"components"`
			} `json:"resources"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	f := res.Faults
	if f == nil || f.Requests == nil || f.RouterFailed == nil || f.UnavoidableFailed == nil || f.Rule == nil || *f.Requests < 50 {
		t.Fatalf("results.json lacks the fault totals:\n%s", raw)
	}
	if *f.RouterFailed != 0 {
		t.Errorf("%d requests failed by the router", *f.RouterFailed)
	}
	if len(f.Faults) != 3 || len(f.Timeline.Seconds) == 0 || len(f.Timeline.Router) != len(f.Timeline.Seconds) {
		t.Fatalf("faults %d, timeline %d/%d", len(f.Faults), len(f.Timeline.Seconds), len(f.Timeline.Router))
	}
	for i, want := range []string{"engine-sigkill", "picker-sigterm", "picker-sigkill"} {
		x := f.Faults[i]
		if x.Name != want || x.RouterFailed == nil || x.UnavoidableFailed == nil || x.HitRateBefore == nil || x.HitRateAfter == nil ||
			x.Recovery == nil || x.Outcomes == nil {
			t.Errorf("fault %d: %+v, want %s with every figure", i, x, want)
		}
		if want == "picker-sigterm" && (x.InFlightFailed == nil || *x.InFlightFailed != 0) {
			t.Errorf("the drained picker failed streams in flight: %v", x.InFlightFailed)
		}
	}
	pr, ok := res.Policies["precise"]
	if !ok || pr.Resources == nil || len(pr.Resources.Components) != 6 || len(pr.Resources.Components[0].RSSMiB) == 0 {
		t.Errorf("no resource samples of the 2 pickers and 4 sidecars: %+v", pr.Resources)
	}
	if t.Failed() {
		t.Logf("bench output:\n%s", log)
	}
}
