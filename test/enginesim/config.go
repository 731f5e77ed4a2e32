package enginesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim/chat"
	"github.com/kvroute/kvroute/test/enginesim/p2p"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// KVEventsConfig is vLLM's --kv-events-config, field for field.
type KVEventsConfig struct {
	EnableKVCacheEvents bool    `json:"enable_kv_cache_events"`
	Publisher           *string `json:"publisher"`       // "zmq" or "null"; nil → zmq when enabled
	Endpoint            string  `json:"endpoint"`        // PUB address, default tcp://*:5557
	ReplayEndpoint      *string `json:"replay_endpoint"` // ROUTER address; nil disables replay
	BufferSteps         int     `json:"buffer_steps"`    // replay ring, in batches
	HWM                 int     `json:"hwm"`             // PUB high-water mark, in messages
	MaxQueueSize        int     `json:"max_queue_size"`  // accepted for compatibility
	Topic               string  `json:"topic"`
}

// ParseKVEventsConfig parses the JSON vLLM takes, applying vLLM's defaults.
// Unknown fields are an error, as vLLM's config dataclass rejects them.
func ParseKVEventsConfig(s string) (KVEventsConfig, error) {
	c := DefaultKVEventsConfig()
	if strings.TrimSpace(s) == "" {
		return c, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("--kv-events-config: %w", err)
	}
	return c, c.Validate()
}

// DefaultKVEventsConfig returns vLLM's defaults (events disabled).
func DefaultKVEventsConfig() KVEventsConfig {
	return KVEventsConfig{Endpoint: "tcp://*:5557", BufferSteps: 10_000, HWM: 100_000, MaxQueueSize: 100_000}
}

// Enabled reports whether events are published over ZMQ.
func (c KVEventsConfig) Enabled() bool {
	if !c.EnableKVCacheEvents {
		return false
	}
	return c.Publisher == nil || *c.Publisher == "zmq"
}

// Validate checks c.
func (c KVEventsConfig) Validate() error {
	if c.Publisher != nil && *c.Publisher != "zmq" && *c.Publisher != "null" {
		return fmt.Errorf("--kv-events-config: publisher %q: want zmq or null", *c.Publisher)
	}
	if c.Enabled() && c.Endpoint == "" {
		return errors.New("--kv-events-config: endpoint is empty")
	}
	if c.BufferSteps < 1 || c.HWM < 0 {
		return fmt.Errorf("--kv-events-config: buffer_steps %d, hwm %d", c.BufferSteps, c.HWM)
	}
	return nil
}

