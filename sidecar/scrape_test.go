package sidecar

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestScrapeCounters: the stream judge's counters are read from vLLM's
// /metrics as Python's client writes it (counter families named with
// _total, _created gauges beside them, a series per label set, summed);
// the prefix-cache counters of vLLM ~0.9–0.10 (vllm:gpu_prefix_cache_*)
// count too, and a missing family is reported missing.
func TestScrapeCounters(t *testing.T) {
	current := `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4800.0
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1600.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 1.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 5000.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 900.0
`
	old := `# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{model_name="m"} 320.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 16.0
`
	queriesOnly := `# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total 10
`
	for _, tc := range []struct {
		name, body           string
		queries, hits, reqs  float64
		haveQueries, haveReq bool
		inFlight             float64
	}{
		{"current vLLM", current, 4800, 1600, 13, true, true, 5},
		{"vLLM 0.9", old, 320, 16, 0, true, false, 0},
		{"queries without hits", queriesOnly, 10, 0, 0, false, false, 0},
		{"nothing", "", 0, 0, 0, false, false, 0},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(tc.body)) }))
		r, err := scrape(context.Background(), srv.Client(), srv.URL)
		srv.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		c := r.counters
		if c.PrefixQueries != tc.queries || c.PrefixHits != tc.hits || c.HaveQueries != tc.haveQueries ||
			c.Requests != tc.reqs || c.HaveRequests != tc.haveReq || c.InFlight != tc.inFlight {
			t.Errorf("%s: %+v", tc.name, c)
		}
		if tc.name == "current vLLM" && (c.PromptTokens != 5000 || c.GenerationTokens != 900) {
			t.Errorf("%s: prompt/generation tokens %+v", tc.name, c)
		}
	}
}

// TestScrapeEngineStats: the engine's own request figures are read from
// vLLM's /metrics as Python's client writes it: the sums and counts of the
// queue, prefill and TTFT histograms and the prompt and prefix-cache-hit
// counters, each summed over its series (one per engine); vLLM ~0.9–0.10's
// vllm:gpu_prefix_cache_hits_total when the current name is absent; a
// histogram written without its TYPE line read from its _sum and _count;
// and an engine exporting none of them reports Have false, without error.
func TestScrapeEngineStats(t *testing.T) {
	hist := func(name string, engine string, sum, count float64) string {
		l := `engine="` + engine + `",model_name="m"`
		return fmt.Sprintf("%s_bucket{%s,le=\"0.3\"} %g\n%s_bucket{%s,le=\"+Inf\"} %g\n%s_count{%s} %g\n%s_sum{%s} %g\n",
			name, l, count, name, l, count, name, l, count, name, l, sum)
	}
	typed := func(name, help string) string {
		return "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n" +
			hist(name, "0", 1.5, 4) + hist(name, "1", 0.25, 2) +
			"# TYPE " + name + "_created gauge\n" + name + `_created{engine="0",model_name="m"} 1.7e9` + "\n"
	}
	current := typed("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.") +
		typed("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.") +
		typed("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.") +
		`# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 5000.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1600.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 400.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{engine="0",model_name="m"} 99.0
`
	old := typed("vllm:time_to_first_token_seconds", "TTFT.") + `# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="m"} 320.0
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{model_name="m"} 16.0
`
	untyped := hist("vllm:time_to_first_token_seconds", "0", 2, 3)
	none := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 5000.0
`
	for _, tc := range []struct {
		name, body string
		want       EngineStats
	}{
		{"current vLLM", current, EngineStats{Have: true, QueueSeconds: 1.75, QueueCount: 6, PrefillSeconds: 1.75, PrefillCount: 6,
			TTFTSeconds: 1.75, TTFTCount: 6, PromptTokens: 6000, CachedTokens: 2000}},
		{"vLLM 0.9", old, EngineStats{Have: true, TTFTSeconds: 1.75, TTFTCount: 6, PromptTokens: 320, CachedTokens: 16}},
		{"no TYPE line", untyped, EngineStats{Have: true, TTFTSeconds: 2, TTFTCount: 3}},
		{"none", none, EngineStats{}},
		{"nothing", "", EngineStats{}},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(tc.body)) }))
		r, err := scrape(context.Background(), srv.Client(), srv.URL)
		srv.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.load.Engine != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, r.load.Engine, tc.want)
		}
	}
}
