package enginesim

import (
	"context"
	"crypto/sha256"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/test/enginesim/p2p"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestPull: a pull the core would ask for goes to the peer off the
// scheduler goroutine and comes back as what to resolve: the blocks the
// peer held, or a failure with its reason; the P2P tier's metrics count
// it.
func TestPull(t *testing.T) {
	e := tieringEngine(t, nil)
	cfg := e.cfg

	hs := make([]blockkey.Digest, 6)
	for i := range hs {
		hs[i] = sha256.Sum256([]byte{byte(i)})
	}
	held := map[blockkey.Digest]bool{hs[0]: true, hs[1]: true, hs[2]: true, hs[3]: true}
	pc := p2p.DefaultConfig()
	pc.Host, pc.Port, pc.Fingerprint = "127.0.0.1", 0, cfg.p2pFingerprint()
	src, err := p2p.New(pc, func(_ context.Context, q []blockkey.Digest) (int, error) {
		n := 0
		for n < len(q) && held[q[n]] {
			n++
		}
		return n, nil
	}, zaptest.NewLogger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := e.pull(ctx, lookup{id: 7, source: src.ID(), hashes: hs}, "kv-7")
	if d.id != 7 || d.failed || d.blocks != 4 || d.probed != 6 || d.found != 4 {
		t.Fatalf("pull: %+v, want 4 blocks of 6 probed", d)
	}
	e.metrics.offload.observePull(d)
	gone := net.JoinHostPort("127.0.0.1", strconv.Itoa(testnet.FreePort(t)))
	d = e.pull(ctx, lookup{id: 8, source: gone, hashes: hs}, "kv-8")
	if !d.failed || d.reason != "unreachable" || d.blocks != 0 {
		t.Fatalf("pull from nowhere: %+v, want an unreachable failure", d)
	}
	e.metrics.offload.observePull(d)

	startedPull(t, e, src.ID(), hs)

	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vllm:kv_offload_tiering_block_queries_total", nil, 14},
		{"vllm:kv_offload_tiering_block_hits_total", nil, 6},
		{"kvroute_engine_p2p_pull_failures_total", map[string]string{"reason": "unreachable"}, 1},
	} {
		if got := metrictest.Gathered(t, e.reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	// What the core would report of a step, counted under vLLM's names.
	e.metrics.offload.observe(e.metrics, offloadStep{PromptTokens: 100, CPUHitTokens: 32, PulledTokens: 48,
		LoadedBytes: 5e6, StoredBytes: 2e6, PulledBytes: 3e6, Pulls: 2, PullFailures: 1}, 1e9)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"vllm:external_prefix_cache_queries_total", nil, 100},
		{"vllm:external_prefix_cache_hits_total", nil, 80},
		{"kvroute_engine_prompt_tokens_by_tier_total", map[string]string{"tier": "cpu"}, 32},
		{"kvroute_engine_prompt_tokens_by_tier_total", map[string]string{"tier": "p2p"}, 48},
		{"vllm:kv_offload_load_bytes_total", nil, 5e6},
		{"vllm:kv_offload_load_time_total", nil, 5e-3},
		{"vllm:kv_offload_store_bytes_total", nil, 2e6},
		{"vllm:kv_offload_total_bytes_total", map[string]string{"transfer_type": "CPU_to_GPU"}, 5e6},
		{"vllm:kv_offload_total_bytes_total", map[string]string{"transfer_type": "GPU_to_CPU"}, 2e6},
		{"vllm:kv_offload_tiering_read_bytes_total", map[string]string{"tier": "1:p2p"}, 3e6},
		{"kvroute_engine_kv_offload_tiering_promotion_jobs_total", nil, 2},
		{"vllm:kv_offload_tiering_promotion_job_failures_total", nil, 1},
	} {
		if got := metrictest.Gathered(t, e.reg, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
