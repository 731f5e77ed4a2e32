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
	return errors.Join(errs...)
}
