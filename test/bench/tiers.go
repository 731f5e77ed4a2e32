package bench

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"time"
)

// EngineTiers are the engines' own figures of where the prompt tokens'
// KV came from (vllm:prompt_tokens, vllm:prefix_cache_hits for the GPU,
// kvroute_engine_prompt_tokens_by_tier for the CPU tier and the pulls),
// as shares of the prompt tokens, and the pulls: started, failed into a
// recompute, and the bytes read over the P2P tier. Summed over the
// fleet at a run's end (the fleet is fresh for each policy).
type EngineTiers struct {
	PromptTokens float64 `json:"prompt_tokens"`
	GPUHit       float64 `json:"gpu_hit_share"`
	CPUHit       float64 `json:"cpu_hit_share"`
	Pulled       float64 `json:"pulled_share"`
	Recomputed   float64 `json:"recomputed_share"`
	Pulls        float64 `json:"pulls"`
	PullFailures float64 `json:"pull_failures"`
	PulledBytes  float64 `json:"pulled_bytes"`
}

// engineTiers scrapes every engine's /metrics for its tier figures.
func engineTiers(ctx context.Context, engines []string) (*EngineTiers, error) {
	var prompt, gpu, cpu, pulled float64
	t := &EngineTiers{}
	for _, u := range engines {
		var text string
		err := getOK(ctx, u+"/metrics", 5*time.Second, func(r io.Reader) error {
			b, err := io.ReadAll(io.LimitReader(r, 16<<20))
			text = string(b)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("engine tiers: %w", err)
		}
		prompt += metricSum(text, `vllm:prompt_tokens_total\{[^}]*\}`)
		gpu += metricSum(text, `vllm:prefix_cache_hits_total\{[^}]*\}`)
		cpu += metricSum(text, `kvroute_engine_prompt_tokens_by_tier_total\{[^}]*tier="cpu"[^}]*\}`)
		pulled += metricSum(text, `kvroute_engine_prompt_tokens_by_tier_total\{[^}]*tier="p2p"[^}]*\}`)
		t.Pulls += metricSum(text, `kvroute_engine_kv_offload_tiering_promotion_jobs_total\{[^}]*\}`)
		t.PullFailures += metricSum(text, `kvroute_engine_p2p_pull_failures_total\{[^}]*\}`)
		t.PulledBytes += metricSum(text, `vllm:kv_offload_tiering_read_bytes_total\{[^}]*\}`)
	}
	t.PromptTokens = prompt
	if prompt > 0 {
		t.GPUHit, t.CPUHit, t.Pulled = gpu/prompt, cpu/prompt, pulled/prompt
		t.Recomputed = max(0, 1-t.GPUHit-t.CPUHit-t.Pulled)
	}
	return t, nil
}

// metricSum sums the samples of the series matching series (a regular
// expression for the name and labels) in a /metrics text.
func metricSum(text, series string) float64 {
	sum := 0.0
	for _, m := range regexp.MustCompile(`(?m)^`+series+` (\S+)$`).FindAllStringSubmatch(text, -1) {
		v, err := strconv.ParseFloat(m[1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}
