package profile

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Profile is an engine latency profile: the cost of a scheduler step and
// the engine sizes the costs hold at.
type Profile struct {
	// Name is the profile's name, as --profile takes it.
	Name string
	// Sources are the published rows the constants come from
	// (docs/engine-profiles.md sections and their sources).
	Sources []string
	// Uncalibrated says, one item each, what no published figure fixes
	// (the constant is then an assumption, stated); reports print it.
	Uncalibrated []string

	// StepBase is a: the fixed cost of every step that computes anything.
	StepBase time.Duration
	// PrefillTokensPerSecond is 1/b: the linear prefill term, in prompt
	// tokens per second.
	PrefillTokensPerSecond float64
	// PrefillQuadratic is c, in seconds per token²: a request of t
	// tokens pays c·t² on top of b·t (attention over its context).
	PrefillQuadratic float64
	// DecodePerSeq is the cost per decoding sequence in a step.
	DecodePerSeq time.Duration
	// DecodePerKVToken is the cost per context token of the decoding
	// sequences in a step (their KV read), in seconds.
	DecodePerKVToken float64

	// MaxNumBatchedTokens is the chunk budget the prefill costs were
	// measured at (--max-num-batched-tokens).
	MaxNumBatchedTokens int
	// BlockSize and NumGPUBlocks are the KV capacity: num_gpu_blocks at
	// BlockSize tokens a block.
	BlockSize, NumGPUBlocks int
	// MaxModelLen is the context length (--max-model-len).
	MaxModelLen int

	// KVBytesPerToken is the KV cache's size per token, in bytes (every
	// layer's K and V as the deployment stores them): what a CPU-tier copy
	// or a pull moves per token (engine-profiles.md §4).
	KVBytesPerToken float64
	// H2DBytesPerSecond is the effective host-to-device copy bandwidth: a
	// CPU-tier hit loads back at it (engine-profiles.md §6).
	H2DBytesPerSecond float64
	// PullSetup is the fixed cost of one pull from a peer's CPU tier
	// between a warmed pair (engine-profiles.md §5: the fit's intercept).
	PullSetup time.Duration
	// PullBytesPerSecond is the link's effective bandwidth for a pull
	// alone on it (the fit's slope, in bytes); concurrent pulls share it.
	PullBytesPerSecond float64
	// PullConnect is the extra cost of the first pull between a pair (the
	// connection's setup); warmed pairs do not pay it.
	PullConnect time.Duration
	// CPUBytes is the CPU tier (cpu_bytes_to_use) of the published
	// deployment, 0 when none is published: a shell may take it as its
	// default tier size (CPUBlocks converts it).
	CPUBytes int64
}

// Chunk is one request's prefill in a step: Tokens new tokens at context
// offset Offset (the tokens computed or cached before them).
type Chunk struct {
	Offset, Tokens int
}

// linear is b·n in nanoseconds, as the engine has always computed it
// (tokens / throughput · 1 s; the conversion keeps it from being fused).
func (p Profile) linear(n int) float64 {
	return float64(float64(n) / p.PrefillTokensPerSecond * float64(time.Second))
}

// quadratic is 2c·n·(s + n/2) in nanoseconds.
func (p Profile) quadratic(c Chunk) float64 {
	if p.PrefillQuadratic == 0 {
		return 0
	}
	n := float64(c.Tokens)
	return 2 * p.PrefillQuadratic * n * (float64(c.Offset) + n/2) * float64(time.Second)
}

// ChunkCost is the prefill cost of n new tokens at context offset offset,
// b·n + 2c·n·(offset + n/2), without the step's base; 0 for n ≤ 0.
func (p Profile) ChunkCost(offset, n int) time.Duration {
	if n <= 0 {
		return 0
	}
	return time.Duration(p.linear(n) + p.quadratic(Chunk{Offset: max(offset, 0), Tokens: n}))
}

// DecodeCost is the decode cost of seqs decoding sequences whose contexts
// hold kvTokens tokens in all, without the step's base.
func (p Profile) DecodeCost(seqs, kvTokens int) time.Duration {
	return time.Duration(seqs)*p.DecodePerSeq + time.Duration(float64(kvTokens)*p.DecodePerKVToken*float64(time.Second))
}

// StepCost is the duration of a step that prefills chunks and decodes
// seqs sequences holding kvTokens context tokens: StepBase, plus
// DecodeCost, plus the chunks' costs summed before rounding.
func (p Profile) StepCost(chunks []Chunk, seqs, kvTokens int) time.Duration {
	tokens, quad := 0, 0.0
	for _, c := range chunks {
		if c.Tokens > 0 {
			tokens += c.Tokens
			quad += p.quadratic(Chunk{Offset: max(c.Offset, 0), Tokens: c.Tokens})
		}
	}
	return p.StepBase + p.DecodeCost(seqs, kvTokens) + time.Duration(p.linear(tokens)+quad)
}

