package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/test/enginesim/p2p"
)

// The connector and the offloading specs the simulated engine models.
const (
	OffloadingConnector   = "OffloadingConnector"
	CPUOffloadingSpec     = "CPUOffloadingSpec"
	TieringOffloadingSpec = "TieringOffloadingSpec"
)

// KVTransferConfig is vLLM's --kv-transfer-config as far as the simulated
// engine models it: the OffloadingConnector, with a CPU tier and
// optionally the P2P tier. The zero value is no connector.
type KVTransferConfig struct {
	// Connector is kv_connector: "" (none) or OffloadingConnector.
	Connector string
	// Role is kv_role (kv_producer, kv_consumer or kv_both).
	Role string
	// Offload is the connector's kv_connector_extra_config.
	Offload OffloadConfig
	// Warnings are what vLLM would accept and the simulation ignores; the
	// engine logs them at start.
	Warnings []string
}

// OffloadConfig is the OffloadingConnector's kv_connector_extra_config.
type OffloadConfig struct {
	// SpecName is CPUOffloadingSpec (the CPU tier alone) or
	// TieringOffloadingSpec (the CPU tier and secondary tiers).
	SpecName string
	// CPUBytes is cpu_bytes_to_use: the CPU tier's bytes, for the whole
	// engine (vLLM: total across workers).
	CPUBytes int64
	// BlockSize is block_size, the offload block in tokens (a multiple of
	// the GPU block); BlocksPerChunk is blocks_per_chunk, the same in GPU
	// blocks. At most one is set; neither means one GPU block.
	BlockSize, BlocksPerChunk int
	// EvictionPolicy is eviction_policy; only lru is modelled.
	EvictionPolicy string
	// PromptOnly is offload_prompt_only: only prompt blocks go to the CPU
	// tier (default true).
	PromptOnly bool
	// SelfDescribing is self_describing_kv_events: CPU-tier events carry
	// tokens instead of placeholders.
	SelfDescribing bool
	// StoreThreshold is store_threshold (0 or 1: a block is offloaded at
	// once; more is not modelled).
	StoreThreshold int
	// P2P is the secondary tier {"type":"p2p"}; nil when there is none.
	P2P *P2PTierConfig
}

// P2PTierConfig is a secondary tier {"type":"p2p", …}.
type P2PTierConfig struct {
	// Host and Port, when set, override VLLM_P2P_SIDE_CHANNEL_HOST and
	// VLLM_P2P_SIDE_CHANNEL_PORT (Config's P2PSideChannelHost and
	// P2PSideChannelPort); "" and 0 when not set.
	Host string
	Port int
}

// Enabled reports whether a KV connector is configured.
func (k KVTransferConfig) Enabled() bool { return k.Connector != "" }

// P2PEnabled reports whether the P2P tier is configured.
func (k KVTransferConfig) P2PEnabled() bool { return k.Enabled() && k.Offload.P2P != nil }

// OffloadBlockTokens is the offload block in tokens, given the GPU block.
func (k KVTransferConfig) OffloadBlockTokens(gpuBlock int) int {
	switch {
	case k.Offload.BlockSize > 0:
		return k.Offload.BlockSize
	case k.Offload.BlocksPerChunk > 0:
		return k.Offload.BlocksPerChunk * gpuBlock
	}
	return gpuBlock
}

// kvTransferJSON is vLLM's KVTransferConfig, field for field: the fields
// the simulation does not use are accepted (and ignored), unknown ones are
// an error, as vLLM's config dataclass rejects them.
type kvTransferJSON struct {
	KVConnector           *string                    `json:"kv_connector"`
	EngineID              *string                    `json:"engine_id"`
	KVBufferDevice        *string                    `json:"kv_buffer_device"`
	KVBufferSize          *float64                   `json:"kv_buffer_size"`
	KVRole                *string                    `json:"kv_role"`
	KVRank                *int                       `json:"kv_rank"`
	KVParallelSize        *int                       `json:"kv_parallel_size"`
	KVIP                  *string                    `json:"kv_ip"`
	KVPort                *int                       `json:"kv_port"`
	KVConnectorExtra      map[string]json.RawMessage `json:"kv_connector_extra_config"`
	KVConnectorModulePath *string                    `json:"kv_connector_module_path"`
	EnablePermuteLocalKV  *bool                      `json:"enable_permute_local_kv"`
	KVLoadFailurePolicy   *string                    `json:"kv_load_failure_policy"`
}

