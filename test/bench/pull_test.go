package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/test/workload"
)

// TestPullsBetweenRealEngines: two real engines with vLLM's CPU and P2P
// tiers, their sidecars advertising the side channel, a picker running
// llm-d's load-only arm with the p2p-source-producer. Requests sharing a
// 4,000-token prefix land on either engine; one that lands on the engine
// lacking it is sent with remote_kv_source naming the other, which serves
// the prefix out of its CPU tier over the side channel: the consumer's
// /metrics counts pulled tokens and the bytes read, the picker counts the
// sources it named, and every answer is whole.
func TestPullsBetweenRealEngines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	f, err := StartFleet(ctx, FleetConfig{Engines: 2, GPUBlocks: 1024, CPUBlocks: 2048, Policy: score.LLMDLoadP2P, PolicySeed: 3,
		TimeScale: 0.25}) // a cold prefill (≈ 0.1 s) outlasts the index's lag
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	prefix := workload.Text(rng, 4000)
	pulled := func() float64 {
		total := 0.0
		for _, u := range f.EngineURLs() {
			total += scrape(t, u+"/metrics", `kvroute_engine_prompt_tokens_by_tier_total\{[^}]*tier="p2p"[^}]*\} (\S+)`)
		}
		return total
	}
	for i := 0; i < 60 && pulled() == 0; i++ {
		body, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": prefix + " " + workload.Text(rng, 32), "max_tokens": 4})
		resp, err := http.Post(f.PickerURL()+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil || len(out.Choices) != 1 || out.Choices[0].FinishReason != "length" {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, raw)
		}
	}
	if pulled() == 0 {
		for _, u := range f.EngineURLs() {
			t.Logf("%s stored %v bytes", u, scrape(t, u+"/metrics", `vllm:kv_offload_store_bytes_total\{[^}]*\} (\S+)`))
			resp, _ := http.Get(u + "/metrics")
			raw, _ := io.ReadAll(resp.Body)
			for _, l := range regexp.MustCompile(`(?m)^(kvroute_engine|vllm:kv_offload_tiering|vllm:external).*$`).FindAllString(string(raw), -1) {
				t.Log(l)
			}
		}
		resp, _ := http.Get(f.AdminURL() + "/debug/endpoints")
		raw, _ := io.ReadAll(resp.Body)
		t.Logf("%s", raw)
		t.Fatalf("no engine pulled in 60 requests; picker named %v sources", scrape(t, f.AdminURL()+"/metrics", `kvroute_picker_kv_sources_total(?:\{[^}]*\})? (\S+)`))
	}
	if n := scrape(t, f.AdminURL()+"/metrics", `kvroute_picker_kv_sources_total(?:\{[^}]*\})? (\S+)`); !(n > 0) {
		t.Errorf("the picker counted %v sources named", n)
	}
	tiers, err := engineTiers(ctx, f.EngineURLs())
	if err != nil {
		t.Fatal(err)
	}
	if !(tiers.Pulled > 0 && tiers.Pulls >= 1 && tiers.PulledBytes > 0) || tiers.GPUHit+tiers.CPUHit+tiers.Pulled > 1.0001 {
		t.Errorf("the engines' tier figures: %+v", tiers)
	}
	read := 0.0
	for _, u := range f.EngineURLs() {
		read += scrape(t, u+"/metrics", `vllm:kv_offload_tiering_read_bytes_total\{[^}]*\} (\S+)`)
	}
	if !(read > 0) {
		t.Errorf("pulled tokens but %v bytes read over the P2P tier", read)
	}
}

// scrape GETs url and sums the first capture of every line matching re
// (0 when none).
func scrape(t *testing.T, url, re string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, m := range regexp.MustCompile(`(?m)^`+re+`$`).FindAllStringSubmatch(string(raw), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}
