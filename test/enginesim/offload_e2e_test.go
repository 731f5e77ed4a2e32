package enginesim_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/test/testnet"
)

// usageOf is a completion's usage.
type usageOf struct {
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		Details      *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// TestPullBetweenEngines (with the core's CPU tier and pulls, and the loop
// wired to them): engine B pulls a prefix from engine A's CPU tier
// when a request names A as its remote_kv_source; B's /metrics show the
// pulled tokens and bytes under vLLM's names, A's that it served them. A
// source that is not there degrades to a recompute, counted.
func TestPullBetweenEngines(t *testing.T) {
	for _, scale := range []float64{0, 0.01} {
		t.Run("time scale "+strconv.FormatFloat(scale, 'g', -1, 64), func(t *testing.T) { pullBetweenEngines(t, scale) })
	}
}

func pullBetweenEngines(t *testing.T, scale float64) {
	cfg := tieringConfig(t)
	cfg.Sim.TimeScale = scale
	a := start(t, cfg).Engines()[0]
	b := start(t, cfg).Engines()[0]
	prompt := make([]int, 2048)
	for i := range prompt {
		prompt[i] = 1000 + i
	}
	if code := post(t, a.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}, nil); code != 200 {
		t.Fatalf("seeding A: %d", code)
	}
	var out usageOf
	code := post(t, b.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": source(a.P2PID())}, &out)
	if code != 200 || out.Usage.Details == nil || out.Usage.Details.CachedTokens < 2000 {
		t.Fatalf("B: %d %+v: want the prefix pulled (cached)", code, out)
	}
	pulled := scraped(t, b, "kvroute_engine_prompt_tokens_by_tier_total", map[string]string{"tier": "p2p"})
	for _, c := range []struct {
		name   string
		labels map[string]string
		min    float64
	}{
		{"vllm:external_prefix_cache_hits_total", nil, pulled},
		{"vllm:kv_offload_tiering_read_bytes_total", map[string]string{"tier": "1:p2p"}, 1},
		{"vllm:kv_offload_tiering_block_hits_total", nil, 1},
		{"kvroute_engine_kv_offload_tiering_promotion_jobs_total", nil, 1},
		{"vllm:kv_offload_load_bytes_total", nil, 1},
	} {
		if got := scraped(t, b, c.name, c.labels); got < c.min {
			t.Errorf("B %s%v = %v, want at least %v", c.name, c.labels, got, c.min)
		}
	}
	if pulled < 2000 {
		t.Errorf("B pulled %v tokens", pulled)
	}
	if got := scraped(t, a, "kvroute_engine_p2p_served_total", map[string]string{"op": "fetch"}); got < 1 {
		t.Errorf("A served %v fetches", got)
	}

	gone := net.JoinHostPort("127.0.0.1", strconv.Itoa(testnet.FreePort(t)))
	other := append([]int{7}, prompt[1:]...)
	if code := post(t, b.URL()+"/v1/completions", map[string]any{"prompt": other, "max_tokens": 1, "kv_transfer_params": source(gone)}, nil); code != 200 {
		t.Fatalf("a source not there: %d, want the request recomputed", code)
	}
	if got := scraped(t, b, "kvroute_engine_p2p_pull_failures_total", map[string]string{"reason": "unreachable"}); got != 1 {
		t.Errorf("%v unreachable pulls counted", got)
	}
	if got := scraped(t, b, "vllm:kv_offload_tiering_promotion_job_failures_total", nil); got != 1 {
		t.Errorf("%v promotion job failures", got)
	}
}

// TestPullTimeoutRecomputes: on a link so slow that the prefix's transfer
// would outlast vLLM's 30 s load timeout (at time scale 0, so nothing
// waits), B's pull from A fails as a timeout, counted, and the request
// recomputes and completes with nothing pulled.
func TestPullTimeoutRecomputes(t *testing.T) {
	cfg := tieringConfig(t)
	cfg.Sim.Latency.PullBytesPerSecond = 1
	a := start(t, cfg).Engines()[0]
	b := start(t, cfg).Engines()[0]
	prompt := make([]int, 2048)
	for i := range prompt {
		prompt[i] = 3000 + i
	}
	if code := post(t, a.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1}, nil); code != 200 {
		t.Fatalf("seeding A: %d", code)
	}
	var out usageOf
	code := post(t, b.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": source(a.P2PID())}, &out)
	if code != 200 || out.Usage.PromptTokens != len(prompt) {
		t.Fatalf("B: %d %+v: want the request completed", code, out)
	}
	if got := scraped(t, b, "kvroute_engine_p2p_pull_failures_total", map[string]string{"reason": "timeout"}); got != 1 {
		t.Errorf("%v pulls failed as timeouts, want 1", got)
	}
	if got := scraped(t, b, "kvroute_engine_prompt_tokens_by_tier_total", map[string]string{"tier": "p2p"}); got != 0 {
		t.Errorf("%v tokens pulled, want none", got)
	}
	if got := scraped(t, a, "kvroute_engine_p2p_served_total", map[string]string{"op": "lookup"}); got < 1 {
		t.Errorf("A answered %v lookups: the pull never reached it", got)
	}
}