var kvRoles = []string{"kv_producer", "kv_consumer", "kv_both"}

// ParseKVTransferConfig parses the JSON vLLM's --kv-transfer-config takes.
// "" (or "null") is no connector. The GPU block size is checked against
// block_size by Config.Validate.
func ParseKVTransferConfig(s string) (KVTransferConfig, error) {
	var k KVTransferConfig
	if t := strings.TrimSpace(s); t == "" || t == "null" {
		return k, nil
	}
	var raw kvTransferJSON
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return k, fmt.Errorf("--kv-transfer-config: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return k, errors.New("--kv-transfer-config: trailing data after the JSON object (want exactly one object)")
	}
	if raw.KVConnector == nil {
		if raw.KVConnectorExtra != nil {
			k.Warnings = append(k.Warnings, "--kv-transfer-config: kv_connector_extra_config without kv_connector: no connector")
		}
		return k, nil
	}
	if raw.KVRole == nil {
		return k, fmt.Errorf("--kv-transfer-config: kv_role is required with kv_connector (one of %s)", strings.Join(kvRoles, ", "))
	}
	if !slices.Contains(kvRoles, *raw.KVRole) {
		return k, fmt.Errorf("--kv-transfer-config: kv_role %q: want one of %s", *raw.KVRole, strings.Join(kvRoles, ", "))
	}
	if p := raw.KVLoadFailurePolicy; p != nil && *p != "recompute" && *p != "fail" {
		return k, fmt.Errorf("--kv-transfer-config: kv_load_failure_policy %q: want recompute or fail", *p)
	} else if p != nil && *p == "fail" {
		k.Warnings = append(k.Warnings, "--kv-transfer-config: kv_load_failure_policy fail is not simulated: a failed load recomputes")
	}
	if *raw.KVConnector != OffloadingConnector {
		return k, fmt.Errorf("--kv-transfer-config: kv_connector %q is not simulated (only %s)", *raw.KVConnector, OffloadingConnector)
	}
	k.Connector, k.Role = *raw.KVConnector, *raw.KVRole
	if k.Role != "kv_both" {
		k.Warnings = append(k.Warnings, fmt.Sprintf("--kv-transfer-config: kv_role %s: the simulated %s offloads and loads (kv_both) whatever the role", k.Role, OffloadingConnector))
	}
	off, warns, err := parseOffload(raw.KVConnectorExtra)
	if err != nil {
		return KVTransferConfig{}, fmt.Errorf("--kv-transfer-config: kv_connector_extra_config: %w", err)
	}
	k.Offload = off
	k.Warnings = append(k.Warnings, warns...)
	return k, nil
}

// offloadKeys are the extra-config keys the simulated connector reads.
var offloadKeys = []string{"spec_name", "cpu_bytes_to_use", "block_size", "blocks_per_chunk", "eviction_policy",
	"offload_prompt_only", "self_describing_kv_events", "store_threshold", "max_tracker_size", "secondary_tiers"}

// parseOffload reads the OffloadingConnector's extra config. Unknown keys
// are warnings: vLLM reads the keys it knows and ignores the rest.
func parseOffload(extra map[string]json.RawMessage) (OffloadConfig, []string, error) {
	o := OffloadConfig{SpecName: CPUOffloadingSpec, EvictionPolicy: "lru", PromptOnly: true}
	var warns []string
	for key := range extra {
		if !slices.Contains(offloadKeys, key) {
			warns = append(warns, fmt.Sprintf("kv_connector_extra_config: %q is not read by the simulated %s; ignored", key, OffloadingConnector))
		}
	}
	slices.Sort(warns)
	get := func(key string) (json.RawMessage, bool) {
		v, ok := extra[key]
		return v, ok && !bytes.Equal(bytes.TrimSpace(v), []byte("null"))
	}
	steps := []func() error{
		func() error { return parseSpecName(&o, get) },
		func() error { return parseCPUBytes(&o, get) },
		func() error { return parseBlockSize(&o, get) },
		func() error { return parseEviction(&o, get) },
		func() error { return parseFlags(&o, get) },
		func() error { w, err := parseTiers(&o, get); warns = append(warns, w...); return err },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return OffloadConfig{}, nil, err
		}
	}
	return o, warns, nil
}

type getter func(key string) (json.RawMessage, bool)

