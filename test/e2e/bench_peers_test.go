package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestBenchPeers: `kvroute bench --peers` at a tiny size runs the four
// peers' policies, precise and round-robin through the real picker; every
// policy serves every request, and results.json compares each with the
// best peer.
func TestBenchPeers(t *testing.T) {
	bin := buildKvroute(t)
	out := t.TempDir()
	cmd := exec.Command(bin, "bench", "--peers", "--scenario", "seed-continuation", "--sequential", "--time-scale", "0", "--out", out)
	raw, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, raw)
	}
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Order    []string `json:"order"`
		Policies map[string]struct {
			Requests      int            `json:"requests"`
			Errors        int            `json:"errors"`
			Decisions     map[string]int `json:"decisions"`
			Continuations int            `json:"continuations"`
		} `json:"policies"`
		VsBestPeer *struct {
			BestPeer map[string]string              `json:"best_peer"`
			Ratios   map[string]map[string]*float64 `json:"ratios"`
		} `json:"vs_best_peer"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	want := []string{"llm-d", "llm-d-calibrated", "llm-d-precise", "dynamo", "sglang", "precise", "round-robin"}
	peers := want[:5]
	requests := -1
	for _, p := range want {
		pr, ok := res.Policies[p]
		if !ok {
			t.Fatalf("no results for %s:\n%s", p, b)
		}
		if requests < 0 {
			requests = pr.Requests
		}
		if pr.Requests == 0 || pr.Requests != requests || pr.Errors != 0 {
			t.Errorf("%s: %d requests (the first policy %d), %d errors", p, pr.Requests, requests, pr.Errors)
		}
		decided := 0
		for _, n := range pr.Decisions {
			decided += n
		}
		if p == "llm-d-calibrated" {
			decided -= 25 // llm-d's recipe: 5 warm-up and 20 measured probes, through the same picker
		}
		if decided != pr.Requests {
			t.Errorf("%s: %d decisions for %d requests: %v", p, decided, pr.Requests, pr.Decisions)
		}
	}
	if res.VsBestPeer == nil {
		t.Fatalf("no vs_best_peer in results.json:\n%s", b)
	}
	for _, fig := range []string{"hit_rate", "ttft_mean", "ttft_p99"} {
		if !slices.Contains(peers, res.VsBestPeer.BestPeer[fig]) {
			t.Errorf("best peer for %s is %q, not a peer", fig, res.VsBestPeer.BestPeer[fig])
		}
	}
	for _, p := range want {
		r := res.VsBestPeer.Ratios[p]
		for _, fig := range []string{"hit_rate", "ttft_mean", "ttft_p99"} {
			if r[fig] == nil || *r[fig] < 0 {
				t.Errorf("%s: no %s ratio (%v)", p, fig, r)
			}
		}
	}
}