// pubBinds is vLLM's heuristic (ZmqEventPublisher._socket_setup): the PUB
// binds when the endpoint has a wildcard host or is ipc/inproc, and
// connects otherwise.
func pubBinds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// offsetEndpointPort is vLLM's offset_endpoint_port: rank r of a tcp
// endpoint uses port+r, of an inproc endpoint the name suffixed _dp<r>. An
// ephemeral port ("*") stays ephemeral for every rank.
func offsetEndpointPort(endpoint string, rank int) (string, error) {
	if rank == 0 {
		return endpoint, nil
	}
	if strings.HasPrefix(endpoint, "inproc://") {
		return fmt.Sprintf("%s_dp%d", endpoint, rank), nil
	}
	if !strings.HasPrefix(endpoint, "tcp://") {
		return "", fmt.Errorf("endpoint %q: data-parallel ranks need a tcp:// or inproc:// endpoint", endpoint)
	}
	i := strings.LastIndex(endpoint, ":")
	if endpoint[i+1:] == "*" {
		return endpoint, nil
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil {
		return "", fmt.Errorf("endpoint %q: bad port", endpoint)
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}

// LoRAModule is one --lora-modules name=path entry.
type LoRAModule struct {
	Name string
	Path string
}

// ParseLoRAModule parses name=path (vLLM also takes JSON; name=path is the
// common form).
func ParseLoRAModule(s string) (LoRAModule, error) {
	if strings.HasPrefix(strings.TrimSpace(s), "{") {
		var m struct {
			Name string `json:"name"`
			Path string `json:"path"`
		}
		if err := json.Unmarshal([]byte(s), &m); err != nil || m.Name == "" {
			return LoRAModule{}, fmt.Errorf("--lora-modules %q: want name=path or {\"name\":…,\"path\":…}", s)
		}
		return LoRAModule{m.Name, m.Path}, nil
	}
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return LoRAModule{}, fmt.Errorf("--lora-modules %q: want name=path", s)
	}
	return LoRAModule{name, path}, nil
}

// SimConfig holds the simulator-only settings (--sim-* flags).
type SimConfig struct {
	// EventLayout is the event encoding: map (vLLM ≥ 0.26) or array (older).
	EventLayout kvevents.Layout
	// ReplayLayout is the replay reply shape: with topic (current) or legacy.
	ReplayLayout kvevents.ReplayLayout
	// Latency is the latency profile (--profile, package profile): a
	// step's base, its prefill chunks' and decodes' costs. The default is
	// sim-default (25 ms a step, 0.1 ms per decoding sequence, prefill at
	// 10,000 tok/s: ≈ 30 ms steps at 50 sequences). The engine's sizes are
	// the fields of Config; `kvroute engine --profile` takes the
	// profile's as their defaults.
	Latency profile.Profile
	// PrefillTokensPerSecond, when positive, replaces the profile's linear
	// prefill term 1/b (--sim-prefill-tokens-per-s); its quadratic term
	// stays. 0 keeps the profile's.
	PrefillTokensPerSecond float64
	// TimeScale multiplies every simulated duration before sleeping: 1 is
	// real time, 0.01 runs 100× faster, 0 never sleeps. Reported latencies
	// stay in simulated time.
	TimeScale float64
	// DropEventsPercent of event batches are not published live (they stay
	// in the replay ring, and their seq numbers are used up).
	DropEventsPercent float64
	// EventDelay holds every event batch back this long (wall time).
	EventDelay time.Duration
	// Seed seeds the fault switches' random choices.
	Seed uint64
	// ChatTemplate is the chat template variant: "" the documented one,
	// chat.TemplateAlt another (role headers end with a blank line), to
	// test that a replica with another template is caught.
	ChatTemplate string
}

// Profile is the latency profile the engine runs: Latency, with the
// PrefillTokensPerSecond override applied.
func (s SimConfig) Profile() profile.Profile {
	p := s.Latency
	if s.PrefillTokensPerSecond > 0 {
		p.PrefillTokensPerSecond = s.PrefillTokensPerSecond
	}
	return p
}

// The runners (--runner), as vLLM names them: auto resolves to generate
// for the simulated model, pooling serves the pooling endpoints instead of
// the generative ones.
const (
	RunnerAuto     = "auto"
	RunnerGenerate = "generate"
	RunnerPooling  = "pooling"
)

// Config configures a simulated engine process; fields are named after
// vLLM's flags.
type Config struct {
	Model               string   // --model
	Runner              string   // --runner: auto (generate, for the simulated model), generate or pooling
	ServedModelNames    []string // --served-model-name; default [Model]
	Host                string   // --host; "" listens on every interface
	Port                int      // --port; rank r serves on Port+r (0: ephemeral)
	BlockSize           int      // --block-size
	NumGPUBlocks        int      // --num-gpu-blocks-override
	MaxModelLen         int      // --max-model-len
	MaxNumSeqs          int      // --max-num-seqs
	MaxNumBatchedTokens int      // --max-num-batched-tokens
	// SchedulingPolicy is --scheduling-policy: fcfs (vLLM's default; ""
	// is the same) or
	// priority (the body's priority orders the waiting queue and chooses
	// whom to preempt; package sched).
	SchedulingPolicy string
	HashAlgo         string // --prefix-caching-hash-algo
	// HashSeed is the NONE_HASH seed: PYTHONHASHSEED when set, else
	// --hash-seed, else vLLM's default "vllm-none-hash".
	HashSeed                  string
	KVEvents                  KVEventsConfig // --kv-events-config
	EnablePromptTokensDetails bool           // --enable-prompt-tokens-details
	DataParallelSize          int            // --data-parallel-size
	EnableLoRA                bool           // --enable-lora
	LoRAModules               []LoRAModule   // --lora-modules
	// EnableScaleOutEndpoints registers /v1/responses/render, as
	// VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 does.
	EnableScaleOutEndpoints bool
	// IntBlockHashes publishes 64-bit hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES,
	// default true); false publishes raw digests.
	IntBlockHashes bool
	// KVTransfer is --kv-transfer-config: the OffloadingConnector (a CPU
	// tier, and optionally the P2P tier), or none (the default).
	KVTransfer KVTransferConfig
	// P2PSideChannelHost and P2PSideChannelPort are the P2P tier's host
	// (the bind address and the identity peers dial, verbatim) and base
	// port when its secondary_tiers entry sets none:
	// VLLM_P2P_SIDE_CHANNEL_HOST (default localhost) and
	// VLLM_P2P_SIDE_CHANNEL_PORT (default 5710). Rank r listens on the
	// base port + r (vLLM: + the global data-parallel index).
	P2PSideChannelHost string
	P2PSideChannelPort int
	// P2PHandshakeTimeout is VLLM_P2P_HANDSHAKE_TIMEOUT_S: a side-channel
	// connection not ready within it is dead.
	P2PHandshakeTimeout time.Duration
	Sim                 SimConfig

	// EventSink, when set, receives every KV-event batch the engine
	// publishes, in order, one per scheduler step that made events (and
	// one per successful prefix-cache reset), on the scheduler goroutine,
	// after the batch went to ZMQ and before the step's answers go out. It
	// should return quickly: the engine's next step waits for it. The
	// batch is the sink's to keep (the engine does not reuse its slices).
	// It gets the batches in addition to ZMQ when KV events are enabled,
	// and instead of ZMQ otherwise (the cache makes events whenever there
	// is a sink). The event fault switches (drop, delay) belong to the ZMQ
	// transport and do not apply to it; a Restart wipes the cache without
	// events, as a real restart does. With DataParallelSize > 1 every rank
	// calls it from its own goroutine (each batch carries its rank), so it
	// must be safe for concurrent use. It lets tests and labs feed an
	// in-process fleet without sockets.
	EventSink func(kvevents.Batch)
}

// DefaultConfig returns defaults resembling one H100 serving an 8B–20B
// model with vLLM's own defaults: the sim-default profile and its sizes.
func DefaultConfig() Config {
	lat := profile.Default()
	return Config{
		Model:               "Qwen/Qwen3-0.6B",
		Runner:              RunnerAuto,
		Port:                8000,
		BlockSize:           lat.BlockSize,
		NumGPUBlocks:        lat.NumGPUBlocks,
		MaxModelLen:         lat.MaxModelLen,
		MaxNumSeqs:          256,
		SchedulingPolicy:    sched.PolicyFCFS,
		MaxNumBatchedTokens: lat.MaxNumBatchedTokens,
		HashAlgo:            blockkey.HashAlgoSHA256CBOR,
		HashSeed:            blockkey.DefaultSeed,
		KVEvents:            DefaultKVEventsConfig(),
		DataParallelSize:    1,
		IntBlockHashes:      true,
		P2PSideChannelHost:  p2p.DefaultHost,
		P2PSideChannelPort:  p2p.DefaultPort,
		P2PHandshakeTimeout: p2p.DefaultConfig().HandshakeTimeout,
		Sim: SimConfig{
			Latency:   lat,
			TimeScale: 1,
			Seed:      1,
		},
	}
}

// Validate checks c, with messages naming the flag.
func (c *Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Model != "", "--model is empty")
	check(c.Runner == RunnerAuto || c.Runner == RunnerGenerate || c.Runner == RunnerPooling,
		"--runner %q: want auto, generate or pooling (the simulated engine runs no draft model)", c.Runner)
	check(c.Port >= 0 && c.Port+c.DataParallelSize <= 65536, "--port %d out of range", c.Port)
	check(c.BlockSize > 0 && c.BlockSize <= 1024, "--block-size %d: want 1..1024", c.BlockSize)
	check(c.NumGPUBlocks >= 2, "--num-gpu-blocks %d: want at least 2", c.NumGPUBlocks)
	check(c.MaxModelLen > 0, "--max-model-len %d must be positive", c.MaxModelLen)
	check(c.MaxNumSeqs > 0, "--max-num-seqs %d must be positive", c.MaxNumSeqs)
	check(c.MaxNumBatchedTokens > 0, "--max-num-batched-tokens %d must be positive", c.MaxNumBatchedTokens)
	check(c.SchedulingPolicy == "" || c.SchedulingPolicy == sched.PolicyFCFS || c.SchedulingPolicy == sched.PolicyPriority,
		"--scheduling-policy %q: want fcfs or priority", c.SchedulingPolicy)
	check(c.HashAlgo == blockkey.HashAlgoSHA256CBOR,
		"--prefix-caching-hash-algo %q is not supported by the simulated engine (only sha256_cbor: the pickle-based sha256 and the xxhash variants are not implemented)", c.HashAlgo)
	check(c.DataParallelSize >= 1, "--data-parallel-size %d must be at least 1", c.DataParallelSize)
	check(len(c.LoRAModules) == 0 || c.EnableLoRA, "--lora-modules needs --enable-lora")
	check(c.Sim.PrefillTokensPerSecond >= 0, "--sim-prefill-tokens-per-s %v: want a positive rate (0: the profile's)", c.Sim.PrefillTokensPerSecond)
	if err := c.Sim.Profile().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--profile (with --sim-prefill-tokens-per-s, --sim-step-base, --sim-step-per-seq): %w", err))
	}
	check(c.Sim.TimeScale >= 0, "--sim-time-scale %v must not be negative", c.Sim.TimeScale)
	check(c.Sim.ChatTemplate == "" || c.Sim.ChatTemplate == chat.TemplateAlt, "--sim-chat-template %q: want empty (the default) or %s", c.Sim.ChatTemplate, chat.TemplateAlt)
	check(c.Sim.DropEventsPercent >= 0 && c.Sim.DropEventsPercent <= 100, "--sim-drop-events-pct %v: want 0..100", c.Sim.DropEventsPercent)
	check(c.Sim.EventDelay >= 0 && c.Sim.EventDelay <= maxEventDelay, "--sim-delay-events %v: want 0..%v", c.Sim.EventDelay, maxEventDelay)
	seen := map[string]bool{}
	for _, n := range c.modelNames() {
		check(!seen[n], "model name %q is served twice", n)
		seen[n] = true
	}
	if err := c.KVEvents.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateKVTransfer()...)
	if c.KVEvents.Enabled() && c.DataParallelSize > 1 {
		if _, err := offsetEndpointPort(c.KVEvents.Endpoint, 1); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// checkPriority refuses a non-zero priority unless the engine schedules
// by priority, with vLLM's message (its input processor's ValueError, a
// 400).
func (c *Config) checkPriority(p int) error {
	if p != 0 && c.SchedulingPolicy != sched.PolicyPriority {
		return badRequest("Got priority %d but Priority scheduling is not enabled.", p)
	}
	return nil
}

// pooling reports whether the engine runs as a pooling model.
func (c *Config) pooling() bool { return c.Runner == RunnerPooling }

// servedNames returns the names the base model answers to.
func (c *Config) servedNames() []string {
	if len(c.ServedModelNames) > 0 {
		return c.ServedModelNames
	}
	return []string{c.Model}
}

// modelNames returns every name requests may use: served names and LoRA
// adapters.
func (c *Config) modelNames() []string {
	names := append([]string(nil), c.servedNames()...)
	for _, m := range c.LoRAModules {
		names = append(names, m.Name)
	}
	return names
}