func parseSpecName(o *OffloadConfig, get getter) error {
	v, ok := get("spec_name")
	if !ok {
		return nil
	}
	if err := json.Unmarshal(v, &o.SpecName); err != nil {
		return fmt.Errorf("spec_name: want a string")
	}
	if o.SpecName != CPUOffloadingSpec && o.SpecName != TieringOffloadingSpec {
		return fmt.Errorf("spec_name %q is not simulated (only %s and %s)", o.SpecName, CPUOffloadingSpec, TieringOffloadingSpec)
	}
	return nil
}

func parseCPUBytes(o *OffloadConfig, get getter) error {
	v, ok := get("cpu_bytes_to_use")
	if !ok {
		return errors.New("cpu_bytes_to_use is required (the CPU tier's bytes, total across workers; older vLLM's num_cpu_blocks is not taken)")
	}
	n, err := wholeNumber(v, 1<<62)
	if err != nil || n <= 0 {
		return fmt.Errorf("cpu_bytes_to_use %s: want a positive number of bytes", v)
	}
	o.CPUBytes = n
	return nil
}

func parseBlockSize(o *OffloadConfig, get getter) error {
	bs, hasBS := get("block_size")
	bpc, hasBPC := get("blocks_per_chunk")
	if hasBS && hasBPC {
		return errors.New("specify only one of 'block_size' or 'blocks_per_chunk'")
	}
	if hasBS {
		n, err := wholeNumber(bs, 1<<20)
		if err != nil || n <= 0 {
			return fmt.Errorf("block_size %s: want a positive number of tokens", bs)
		}
		o.BlockSize = int(n)
	}
	if hasBPC {
		n, err := wholeNumber(bpc, 1<<20)
		if err != nil || n <= 0 {
			return fmt.Errorf("'blocks_per_chunk' must be greater than 0 (got %s)", bpc)
		}
		o.BlocksPerChunk = int(n)
	}
	return nil
}

func parseEviction(o *OffloadConfig, get getter) error {
	v, ok := get("eviction_policy")
	if !ok {
		return nil
	}
	if err := json.Unmarshal(v, &o.EvictionPolicy); err != nil {
		return errors.New("eviction_policy: want a string")
	}
	switch o.EvictionPolicy {
	case "lru":
		return nil
	case "arc":
		return errors.New("eviction_policy arc is not modelled by the simulated engine (only lru)")
	}
	return fmt.Errorf("eviction_policy %q: want lru (vLLM also has arc, not modelled)", o.EvictionPolicy)
}

func parseFlags(o *OffloadConfig, get getter) error {
	for _, f := range []struct {
		key string
		dst *bool
	}{{"offload_prompt_only", &o.PromptOnly}, {"self_describing_kv_events", &o.SelfDescribing}} {
		if v, ok := get(f.key); ok {
			if err := json.Unmarshal(v, f.dst); err != nil {
				return fmt.Errorf("%s %s: want true or false", f.key, v)
			}
		}
	}
	if v, ok := get("store_threshold"); ok {
		n, err := wholeNumber(v, 1<<31)
		if err != nil || n < 0 {
			return fmt.Errorf("store_threshold %s: want a non-negative integer", v)
		}
		if n >= 2 {
			return fmt.Errorf("store_threshold %d is not modelled (a block is offloaded on its first store; the tiering spec rejects 2 or more)", n)
		}
		o.StoreThreshold = int(n)
	}
	if v, ok := get("max_tracker_size"); ok {
		if n, err := wholeNumber(v, 1<<40); err != nil || n <= 0 {
			return fmt.Errorf("max_tracker_size %s: want a positive integer", v)
		}
	}
	return nil
}

// p2pTierKeys are the keys of a {"type":"p2p"} tier; only host and port
// matter to the simulation.
var p2pTierKeys = []string{"type", "host", "port", "backends", "num_threads", "unbound_store_timeout_s"}

func parseTiers(o *OffloadConfig, get getter) ([]string, error) {
	v, ok := get("secondary_tiers")
	if !ok {
		return nil, nil
	}
	var tiers []map[string]json.RawMessage
	if err := json.Unmarshal(v, &tiers); err != nil {
		return nil, errors.New("secondary_tiers: want a list of objects")
	}
	if o.SpecName != TieringOffloadingSpec {
		return []string{fmt.Sprintf("kv_connector_extra_config: secondary_tiers needs spec_name %s; ignored, as %s ignores it", TieringOffloadingSpec, o.SpecName)}, nil
	}
	var warns []string
	for i, t := range tiers {
		var typ string
		if err := json.Unmarshal(t["type"], &typ); err != nil || typ == "" {
			return nil, fmt.Errorf("secondary_tiers[%d]: type is required", i)
		}
		if typ != "p2p" {
			return nil, fmt.Errorf("secondary_tiers[%d]: type %q is not simulated (only p2p; fs and obj are not modelled)", i, typ)
		}
		if o.P2P != nil {
			return nil, fmt.Errorf("secondary_tiers[%d]: a second p2p tier", i)
		}
		tier, w, err := parseP2PTier(t)
		if err != nil {
			return nil, fmt.Errorf("secondary_tiers[%d]: %w", i, err)
		}
		o.P2P = &tier
		warns = append(warns, w...)
	}
	return warns, nil
}

