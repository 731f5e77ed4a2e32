package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/enginesim/profile"
)

// newLogger returns a JSON logger at the given level (debug, info, warn, error).
func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	return cfg.Build()
}

func newEngineCommand() *cobra.Command {
	cmd, _, _ := engineCommand()
	return cmd
}

// engineCommand returns the command, the config its flags fill, and the
// step that completes the config from parsed flags and the environment.
func engineCommand() (*cobra.Command, *enginesim.Config, func() error) {
	cfg := enginesim.DefaultConfig()
	var (
		kvEventsJSON, kvTransferJSON, hashSeed, eventLayout, replayLayout, logLevel, task, profileName string
		loraModules                                                                                    []string
		numGPUBlocks                                                                                   int
		stepBase, stepPerSeq                                                                           time.Duration
	)
	var cmd *cobra.Command
	// finish completes cfg from the flags that need parsing and from the
	// environment vLLM reads, then validates it.
	finish := func(cmd *cobra.Command) error {
		fl := cmd.Flags()
		if err := applyProfile(fl.Changed, &cfg, profileName, numGPUBlocks, stepBase, stepPerSeq); err != nil {
			return err
		}
		if fl.Changed("task") {
			runner, err := runnerOfTask(task)
			if err != nil {
				return err
			}
			if fl.Changed("runner") && cfg.Runner != runner {
				return fmt.Errorf("--task %s means --runner %s, not --runner %s", task, runner, cfg.Runner)
			}
			cfg.Runner = runner
		}
		var err error
		if cfg.KVEvents, err = enginesim.ParseKVEventsConfig(kvEventsJSON); err != nil {
			return err
		}
		if cfg.KVTransfer, err = enginesim.ParseKVTransferConfig(kvTransferJSON); err != nil {
			return err
		}
		if err := p2pEnv(&cfg); err != nil {
			return err
		}
		if fl.Changed("hash-seed") {
			cfg.HashSeed = hashSeed
		} else if v, ok := os.LookupEnv("PYTHONHASHSEED"); ok {
			cfg.HashSeed = v
		}
		cfg.EnableScaleOutEndpoints = os.Getenv("VLLM_ENABLE_SCALE_OUT_ENDPOINTS") == "1"
		if v, ok := os.LookupEnv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"); ok {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=%q: %w", v, err)
			}
			cfg.IntBlockHashes = b
		}
		cfg.LoRAModules = nil
		for _, m := range loraModules {
			lm, err := enginesim.ParseLoRAModule(m)
			if err != nil {
				return err
			}
			cfg.LoRAModules = append(cfg.LoRAModules, lm)
		}
		if cfg.Sim.EventLayout, err = kvevents.ParseLayout(eventLayout); err != nil {
			return err
		}
		if cfg.Sim.ReplayLayout, err = kvevents.ParseReplayLayout(replayLayout); err != nil {
			return err
		}
		return cfg.Validate()
	}
	cmd = &cobra.Command{
		Use:   "engine",
		Short: "Run a simulated vLLM engine that speaks vLLM's wire protocols",
		Long: `Run a stand-in for 'vllm serve' that speaks vLLM's wire protocols exactly:
the OpenAI-compatible HTTP API (chat, completions, Responses; streaming),
render and tokenize endpoints, /metrics with vLLM's names, a paged prefix
cache with vLLM's sha256_cbor block hashes, and KV-cache events over ZeroMQ
with replay. No GPU: a latency profile stands in for the model (--profile:
sim-default, or a profile calibrated from published figures; docs/profiles.md).

Flags are named as vLLM names them; simulator-only flags start with --sim-.
--runner pooling (older vLLM: --task embed) serves a pooling model instead
of a generative one: embeddings, pooling, classify, score and rerank.
Environment, as vLLM reads it: PYTHONHASHSEED (the hash seed; --hash-seed
overrides it), VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (serve /v1/responses/render),
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 (publish raw digests),
VLLM_P2P_SIDE_CHANNEL_HOST and VLLM_P2P_SIDE_CHANNEL_PORT (the P2P tier's
host and base port when its secondary_tiers entry sets none; default
localhost and 5710, rank r on port+r), VLLM_P2P_HANDSHAKE_TIMEOUT_S.

--kv-transfer-config takes vLLM's OffloadingConnector: a CPU tier
(CPUOffloadingSpec), or with TieringOffloadingSpec a CPU tier and the P2P
tier, which serves peers' lookups from the CPU tier and pulls the prefix a
request's kv_transfer_params.remote_kv_source names, e.g.
'{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":
{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":100000000000,
"secondary_tiers":[{"type":"p2p","host":"10.0.0.5","port":5710}]}}'.

Run-time fault switches: POST /sim/faults {"drop_events_pct":10,"delay_events_ms":5}
and POST /sim/restart.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := finish(cmd); err != nil {
				return usageError(err)
			}
			log, err := newLogger(logLevel)
			if err != nil {
				return usageError(err)
			}
			defer func() { _ = log.Sync() }()
			p, err := enginesim.Start(cfg, log)
			if err != nil {
				return err
			}
			stop := make(chan os.Signal, 1)
			signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(stop)
			for _, e := range p.Engines() {
				fmt.Fprintf(cmd.OutOrStdout(), "rank %d: http %s kv-events %q replay %q\n", e.Rank(), e.URL(), e.EventsEndpoint(), e.ReplayEndpoint())
			}
			<-stop
			log.Info("shutting down")
			p.Close()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Model, "model", cfg.Model, "model name or path (the simulator loads nothing)")
	f.StringVar(&cfg.Runner, "runner", cfg.Runner, "model runner: auto (generate, for the simulated model), generate, or pooling (an embedding model: /v1/embeddings, /pooling, /classify, /score, /rerank instead of chat, completions, Responses and render)")
	f.StringVar(&task, "task", "", "older vLLM's task: generate, or embed, embedding, classify, score or reward (--runner pooling)")
	f.StringSliceVar(&cfg.ServedModelNames, "served-model-name", nil, "names the model answers to (default: --model)")
	f.StringVar(&cfg.Host, "host", "", "host to listen on (default: every interface)")
	f.IntVar(&cfg.Port, "port", cfg.Port, "HTTP port; data-parallel rank r serves on port+r (0: ephemeral)")
	f.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block (default: the --profile's; sim-default's shown)")
	f.IntVar(&cfg.NumGPUBlocks, "num-gpu-blocks-override", cfg.NumGPUBlocks, "KV blocks per rank, including vLLM's null block (default: the --profile's capacity at --block-size; sim-default's shown)")
	f.IntVar(&numGPUBlocks, "num-gpu-blocks", cfg.NumGPUBlocks, "alias of --num-gpu-blocks-override")
	f.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "context length, prompt plus output (default: the --profile's; sim-default's shown)")
	f.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "sequences per scheduler step")
	f.StringVar(&cfg.SchedulingPolicy, "scheduling-policy", cfg.SchedulingPolicy, "fcfs (first come, first served) or priority (the body's priority field orders the waiting queue, lower first, ties by arrival, and the lowest-priority running request is preempted first when KV blocks run out; a non-zero priority under fcfs is refused with 400, as vLLM does)")
	f.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", cfg.MaxNumBatchedTokens, "tokens per scheduler step, chunked prefill beyond it (default: the --profile's; sim-default's shown)")
	f.StringVar(&cfg.HashAlgo, "prefix-caching-hash-algo", cfg.HashAlgo, "block hash algorithm; only sha256_cbor is simulated")
	f.StringVar(&hashSeed, "hash-seed", "", "NONE_HASH seed string (default: $PYTHONHASHSEED, else \"vllm-none-hash\")")
	f.StringVar(&kvTransferJSON, "kv-transfer-config", "", `KV connector config, the JSON vLLM takes; only the OffloadingConnector is simulated, e.g. '{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"cpu_bytes_to_use":100000000000}}' (default: none)`)
	f.StringVar(&kvEventsJSON, "kv-events-config", "", `KV events config, the JSON vLLM takes, e.g. '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv@pod@model"}'`)
	f.BoolVar(&cfg.EnablePromptTokensDetails, "enable-prompt-tokens-details", false, "report usage.prompt_tokens_details.cached_tokens")
	f.IntVarP(&cfg.DataParallelSize, "data-parallel-size", "d", 1, "data-parallel ranks; rank r uses HTTP port+r and event ports +r")
	f.BoolVar(&cfg.EnableLoRA, "enable-lora", false, "serve LoRA adapters")
	f.StringSliceVar(&loraModules, "lora-modules", nil, "LoRA adapters as name=path (repeat the flag or separate with commas)")
	f.StringVar(&eventLayout, "sim-event-layout", "map", "KV event encoding: map (vLLM ≥ 0.26) or array (older vLLM)")
	f.StringVar(&replayLayout, "sim-replay-layout", "topic", "replay reply layout: topic (current vLLM) or legacy")
	f.StringVar(&profileName, "profile", profile.SimDefault, "engine latency profile: "+strings.Join(profile.Names(), ", ")+
		" (prefill, decode and step costs; the defaults of --block-size, --num-gpu-blocks-override, --max-num-batched-tokens and --max-model-len; see docs/profiles.md)")
	f.Float64Var(&cfg.Sim.PrefillTokensPerSecond, "sim-prefill-tokens-per-s", 0, "override the profile's linear prefill term: uncached prompt tokens per simulated second (default: the profile's, 10000 for sim-default; its quadratic term stays)")
	f.DurationVar(&stepBase, "sim-step-base", cfg.Sim.Latency.StepBase, "override the profile's simulated cost of every scheduler step (sim-default's shown)")
	f.DurationVar(&stepPerSeq, "sim-step-per-seq", cfg.Sim.Latency.DecodePerSeq, "override the profile's simulated cost per decoding sequence in a step (sim-default's shown)")
	f.Float64Var(&cfg.Sim.TimeScale, "sim-time-scale", cfg.Sim.TimeScale, "wall time per simulated time: 1 real time, 0.01 100× faster, 0 never sleep")
	f.Float64Var(&cfg.Sim.DropEventsPercent, "sim-drop-events-pct", 0, "fault: percent of event batches not sent live (still replayable)")
	f.DurationVar(&cfg.Sim.EventDelay, "sim-delay-events", 0, "fault: hold every event batch back this long")
	f.Uint64Var(&cfg.Sim.Seed, "sim-seed", cfg.Sim.Seed, "seed for the fault switches' random choices")
	f.StringVar(&cfg.Sim.ChatTemplate, "sim-chat-template", "", "fault: chat template variant (alt: role headers end with a blank line), as a replica with another template")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	return cmd, &cfg, func() error { return finish(cmd) }
}

// applyProfile completes cfg from --profile: its latency model, and its
// sizes for the flags not given (the KV capacity is the profile's tokens
// at --block-size); then --sim-step-base and --sim-step-per-seq, when
// given, override the profile's terms (--sim-prefill-tokens-per-s is
// SimConfig's own override).
func applyProfile(changed func(flag string) bool, cfg *enginesim.Config, name string, numGPUBlocks int, stepBase, stepPerSeq time.Duration) error {
	lat, err := profile.Named(name)
	if err != nil {
		return fmt.Errorf("--profile: %w", err)
	}
	if !changed("block-size") {
		cfg.BlockSize = lat.BlockSize
	}
	switch {
	case changed("num-gpu-blocks"):
		cfg.NumGPUBlocks = numGPUBlocks
	case !changed("num-gpu-blocks-override"):
		cfg.NumGPUBlocks = lat.BlocksAt(cfg.BlockSize)
	}
	if !changed("max-num-batched-tokens") {
		cfg.MaxNumBatchedTokens = lat.MaxNumBatchedTokens
	}
	if !changed("max-model-len") {
		cfg.MaxModelLen = lat.MaxModelLen
	}
	if changed("sim-step-base") {
		lat.StepBase = stepBase
	}
	if changed("sim-step-per-seq") {
		lat.DecodePerSeq = stepPerSeq
	}
	cfg.Sim.Latency = lat
	return nil
}

// p2pEnv reads the P2P tier's environment, as vLLM's envs.py does:
// VLLM_P2P_SIDE_CHANNEL_HOST, VLLM_P2P_SIDE_CHANNEL_PORT and
// VLLM_P2P_HANDSHAKE_TIMEOUT_S (seconds).
func p2pEnv(cfg *enginesim.Config) error {
	if v, ok := os.LookupEnv("VLLM_P2P_SIDE_CHANNEL_HOST"); ok {
		cfg.P2PSideChannelHost = v
	}
	if v, ok := os.LookupEnv("VLLM_P2P_SIDE_CHANNEL_PORT"); ok {
		p, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("VLLM_P2P_SIDE_CHANNEL_PORT=%q: want a port", v)
		}
		cfg.P2PSideChannelPort = p
	}
	if v, ok := os.LookupEnv("VLLM_P2P_HANDSHAKE_TIMEOUT_S"); ok {
		s, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || !(s > 0) || s > 3600 {
			return fmt.Errorf("VLLM_P2P_HANDSHAKE_TIMEOUT_S=%q: want seconds, more than 0", v)
		}
		cfg.P2PHandshakeTimeout = time.Duration(s * float64(time.Second))
	}
	return nil
}

// runnerOfTask maps older vLLM's --task to the runner it selects.
func runnerOfTask(task string) (string, error) {
	switch task {
	case "auto":
		return enginesim.RunnerAuto, nil
	case "generate":
		return enginesim.RunnerGenerate, nil
	case "embed", "embedding", "classify", "score", "reward":
		return enginesim.RunnerPooling, nil
	}
	return "", fmt.Errorf("--task %q: want auto, generate, embed, embedding, classify, score or reward", task)
}
