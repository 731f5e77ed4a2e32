package enginesim_test

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// vllmRequestLatencyBuckets are vLLM's buckets for its per-request phase
// histograms (vllm/v1/metrics/loggers.py, request_latency_buckets).
var vllmRequestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
	40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

// TestRequestPhaseHistograms: the engine exports vLLM's
// vllm:request_queue_time_seconds and vllm:request_prefill_time_seconds
// (names, help, labels, buckets), observed when a request finishes, on the
// simulated clock: a request queued behind another has a positive queue
// time, and every finished request's queue and prefill times add up to its
// TTFT. As vLLM's, they are observed at the end: a request with its first
// token but still decoding is in the TTFT histogram, not in these.
func TestRequestPhaseHistograms(t *testing.T) {
	cfg := testConfig()
	// One request at a time, in real time: A's prefill lasts about a
	// second (1,000 tokens at 1,000 tok/s in steps of 256) and its decode
	// another (40 tokens), and B, sent while A runs, waits for A's end.
	cfg.MaxNumSeqs, cfg.Sim.TimeScale, cfg.Sim.PrefillTokensPerSecond, cfg.MaxNumBatchedTokens = 1, 1, 1000, 256
	e := start(t, cfg).Engines()[0]
	prompt := func(base, n int) []int {
		p := make([]int, n)
		for i := range p {
			p[i] = base + i
		}
		return p
	}
	var wg sync.WaitGroup
	send := func(p []int, maxTokens int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": p, "max_tokens": maxTokens, "ignore_eos": true}, nil); code != 200 {
				t.Errorf("status %d", code)
			}
		}()
	}
	inEngine := func(running, waiting int) func() error {
		return func() error {
			st, err := e.Stats()
			if err != nil {
				return err
			}
			if st.Running != running || st.Waiting != waiting {
				return fmt.Errorf("running %d, waiting %d; want %d, %d", st.Running, st.Waiting, running, waiting)
			}
			return nil
		}
	}
	send(prompt(1000, 1000), 40)
	testnet.Await(t, 10*time.Second, time.Millisecond, inEngine(1, 0))
	send(prompt(5000, 20), 2)
	testnet.Await(t, 10*time.Second, time.Millisecond, inEngine(1, 1)) // B is queued behind A
	// A decodes: its TTFT is observed, its queue and prefill times not yet.
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		fams := metrictest.Families(t, e.URL()+"/metrics")
		ttft, queue := metrictest.HistogramOf(fams, "vllm:time_to_first_token_seconds", nil), metrictest.HistogramOf(fams, "vllm:request_queue_time_seconds", nil)
		prefill := metrictest.HistogramOf(fams, "vllm:request_prefill_time_seconds", nil)
		if ttft.Count != 1 || queue.Count != 0 || prefill.Count != 0 {
			return fmt.Errorf("observations: TTFT %d, queue %d, prefill %d; want 1, 0, 0 while A decodes", ttft.Count, queue.Count, prefill.Count)
		}
		return nil
	})
	wg.Wait()

	fams := metrictest.Families(t, e.URL()+"/metrics")
	labels := map[string]string{"model_name": cfg.Model, "engine": "0"}
	hist := map[string]metrictest.Histogram{}
	for name, help := range map[string]string{
		"vllm:request_queue_time_seconds":   "Histogram of time spent in WAITING phase for request.",
		"vllm:request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
		"vllm:time_to_first_token_seconds":  "",
	} {
		i := slices.IndexFunc(fams, func(f *dto.MetricFamily) bool { return f.GetName() == name })
		if i < 0 {
			t.Fatalf("no %s", name)
		}
		if f := fams[i]; help != "" && (f.GetHelp() != help || f.GetType() != dto.MetricType_HISTOGRAM) {
			t.Fatalf("%s: %s %q, want a histogram with vLLM's help %q", name, f.GetType(), f.GetHelp(), help)
		}
		h := metrictest.HistogramOf(fams, name, labels)
		if h.Count != 2 {
			t.Fatalf("%s{%v}: %d observations, want 2 (A and B)", name, labels, h.Count)
		}
		hist[name] = h
		if help == "" {
			continue
		}
		var bounds []float64
		for _, b := range h.Buckets {
			bounds = append(bounds, b.UpperBound)
		}
		if !slices.Equal(bounds[:len(bounds)-1], vllmRequestLatencyBuckets) || !math.IsInf(bounds[len(bounds)-1], 1) {
			t.Fatalf("%s: buckets %v, want vLLM's %v and +Inf", name, bounds, vllmRequestLatencyBuckets)
		}
	}
	queue, prefill, ttft := hist["vllm:request_queue_time_seconds"], hist["vllm:request_prefill_time_seconds"], hist["vllm:time_to_first_token_seconds"]
	if queue.Sum < 0.025 { // at least the step A was in when B came
		t.Fatalf("queue time %v s: B waited behind A", queue.Sum)
	}
	if prefill.Sum < 1 { // A's 1,000 tokens at 1,000 tok/s
		t.Fatalf("prefill time %v s, want ≥ 1", prefill.Sum)
	}
	if d := queue.Sum + prefill.Sum - ttft.Sum; math.Abs(d) > 1e-9 {
		t.Fatalf("queue %v + prefill %v s ≠ TTFT %v s (by %g)", queue.Sum, prefill.Sum, ttft.Sum, d)
	}
}