func parseP2PTier(t map[string]json.RawMessage) (P2PTierConfig, []string, error) {
	var tier P2PTierConfig
	var warns []string
	for key := range t {
		if !slices.Contains(p2pTierKeys, key) {
			warns = append(warns, fmt.Sprintf("secondary_tiers p2p: %q is not read; ignored", key))
		}
	}
	slices.Sort(warns)
	if v, ok := t["host"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &tier.Host); err != nil || tier.Host == "" || len(tier.Host) > 253 {
			return tier, nil, fmt.Errorf("host %s: want a host name or address", v)
		}
	}
	if v, ok := t["port"]; ok && string(v) != "null" {
		n, err := wholeNumber(v, 65535)
		if err != nil || n < 1 {
			return tier, nil, fmt.Errorf("port %s: want 1..65535", v)
		}
		tier.Port = int(n)
	}
	return tier, warns, nil
}

// wholeNumber reads a JSON number (or a string of one, as Python's int()
// takes it) that is a whole number in 0..max or negative; floats such as
// 960e9 are taken when whole.
func wholeNumber(v json.RawMessage, max int64) (int64, error) {
	var s string
	if json.Unmarshal(v, &s) == nil {
		v = json.RawMessage(strings.TrimSpace(s))
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || math.IsNaN(f) || f != math.Trunc(f) || f > float64(max) || f < -float64(max) {
		return 0, fmt.Errorf("%s is not a whole number up to %d", v, max)
	}
	return int64(f), nil
}

// p2pFingerprint is what this engine's peers must share with it.
func (c *Config) p2pFingerprint() p2p.Fingerprint {
	return p2p.Fingerprint{BlockSize: c.KVTransfer.OffloadBlockTokens(c.BlockSize), HashSeed: c.HashSeed,
		HashAlgo: c.HashAlgo, Model: c.Model}
}

// p2pHost and p2pBasePort are the P2P tier's side channel: the tier's own
// host and port when set, else the environment's (or vLLM's defaults).
func (c *Config) p2pHost() string {
	if h := c.KVTransfer.Offload.P2P.Host; h != "" {
		return h
	}
	return c.P2PSideChannelHost
}

func (c *Config) p2pBasePort() int {
	if p := c.KVTransfer.Offload.P2P.Port; p != 0 {
		return p
	}
	return c.P2PSideChannelPort
}

// validateKVTransfer checks the connector against the engine's other
// settings.
func (c *Config) validateKVTransfer() []error {
	k := c.KVTransfer
	if !k.Enabled() {
		return nil
	}
	var errs []error
	if bs := k.Offload.BlockSize; bs > 0 && bs%c.BlockSize != 0 {
		errs = append(errs, fmt.Errorf("--kv-transfer-config: block_size %d must be a multiple of the GPU block (--block-size %d)", bs, c.BlockSize))
	}
	if c.pooling() {
		errs = append(errs, errors.New("--kv-transfer-config: the simulated OffloadingConnector serves generative models only (--runner pooling)"))
	}
	if k.P2PEnabled() {
		if c.p2pHost() == "" {
			errs = append(errs, errors.New("the P2P tier's host is empty (secondary_tiers host, VLLM_P2P_SIDE_CHANNEL_HOST)"))
		}
		if p := c.p2pBasePort(); p < 0 || p+c.DataParallelSize-1 > 65535 || (p == 0 && c.DataParallelSize > 1) {
			errs = append(errs, fmt.Errorf("the P2P tier's port %d: rank r listens on port+r, up to 65535 (0, ephemeral, only with one rank)", p))
		}
		if c.P2PHandshakeTimeout <= 0 {
			errs = append(errs, fmt.Errorf("VLLM_P2P_HANDSHAKE_TIMEOUT_S %v must be positive", c.P2PHandshakeTimeout))
		}
	}
	return errs
}
