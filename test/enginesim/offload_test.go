package enginesim_test

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/enginesim/p2p"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// tieringConfig is testConfig with the OffloadingConnector's CPU tier and
// the P2P tier, its side channel on an ephemeral loopback port.
func tieringConfig(t *testing.T) enginesim.Config {
	t.Helper()
	cfg := testConfig()
	k, err := enginesim.ParseKVTransferConfig(offloading(`{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":1e9,"secondary_tiers":[{"type":"p2p"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.KVTransfer = k
	cfg.P2PSideChannelHost = "127.0.0.1"
	cfg.P2PSideChannelPort = 0
	return cfg
}

// source is a remote_kv_source naming peer.
func source(peer string) map[string]any {
	host, port, _ := net.SplitHostPort(peer)
	p, _ := strconv.Atoi(port)
	return map[string]any{"remote_kv_source": map[string]any{"kv_request_id": "kv-1", "remote_host": host, "remote_port": p}}
}

func ignored(t *testing.T, e *enginesim.Engine, reason string) float64 {
	t.Helper()
	return scraped(t, e, "kvroute_engine_kv_transfer_params_ignored_total", map[string]string{"reason": reason})
}

// TestKVTransferParams: kv_transfer_params is taken on chat, completions
// and Responses; what the connector would not use is ignored and counted
// by reason, never an error; a value that is not an object is vLLM's 400.
func TestKVTransferParams(t *testing.T) {
	e := start(t, tieringConfig(t)).Engines()[0]
	other := net.JoinHostPort("127.0.0.1", strconv.Itoa(testnet.FreePort(t))) // a peer that is not there
	prompt := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
	for _, c := range []struct {
		name   string
		params any
		reason string // the counter that grows; "" none
	}{
		{"none", nil, ""},
		{"empty", map[string]any{}, ""},
		{"another connector's keys", map[string]any{"do_remote_prefill": true, "remote_engine_id": nil}, ""},
		{"a source", source(other), ""},
		{"a source's port as a string", map[string]any{"remote_kv_source": map[string]any{"kv_request_id": "k", "remote_host": "127.0.0.1", "remote_port": "5710"}}, ""},
		{"legacy keys", map[string]any{"p2p": map[string]any{"host": "x"}}, "legacy_key"},
		{"source not an object", map[string]any{"remote_kv_source": "10.0.0.1:5710"}, "malformed"},
		{"source without an id", map[string]any{"remote_kv_source": map[string]any{"remote_host": "h", "remote_port": 5710}}, "malformed"},
		{"source port out of range", map[string]any{"remote_kv_source": map[string]any{"kv_request_id": "k", "remote_host": "h", "remote_port": 70000}}, "malformed"},
		{"source host too long", map[string]any{"remote_kv_source": map[string]any{"kv_request_id": "k", "remote_host": strings.Repeat("h", 300), "remote_port": 1}}, "malformed"},
		{"P/D decode leg", map[string]any{"remote_prefiller": map[string]any{"kv_request_id": "k", "remote_host": "h", "remote_port": 1}}, "not_modelled"},
		{"this rank itself", source(e.P2PID()), "self"},
	} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/v1/responses"} {
			body := map[string]any{"max_tokens": 1, "prompt": prompt}
			switch path {
			case "/v1/chat/completions":
				body = map[string]any{"max_tokens": 1, "messages": []map[string]string{{"role": "user", "content": "hi"}}}
			case "/v1/responses":
				body = map[string]any{"max_output_tokens": 1, "input": "hi"}
			}
			if c.params != nil {
				body["kv_transfer_params"] = c.params
			}
			before := 0.0
			if c.reason != "" {
				before = ignored(t, e, c.reason)
			}
			if code := post(t, e.URL()+path, body, nil); code != 200 {
				t.Errorf("%s on %s: %d, want 200 (ignored, as the connector ignores it)", c.name, path, code)
			}
			if c.reason != "" {
				if got := ignored(t, e, c.reason); got != before+1 {
					t.Errorf("%s on %s: %s counted %v, want %v", c.name, path, c.reason, got, before+1)
				}
			}
		}
	}
	// The P/D decode leg's remote_prefiller hides a remote_kv_source (vLLM
	// reads the first it finds); remote_decoder does not.
	before := ignored(t, e, "not_modelled")
	post(t, e.URL()+"/v1/completions", map[string]any{"max_tokens": 1, "prompt": prompt, "kv_transfer_params": map[string]any{
		"remote_decoder": map[string]any{"kv_request_id": "d"}, "remote_kv_source": source(other)["remote_kv_source"]}}, nil)
	if got := ignored(t, e, "not_modelled"); got != before+1 {
		t.Errorf("remote_decoder counted %v times", got-before)
	}
	for _, v := range []string{`"x"`, `[]`, `1`, `true`} {
		var eb errorBody
		code := postRaw(t, e.URL()+"/v1/completions", []byte(`{"prompt":[1,2,3],"max_tokens":1,"kv_transfer_params":`+v+`}`), &eb)
		if code != 400 || eb.Error.Code != 400 || eb.Error.Type != "BadRequestError" || !strings.Contains(eb.Error.Message, "kv_transfer_params") {
			t.Errorf("kv_transfer_params %s: %d %+v, want vLLM's 400", v, code, eb)
		}
	}
}

// TestKVTransferParamsWithoutP2PTier: a remote_kv_source on an engine
// without the P2P tier (no connector, or the CPU tier alone) is ignored,
// counted as no_p2p_tier.
func TestKVTransferParamsWithoutP2PTier(t *testing.T) {
	cpuOnly := testConfig()
	k, err := enginesim.ParseKVTransferConfig(offloading(`{"cpu_bytes_to_use":1e9}`))
	if err != nil {
		t.Fatal(err)
	}
	cpuOnly.KVTransfer = k
	for name, cfg := range map[string]enginesim.Config{"no connector": testConfig(), "CPU tier alone": cpuOnly} {
		e := start(t, cfg).Engines()[0]
		if e.P2PID() != "" {
			t.Errorf("%s: a side channel at %s", name, e.P2PID())
		}
		code := post(t, e.URL()+"/v1/completions", map[string]any{"max_tokens": 1, "prompt": []int{1, 2, 3},
			"kv_transfer_params": source("127.0.0.1:5710")}, nil)
		if code != 200 || ignored(t, e, "no_p2p_tier") != 1 {
			t.Errorf("%s: %d, %v counted", name, code, ignored(t, e, "no_p2p_tier"))
		}
	}
}

// TestRenderEchoesKVTransferParams: the render endpoints return the
// request's kv_transfer_params in the GenerateRequest, as vLLM's do.
func TestRenderEchoesKVTransferParams(t *testing.T) {
	e := start(t, testConfig()).Engines()[0]
	params := map[string]any{"remote_kv_source": map[string]any{"kv_request_id": "k", "remote_host": "h", "remote_port": 1.0}}
	var out []map[string]any
	if code := post(t, e.URL()+"/v1/completions/render", map[string]any{"prompt": "hi", "kv_transfer_params": params}, &out); code != 200 || len(out) != 1 {
		t.Fatalf("%d %v", code, out)
	}
	got, _ := json.Marshal(out[0]["kv_transfer_params"])
	want, _ := json.Marshal(params)
	if string(got) != string(want) {
		t.Errorf("kv_transfer_params %s, want %s", got, want)
	}
	var one map[string]any
	post(t, e.URL()+"/v1/chat/completions/render", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}}, &one)
	if v, ok := one["kv_transfer_params"]; !ok || v != nil {
		t.Errorf("without: %v, want null", v)
	}
}

// TestConnectorMetrics: the connector's series are on /metrics, under
// vLLM's names, only when the connector is configured; the P2P tier's with
// tier="1:p2p".
func TestConnectorMetrics(t *testing.T) {
	cpuOnly := testConfig()
	k, err := enginesim.ParseKVTransferConfig(offloading(`{"cpu_bytes_to_use":1e9}`))
	if err != nil {
		t.Fatal(err)
	}
	cpuOnly.KVTransfer = k
	series := func(e *enginesim.Engine, name string, labels map[string]string) int {
		return metrictest.Series(metrictest.Families(t, e.URL()+"/metrics"), name, labels)
	}
	offload := []string{"vllm:kv_offload_load_bytes_total", "vllm:kv_offload_load_time_total", "vllm:kv_offload_load_size",
		"vllm:kv_offload_store_bytes_total", "vllm:kv_offload_store_time_total", "vllm:kv_offload_store_size",
		"vllm:kv_offload_total_bytes_total", "vllm:kv_offload_total_time_total", "vllm:kv_offload_size", "kvroute_engine_prompt_tokens_by_tier_total"}
	tiering := []string{"vllm:kv_offload_tiering_read_bytes_total", "vllm:kv_offload_tiering_read_time_total", "vllm:kv_offload_tiering_write_bytes_total",
		"vllm:kv_offload_tiering_write_time_total", "vllm:kv_offload_tiering_promotion_job_failures_total", "vllm:kv_offload_tiering_cascade_job_failures_total",
		"vllm:kv_offload_tiering_block_queries_total", "vllm:kv_offload_tiering_block_hits_total", "kvroute_engine_kv_offload_tiering_promotion_jobs_total"}
	side := []string{"kvroute_engine_p2p_pull_failures_total", "kvroute_engine_p2p_connections_total", "kvroute_engine_p2p_sessions",
		"kvroute_engine_p2p_frames_rejected_total", "kvroute_engine_p2p_served_total"}
	skipped := []string{"vllm:kv_offload_stores_skipped_total"}
	for _, c := range []struct {
		name    string
		cfg     enginesim.Config
		present [][]string
		absent  [][]string
	}{
		{"no connector", testConfig(), nil, [][]string{offload, tiering, side, skipped}},
		{"CPU tier", cpuOnly, [][]string{offload, skipped}, [][]string{tiering, side}},
		{"P2P tier", tieringConfig(t), [][]string{offload, tiering, side}, [][]string{skipped}},
	} {
		e := start(t, c.cfg).Engines()[0]
		for _, names := range c.present {
			for _, n := range names {
				if series(e, n, nil) == 0 {
					t.Errorf("%s: no %s", c.name, n)
				}
			}
		}
		for _, names := range c.absent {
			for _, n := range names {
				if series(e, n, nil) != 0 {
					t.Errorf("%s: %s is there", c.name, n)
				}
			}
		}
		for _, n := range []string{"vllm:external_prefix_cache_queries_total", "vllm:external_prefix_cache_hits_total"} {
			if series(e, n, nil) != 1 {
				t.Errorf("%s: %s missing (vLLM always exports it)", c.name, n)
			}
		}
	}
	e := start(t, tieringConfig(t)).Engines()[0]
	if code := post(t, e.URL()+"/reset_prefix_cache?reset_external=true", nil, nil); code != 200 {
		t.Errorf("reset with reset_external: %d", code)
	}
	if series(e, "vllm:kv_offload_tiering_read_bytes_total", map[string]string{"tier": "1:p2p", "engine": "0"}) != 1 ||
		series(e, "vllm:kv_offload_total_bytes_total", map[string]string{"transfer_type": "CPU_to_GPU"}) != 1 {
		t.Error("labels: want tier=1:p2p and transfer_type")
	}
}

// peerNode is a bare side channel, as another engine's, with fp's
// fingerprint; its own lookups answer nothing.
func peerNode(t *testing.T, fp p2p.Fingerprint) *p2p.Node {
	t.Helper()
	c := p2p.DefaultConfig()
	c.Host, c.Port, c.Fingerprint = "127.0.0.1", 0, fp
	n, err := p2p.New(c, func(context.Context, []blockkey.Digest) (int, error) { return 0, nil }, zaptest.NewLogger(t), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n
}

// TestSideChannel: an engine with the P2P tier answers peers on its side
// channel through its scheduler (its CPU tier holds nothing here), and
// rejects a peer whose fingerprint differs; rank r listens on the base
// port + r.
func TestSideChannel(t *testing.T) {
	cfg := tieringConfig(t)
	base := testnet.FreePortPair(t)
	cfg.P2PSideChannelPort = base
	cfg.DataParallelSize = 2
	p := start(t, cfg)
	for r, e := range p.Engines() {
		if want := net.JoinHostPort("127.0.0.1", strconv.Itoa(base+r)); e.P2PID() != want {
			t.Errorf("rank %d listens at %s, want %s", r, e.P2PID(), want)
		}
	}
	e := p.Engines()[0]
	fp := p2p.Fingerprint{BlockSize: cfg.BlockSize, HashSeed: cfg.HashSeed, HashAlgo: cfg.HashAlgo, Model: cfg.Model}
	hs := make([]blockkey.Digest, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := peerNode(t, fp).Pull(ctx, e.P2PID(), "kv-1", hs, func(int, int, int, bool) time.Duration { return 0 })
	if err != nil || res.Hits != 0 {
		t.Fatalf("pull from an empty CPU tier: %+v, %v", res, err)
	}
	if got := scraped(t, e, "kvroute_engine_p2p_served_total", map[string]string{"op": "lookup"}); got != 1 {
		t.Errorf("%v lookups served", got)
	}
	fp.BlockSize *= 2
	if _, err := peerNode(t, fp).Pull(ctx, e.P2PID(), "kv-2", hs, func(int, int, int, bool) time.Duration { return 0 }); p2p.Reason(err) != "rejected" {
		t.Errorf("a peer with another offload block: %v, want rejected", err)
	}
	if got := scraped(t, e, "kvroute_engine_p2p_connections_total", map[string]string{"outcome": "rejected"}); got != 1 {
		t.Errorf("%v rejections", got)
	}
}
