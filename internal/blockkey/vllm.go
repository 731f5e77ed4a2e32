package blockkey

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"
)

// DefaultSeed is vLLM's NONE_HASH seed for sha256 and sha256_cbor when
// PYTHONHASHSEED is unset (DEFAULT_NONE_HASH_SEED, vLLM PR #51875).
const DefaultSeed = "vllm-none-hash"

// HashAlgoSHA256CBOR is the --prefix-caching-hash-algo value implemented here.
const HashAlgoSHA256CBOR = "sha256_cbor"

// Seed resolves the NONE_HASH seed as current vLLM does: PYTHONHASHSEED when
// set, else DefaultSeed.
func Seed(pythonHashSeed string, set bool) string {
	if set {
		return pythonHashSeed
	}
	return DefaultSeed
}

// Digest is a full SHA-256 block digest: the parent vLLM chains from.
type Digest [32]byte

// EventHash returns the 64-bit form vLLM publishes in KV events: the last 8
// digest bytes, big-endian (maybe_convert_block_hash).
func EventHash(d Digest) uint64 { return binary.BigEndian.Uint64(d[24:]) }

// SHA256CBOR is vLLM's sha256_cbor block hasher for one seed.
type SHA256CBOR struct {
	none Digest
}

// NewSHA256CBOR returns the hasher whose NONE_HASH is sha256(cbor(seed)),
// the seed being a text string ("42", not 42).
func NewSHA256CBOR(seed string) *SHA256CBOR {
	return &SHA256CBOR{none: sha256.Sum256(appendCBORText(nil, seed))}
}

// NoneHash returns the parent of block 0.
func (h *SHA256CBOR) NoneHash() Digest { return h.none }

// AppendBlockCBOR appends the canonical CBOR of (parent, tuple(tokens),
// extra or None) that vLLM hashes; extra nil or empty means None. Extra
// keys may be strings, []byte, integers (int, int64, uint64), bool, nil or
// nested []any (tuples); anything else is an error.
func AppendBlockCBOR(dst []byte, parent Digest, tokens []uint32, extra []any) ([]byte, error) {
	dst = append(dst, 0x83)
	dst = appendCBORHead(dst, 2, uint64(len(parent)))
	dst = append(dst, parent[:]...)
	dst = appendCBORHead(dst, 4, uint64(len(tokens)))
	for _, t := range tokens {
		dst = appendCBORHead(dst, 0, uint64(t))
	}
	if len(extra) == 0 {
		return append(dst, 0xf6), nil
	}
	return appendCBORValue(dst, extra, 8)
}

// Block returns the digest of one block chained from parent.
func (h *SHA256CBOR) Block(parent Digest, tokens []uint32, extra []any) (Digest, error) {
	var stack [128]byte
	buf, err := AppendBlockCBOR(stack[:0], parent, tokens, extra)
	if err != nil {
		return Digest{}, err
	}
	return sha256.Sum256(buf), nil
}

// AppendChain appends the digests of every full block of tokens, chained
// from parent (nil: from NONE_HASH, i.e. the run starts at token 0).
// extras[i], when present, is block i's extra keys.
func (h *SHA256CBOR) AppendChain(dst []Digest, parent *Digest, blockSize int, tokens []uint32, extras [][]any) ([]Digest, error) {
	if blockSize <= 0 {
		return dst, fmt.Errorf("blockkey: block size %d", blockSize)
	}
	p := h.none
	if parent != nil {
		p = *parent
	}
	var buf []byte
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		var ex []any
		if b := i / blockSize; b < len(extras) {
			ex = extras[b]
		}
		var err error
		buf, err = AppendBlockCBOR(buf[:0], p, tokens[i:i+blockSize], ex)
		if err != nil {
			return dst, err
		}
		p = sha256.Sum256(buf)
		dst = append(dst, p)
	}
	return dst, nil
}

// VLLMExtraKeys returns vLLM's extra keys for block i of r
// (generate_block_hash_extra_keys): the LoRA name on every block, then
// (identifier, offset − block start) for each multimodal item overlapping
// the block, then the cache salt on block 0. nil when there are none.
func (r *Request) VLLMExtraKeys(i, blockSize int) []any {
	var keys []any
	if r.LoRA != "" {
		keys = append(keys, r.LoRA)
	}
	start, end := i*blockSize, (i+1)*blockSize
	for _, m := range r.MM {
		if m.overlaps(start, end) {
			keys = append(keys, []any{m.Identifier, int64(m.Offset - start)})
		}
	}
	if i == 0 && r.CacheSalt != "" {
		keys = append(keys, r.CacheSalt)
	}
	return keys
}

// VLLMChain returns the digests vLLM's sha256_cbor computes for every full
// block of r.
func (h *SHA256CBOR) VLLMChain(r *Request, blockSize int) ([]Digest, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("blockkey: block size %d", blockSize)
	}
	n := len(r.Tokens) / blockSize
	extras := make([][]any, n)
	for i := range extras {
		extras[i] = r.VLLMExtraKeys(i, blockSize)
	}
	return h.AppendChain(make([]Digest, 0, n), nil, blockSize, r.Tokens, extras)
}

// appendCBORHead writes a CBOR head in its shortest form (canonical CBOR).
func appendCBORHead(dst []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(dst, m|byte(v))
	case v <= math.MaxUint8:
		return append(dst, m|24, byte(v))
	case v <= math.MaxUint16:
		return append(dst, m|25, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, m|26), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, m|27), v)
}

func appendCBORText(dst []byte, s string) []byte {
	return append(appendCBORHead(dst, 3, uint64(len(s))), s...)
}

func appendCBORInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return appendCBORHead(dst, 0, uint64(v))
	}
	return appendCBORHead(dst, 1, uint64(-1-v))
}

func appendCBORValue(dst []byte, v any, depth int) ([]byte, error) {
	if depth <= 0 {
		return dst, fmt.Errorf("blockkey: extra keys nested too deeply")
	}
	switch v := v.(type) {
	case nil:
		return append(dst, 0xf6), nil
	case bool:
		if v {
			return append(dst, 0xf5), nil
		}
		return append(dst, 0xf4), nil
	case string:
		return appendCBORText(dst, v), nil
	case []byte:
		return append(appendCBORHead(dst, 2, uint64(len(v))), v...), nil
	case int:
		return appendCBORInt(dst, int64(v)), nil
	case int64:
		return appendCBORInt(dst, v), nil
	case uint64:
		return appendCBORHead(dst, 0, v), nil
	case []any:
		dst = appendCBORHead(dst, 4, uint64(len(v)))
		for _, item := range v {
			var err error
			if dst, err = appendCBORValue(dst, item, depth-1); err != nil {
				return dst, err
			}
		}
		return dst, nil
	}
	return dst, fmt.Errorf("blockkey: extra key of type %T is not supported", v)
}