// ColdPrefill is the time a cold request of tokens prompt tokens takes to
// its first token alone on the engine: its chunks of MaxNumBatchedTokens,
// a step each.
func (p Profile) ColdPrefill(tokens int) time.Duration {
	var d time.Duration
	for s := 0; s < tokens; s += p.MaxNumBatchedTokens {
		d += p.StepCost([]Chunk{{Offset: s, Tokens: min(p.MaxNumBatchedTokens, tokens-s)}}, 0, 0)
	}
	return d
}

// KVTokens is the KV capacity in tokens.
func (p Profile) KVTokens() int { return p.NumGPUBlocks * p.BlockSize }

// BlocksAt is the KV capacity in blocks of blockSize tokens (at least 2,
// the null block and one).
func (p Profile) BlocksAt(blockSize int) int {
	if blockSize <= 0 {
		return 0
	}
	return max(p.KVTokens()/blockSize, 2)
}

// LoadBack is the time a CPU-tier hit of tokens tokens takes to copy
// back to the GPU: tokens × KVBytesPerToken / H2DBytesPerSecond (0 for
// none).
func (p Profile) LoadBack(tokens int) time.Duration {
	if tokens <= 0 {
		return 0
	}
	return time.Duration(float64(tokens) * p.KVBytesPerToken / p.H2DBytesPerSecond * float64(time.Second))
}

// PullTime is the time a pull of tokens tokens from a peer's CPU tier
// takes when share pulls (itself included) divide the link's bandwidth:
// PullSetup, plus PullConnect when first (the pair's first pull), plus
// tokens × KVBytesPerToken × share / PullBytesPerSecond. A share below 1
// counts as 1; a pull of no token takes 0 (nothing is fetched).
func (p Profile) PullTime(tokens, share int, first bool) time.Duration {
	if tokens <= 0 {
		return 0
	}
	d := p.PullSetup
	if first {
		d += p.PullConnect
	}
	bytes := float64(tokens) * p.KVBytesPerToken * float64(max(share, 1))
	return d + time.Duration(bytes/p.PullBytesPerSecond*float64(time.Second))
}

// CPUBlocks is the number of KV blocks of blockSize tokens a CPU tier of
// bytes bytes holds (vLLM sizes its tier as cpu_bytes_to_use over the
// bytes of one offload block); 0 for no bytes or no block size.
func (p Profile) CPUBlocks(bytes int64, blockSize int) int {
	if bytes <= 0 || blockSize <= 0 || p.KVBytesPerToken <= 0 {
		return 0
	}
	return int(float64(bytes) / (p.KVBytesPerToken * float64(blockSize)))
}

// Validate checks p.
func (p Profile) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("profile %q: "+format, append([]any{p.Name}, args...)...))
		}
	}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	check(p.Name != "", "no name")
	check(p.StepBase >= 0, "step base %v must not be negative", p.StepBase)
	check(p.PrefillTokensPerSecond > 0 && finite(p.PrefillTokensPerSecond), "prefill throughput %v tok/s must be positive", p.PrefillTokensPerSecond)
	check(p.PrefillQuadratic >= 0 && finite(p.PrefillQuadratic), "prefill quadratic term %v s/token² must be finite and not negative", p.PrefillQuadratic)
	check(p.DecodePerSeq >= 0, "decode cost per sequence %v must not be negative", p.DecodePerSeq)
	check(p.DecodePerKVToken >= 0 && finite(p.DecodePerKVToken), "decode cost per KV token %v s must be finite and not negative", p.DecodePerKVToken)
	check(p.MaxNumBatchedTokens > 0, "max_num_batched_tokens %d must be positive", p.MaxNumBatchedTokens)
	check(p.BlockSize > 0 && p.NumGPUBlocks >= 2, "capacity %d blocks of %d tokens: want a positive block size and at least 2 blocks", p.NumGPUBlocks, p.BlockSize)
	check(p.MaxModelLen > 0, "max_model_len %d must be positive", p.MaxModelLen)
	check(p.KVBytesPerToken > 0 && finite(p.KVBytesPerToken), "KV bytes per token %v must be positive", p.KVBytesPerToken)
	check(p.H2DBytesPerSecond > 0 && finite(p.H2DBytesPerSecond), "host-to-device bandwidth %v B/s must be positive", p.H2DBytesPerSecond)
	check(p.PullSetup >= 0, "pull setup %v must not be negative", p.PullSetup)
	check(p.PullBytesPerSecond > 0 && finite(p.PullBytesPerSecond), "pull bandwidth %v B/s must be positive", p.PullBytesPerSecond)
	check(p.PullConnect >= 0, "pull connection setup %v must not be negative", p.PullConnect)
	check(p.CPUBytes >= 0, "CPU tier %d bytes must not be negative", p.CPUBytes)
	return errors.Join(errs...)
}
