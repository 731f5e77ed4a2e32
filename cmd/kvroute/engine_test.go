package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/enginesim/profile"
)

// parseEngine parses args with exactly env set (of the variables vLLM
// reads), and completes the config.
func parseEngine(t *testing.T, env map[string]string, args ...string) (*enginesim.Config, error) {
	t.Helper()
	for _, k := range []string{"PYTHONHASHSEED", "VLLM_ENABLE_SCALE_OUT_ENDPOINTS", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES",
		"VLLM_P2P_SIDE_CHANNEL_HOST", "VLLM_P2P_SIDE_CHANNEL_PORT", "VLLM_P2P_HANDSHAKE_TIMEOUT_S"} {
		v, ok := env[k]
		if ok {
			t.Setenv(k, v)
		} else {
			t.Setenv(k, "") // restored after the test
			if err := os.Unsetenv(k); err != nil {
				t.Fatal(err)
			}
		}
	}
	cmd, cfg, finish := engineCommand()
	if err := cmd.ParseFlags(args); err != nil {
		return nil, err
	}
	return cfg, finish()
}

func TestEngineFlags(t *testing.T) {
	cfgp, err := parseEngine(t, map[string]string{"PYTHONHASHSEED": "42", "VLLM_ENABLE_SCALE_OUT_ENDPOINTS": "1", "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"},
		"--model", "m", "--served-model-name", "a,b", "--port", "9000", "--block-size", "32",
		"--num-gpu-blocks", "1000", "--max-model-len", "4096", "--max-num-seqs", "8", "--max-num-batched-tokens", "512",
		"--kv-events-config", `{"enable_kv_cache_events":true,"endpoint":"tcp://*:6000","replay_endpoint":"tcp://*:6001","topic":"t"}`,
		"--enable-prompt-tokens-details", "--data-parallel-size", "2", "--enable-lora", "--lora-modules", "x=/p/x", "--lora-modules", "y=/p/y",
		"--sim-event-layout", "array", "--sim-replay-layout", "legacy", "--sim-time-scale", "0.5", "--sim-drop-events-pct", "10", "--sim-delay-events", "5ms")
	if err != nil {
		t.Fatal(err)
	}
	cfg := *cfgp
	checks := map[string]bool{
		"model":      cfg.Model == "m" && strings.Join(cfg.ServedModelNames, ",") == "a,b",
		"sizes":      cfg.Port == 9000 && cfg.BlockSize == 32 && cfg.NumGPUBlocks == 1000 && cfg.MaxModelLen == 4096 && cfg.MaxNumSeqs == 8 && cfg.MaxNumBatchedTokens == 512,
		"seed":       cfg.HashSeed == "42",
		"env":        cfg.EnableScaleOutEndpoints && !cfg.IntBlockHashes,
		"events":     cfg.KVEvents.Enabled() && cfg.KVEvents.Endpoint == "tcp://*:6000" && *cfg.KVEvents.ReplayEndpoint == "tcp://*:6001" && cfg.KVEvents.Topic == "t",
		"dp":         cfg.DataParallelSize == 2 && cfg.EnablePromptTokensDetails,
		"lora":       len(cfg.LoRAModules) == 2 && cfg.LoRAModules[1].Name == "y" && cfg.LoRAModules[1].Path == "/p/y",
		"sim layout": cfg.Sim.EventLayout == kvevents.LayoutArray && cfg.Sim.ReplayLayout == kvevents.ReplayLegacy,
		"sim":        cfg.Sim.TimeScale == 0.5 && cfg.Sim.DropEventsPercent == 10 && cfg.Sim.EventDelay == 5*time.Millisecond,
	}
	for name, ok := range checks {
		if !ok {
			t.Errorf("%s not applied: %+v", name, cfg)
		}
	}
	// --hash-seed wins over PYTHONHASHSEED; neither gives vLLM's default.
	cfgp, err = parseEngine(t, map[string]string{"PYTHONHASHSEED": "42"}, "--hash-seed", "7")
	if err != nil || cfgp.HashSeed != "7" {
		t.Fatalf("--hash-seed: %v", err)
	}
	cfgp, err = parseEngine(t, nil)
	if err != nil || cfgp.HashSeed != "vllm-none-hash" || !cfgp.IntBlockHashes || cfgp.Runner != enginesim.RunnerAuto {
		t.Fatalf("defaults: %v", err)
	}
	// The runner, and older vLLM's --task for it.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--runner", "pooling"}, enginesim.RunnerPooling},
		{[]string{"--runner", "generate"}, enginesim.RunnerGenerate},
		{[]string{"--task", "embed"}, enginesim.RunnerPooling},
		{[]string{"--task", "classify", "--runner", "pooling"}, enginesim.RunnerPooling},
		{[]string{"--task", "generate"}, enginesim.RunnerGenerate},
	} {
		if cfgp, err = parseEngine(t, nil, tc.args...); err != nil || cfgp.Runner != tc.want {
			t.Errorf("%v: runner %v (%v), want %s", tc.args, cfgp, err, tc.want)
		}
	}
	for _, bad := range [][]string{
		{"--prefix-caching-hash-algo", "sha256"},
		{"--kv-events-config", `{"bogus":1}`},
		{"--sim-event-layout", "tuple"},
		{"--lora-modules", "x=/p"}, // without --enable-lora
		{"--lora-modules", "novalue", "--enable-lora"},
		{"--runner", "draft"},
		{"--task", "transcription"},
		{"--task", "embed", "--runner", "generate"},
	} {
		if _, err := parseEngine(t, nil, bad...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if _, err := parseEngine(t, map[string]string{"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "maybe"}); err == nil {
		t.Error("bad VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES accepted")
	}
}

func TestSidecarFlagsAndConfigFile(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/sidecar.json"
	if err := os.WriteFile(file, []byte(`{"engine-url":"http://10.1.2.3:9000","data-parallel-size":2,"topic":"kv@pod","kv-events-mode":"bind","capacity":1000}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, cfg, finish := sidecarCommand()
	if err := cmd.ParseFlags([]string{"--config", file, "--topic", "from-flag", "--replay", "", "--grpc-listen", "127.0.0.1:9999",
		"--join", "a:7946,kvroute-gossip.ns.svc", "--gossip-bind", "127.0.0.1:7000", "--gossip-advertise", "10.0.0.5:7001", "--node-name", "pod-a"}); err != nil {
		t.Fatal(err)
	}
	if err := finish(); err != nil {
		t.Fatal(err)
	}
	if cfg.EngineURL != "http://10.1.2.3:9000" || cfg.DataParallelSize != 2 || cfg.Topic != "from-flag" || !cfg.Bind || cfg.Capacity != 1000 || cfg.Replay != "" || cfg.GRPCListen != "127.0.0.1:9999" ||
		cfg.Gossip == nil || cfg.Gossip.BindAddr != "127.0.0.1" || cfg.Gossip.BindPort != 7000 || cfg.Gossip.AdvertiseAddr != "10.0.0.5" ||
		cfg.Gossip.AdvertisePort != 7001 || len(cfg.Gossip.Join) != 2 || cfg.Gossip.NodeName != "pod-a" {
		t.Fatalf("config %+v", cfg)
	}
	for _, bad := range []string{`{"nope":1}`, `{`, `{"data-parallel-size":"x"}`} {
		if err := os.WriteFile(file, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd, _, finish := sidecarCommand()
		_ = cmd.ParseFlags([]string{"--config", file})
		if err := finish(); err == nil {
			t.Errorf("config %s accepted", bad)
		}
	}
	cmd, _, finish = sidecarCommand()
	_ = cmd.ParseFlags([]string{"--kv-events-mode", "both"})
	if err := finish(); err == nil {
		t.Error("bad mode accepted")
	}
	cmd, cfg, finish = sidecarCommand()
	_ = cmd.ParseFlags([]string{"--gossip-bind", ""})
	if err := finish(); err != nil || cfg.Gossip != nil {
		t.Errorf("gossip not disabled: %v", err)
	}
	cmd, _, finish = sidecarCommand()
	_ = cmd.ParseFlags([]string{"--gossip-bind", "nope"})
	if err := finish(); err == nil {
		t.Error("bad gossip bind accepted")
	}
	cmd, _, finish = sidecarCommand()
	_ = cmd.ParseFlags([]string{"--grpc-tls-cert", "c.pem"})
	if err := finish(); err == nil {
		t.Error("a TLS cert without a key accepted")
	}
	cmd, _, finish = sidecarCommand()
	_ = cmd.ParseFlags([]string{"--engine-url", "nope"})
	if err := finish(); err == nil {
		t.Error("bad engine URL accepted")
	}
}

// TestEngineProfileFlag: --profile sets the latency model and, for the
// flags not given, the sizes (the KV capacity in tokens kept at another
// --block-size); the --sim-* latency flags override the profile's terms;
// an unknown profile is an error naming the profiles.
func TestEngineProfileFlag(t *testing.T) {
	def, err := parseEngine(t, nil)
	if err != nil || def.Sim.Latency.Name != profile.SimDefault || def.NumGPUBlocks != 8192 || def.BlockSize != 16 || def.MaxNumBatchedTokens != 8192 || def.MaxModelLen != 32768 {
		t.Fatalf("defaults: %v, %+v", err, def)
	}
	if want := profile.Default(); def.Sim.Profile().StepBase != want.StepBase || def.Sim.Profile().PrefillTokensPerSecond != want.PrefillTokensPerSecond || def.Sim.Profile().DecodePerSeq != want.DecodePerSeq {
		t.Fatalf("default latency %+v, want sim-default's", def.Sim.Latency)
	}
	gpt, _ := profile.Named(profile.GPTOSS120BH200)
	glm, _ := profile.Named(profile.GLM52Rank)
	for _, c := range []struct {
		args  []string
		check func(*enginesim.Config) bool
	}{
		{[]string{"--profile", profile.GPTOSS120BH200}, func(c *enginesim.Config) bool {
			return c.Sim.Latency.Name == gpt.Name && c.Sim.Latency.PrefillQuadratic == gpt.PrefillQuadratic &&
				c.NumGPUBlocks == gpt.NumGPUBlocks && c.BlockSize == gpt.BlockSize && c.MaxNumBatchedTokens == gpt.MaxNumBatchedTokens && c.MaxModelLen == gpt.MaxModelLen
		}},
		{[]string{"--profile", profile.GPTOSS120BH200, "--block-size", "32"}, func(c *enginesim.Config) bool {
			return c.BlockSize == 32 && c.NumGPUBlocks == gpt.NumGPUBlocks/2
		}},
		{[]string{"--profile", profile.GPTOSS120BH200, "--num-gpu-blocks", "1000", "--max-num-batched-tokens", "512", "--max-model-len", "4096"}, func(c *enginesim.Config) bool {
			return c.NumGPUBlocks == 1000 && c.MaxNumBatchedTokens == 512 && c.MaxModelLen == 4096 && c.Sim.Latency.StepBase == gpt.StepBase
		}},
		{[]string{"--num-gpu-blocks-override", "1000", "--profile", profile.GLM52Rank}, func(c *enginesim.Config) bool {
			return c.NumGPUBlocks == 1000 && c.MaxNumBatchedTokens == glm.MaxNumBatchedTokens
		}},
		{[]string{"--profile", profile.GLM52Rank, "--sim-prefill-tokens-per-s", "3585", "--sim-step-base", "10ms", "--sim-step-per-seq", "1ms"}, func(c *enginesim.Config) bool {
			l := c.Sim.Profile()
			return l.PrefillTokensPerSecond == 3585 && l.StepBase == 10*time.Millisecond && l.DecodePerSeq == time.Millisecond &&
				l.PrefillQuadratic == glm.PrefillQuadratic && l.DecodePerKVToken == glm.DecodePerKVToken
		}},
		{[]string{"--sim-prefill-tokens-per-s", "250"}, func(c *enginesim.Config) bool {
			return c.Sim.Profile().Name == profile.SimDefault && c.Sim.Profile().PrefillTokensPerSecond == 250 && c.Sim.Profile().StepBase == 25*time.Millisecond
		}},
	} {
		cfg, err := parseEngine(t, nil, c.args...)
		if err != nil || !c.check(cfg) {
			t.Errorf("%v: %v, %+v", c.args, err, cfg)
		}
	}
	_, err = parseEngine(t, nil, "--profile", "h100")
	if err == nil {
		t.Fatal("an unknown profile was accepted")
	}
	for _, name := range profile.Names() {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("the error %q does not list %s", err, name)
		}
	}
	for _, bad := range [][]string{{"--sim-prefill-tokens-per-s", "-5"}, {"--sim-step-base", "-1ms"}, {"--profile", profile.Qwen332BH100TP2, "--sim-step-per-seq", "-1ms"}} {
		if _, err := parseEngine(t, nil, bad...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestEngineKVTransferFlags: --kv-transfer-config and the P2P tier's
// environment, with vLLM's defaults and refusals.
func TestEngineKVTransferFlags(t *testing.T) {
	const tiering = `{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":1e9,"block_size":64,"secondary_tiers":[{"type":"p2p"}]}}`
	cfg, err := parseEngine(t, nil, "--block-size", "16", "--kv-transfer-config", tiering)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.KVTransfer.P2PEnabled() || cfg.KVTransfer.Offload.CPUBytes != 1e9 || cfg.KVTransfer.OffloadBlockTokens(16) != 64 ||
		cfg.P2PSideChannelHost != "localhost" || cfg.P2PSideChannelPort != 5710 || cfg.P2PHandshakeTimeout != 10*time.Second {
		t.Errorf("defaults: %+v", cfg)
	}
	cfg, err = parseEngine(t, map[string]string{"VLLM_P2P_SIDE_CHANNEL_HOST": "10.0.0.5", "VLLM_P2P_SIDE_CHANNEL_PORT": "6000",
		"VLLM_P2P_HANDSHAKE_TIMEOUT_S": "2.5"}, "--block-size", "16", "--kv-transfer-config", tiering)
	if err != nil || cfg.P2PSideChannelHost != "10.0.0.5" || cfg.P2PSideChannelPort != 6000 || cfg.P2PHandshakeTimeout != 2500*time.Millisecond {
		t.Errorf("environment: %v %+v", err, cfg)
	}
	cfg, err = parseEngine(t, nil)
	if err != nil || cfg.KVTransfer.Enabled() {
		t.Errorf("no connector by default: %v %+v", err, cfg.KVTransfer)
	}
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"--block-size", "16", "--kv-transfer-config", strings.Replace(tiering, `"block_size":64`, `"block_size":40`, 1)}, "multiple of the GPU block"},
		{nil, []string{"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`}, "not simulated"},
		{nil, []string{"--kv-transfer-config", `{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"cpu_bytes_to_use":1,"eviction_policy":"arc"}}`}, "arc is not modelled"},
		{map[string]string{"VLLM_P2P_SIDE_CHANNEL_PORT": "port"}, []string{"--kv-transfer-config", tiering}, "VLLM_P2P_SIDE_CHANNEL_PORT"},
		{map[string]string{"VLLM_P2P_HANDSHAKE_TIMEOUT_S": "0"}, []string{"--kv-transfer-config", tiering}, "VLLM_P2P_HANDSHAKE_TIMEOUT_S"},
	} {
		if _, err := parseEngine(t, c.env, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: %v, want an error saying %q", c.env, c.args, err, c.want)
		}
	}
}
