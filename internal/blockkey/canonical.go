package blockkey

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/zeebo/xxh3"
)

// FormatV1 names canonical key format v1. Endpoints whose key formats differ
// are never compared.
const FormatV1 = "kvroute-xxh3-v1"

// Key is a canonical block key.
type Key uint64

// String formats k as 16 lowercase hex digits (the form of prefix_hash).
func (k Key) String() string {
	var b [16]byte
	const hexdig = "0123456789abcdef"
	for i := 15; i >= 0; i-- {
		b[i] = hexdig[k&0xf]
		k >>= 4
	}
	return string(b[:])
}

// ParseKey parses the 16-hex-digit form written by Key.String.
func ParseKey(s string) (Key, error) {
	if len(s) != 16 {
		return 0, fmt.Errorf("blockkey: key %q is not 16 hex digits", s)
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("blockkey: key %q is not 16 hex digits", s)
	}
	return Key(v), nil
}

// Root returns the root of every chain for a model and LoRA adapter name
// ("" when no adapter is active).
func Root(model, lora string) Key {
	var stack [128]byte
	buf := append(stack[:0], "kvroute/v1"...)
	buf = append(buf, 0)
	buf = append(buf, model...)
	buf = append(buf, 0)
	buf = append(buf, lora...)
	return Key(xxh3.Hash(buf))
}

// ExtraKind tags an extra key folded into a block.
type ExtraKind uint8

// Extra kinds; the values are part of the key format.
const (
	ExtraCacheSalt ExtraKind = 1
	ExtraMM        ExtraKind = 2
	ExtraEmbeds    ExtraKind = 3
)

// Extra is one extra key of a block.
type Extra struct {
	Kind ExtraKind
	// Data is the salt, the multimodal identifier or the embeds digest.
	Data string
	// Offset is, for ExtraMM, the item's first token position relative to
	// the block's first token (negative when the item began earlier).
	Offset int64
}

// SaltExtra returns the extra of a cache salt.
func SaltExtra(salt string) Extra { return Extra{Kind: ExtraCacheSalt, Data: salt} }

// MMItem is a multimodal item's placeholder in the token sequence.
type MMItem struct {
	Identifier string // the engine's content hash of the item (mm_hashes)
	Offset     int    // first placeholder token
	Length     int    // placeholder tokens
}

// overlaps reports whether item overlaps the tokens [start, end), as vLLM
// decides which items' identifiers go into a block's extra keys.
func (m MMItem) overlaps(start, end int) bool {
	return m.Offset < end && (m.Offset >= start || m.Offset+m.Length > start)
}

func appendExtra(buf []byte, e Extra) []byte {
	n := len(e.Data)
	if e.Kind == ExtraMM {
		n += 8
	}
	buf = append(buf, byte(e.Kind))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(n))
	if e.Kind == ExtraMM {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(e.Offset))
	}
	return append(buf, e.Data...)
}

// appendBlock appends the hashed bytes of one block to buf.
func appendBlock(buf []byte, parent Key, tokens []uint32, extras []Extra) []byte {
	buf = binary.LittleEndian.AppendUint64(buf, uint64(parent))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(tokens)))
	buf = appendTokens(buf, tokens)
	for _, e := range extras {
		buf = appendExtra(buf, e)
	}
	return buf
}

// Next returns the key of one block of tokens (the block size is
// len(tokens)) whose predecessor is parent (the root for block 0).
func Next(parent Key, tokens []uint32, extras []Extra) Key {
	var stack [12 + 4*64]byte
	return Key(xxh3.Hash(appendBlock(stack[:0], parent, tokens, extras)))
}

// AppendChain appends to dst the keys of every full block of tokens, chained
// from parent; a partial tail is not keyed. extras[i], when present, holds
// the extras of block i (relative to this run). blockSize must be positive.
func AppendChain(dst []Key, parent Key, blockSize int, tokens []uint32, extras [][]Extra) []Key {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if cap(dst)-len(dst) < n {
		grown := make([]Key, len(dst), len(dst)+n)
		copy(grown, dst)
		dst = grown
	}
	// The block size word is the same for every block; only the parent, the
	// tokens and the extras change.
	var stack [12 + 4*64]byte
	buf := stack[:0]
	buf = append(buf, make([]byte, 12+4*blockSize)...)[:12]
	binary.LittleEndian.PutUint32(buf[8:12], uint32(blockSize))
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint64(buf[0:8], uint64(parent))
		buf = appendTokens(buf[:12], tokens[i*blockSize:(i+1)*blockSize])
		if i < len(extras) {
			for _, e := range extras[i] {
				buf = appendExtra(buf, e)
			}
		}
		parent = Key(xxh3.Hash(buf))
		dst = append(dst, parent)
	}
	return dst
}

// Request is what identifies a request's cached prefix, apart from the model.
type Request struct {
	Tokens    []uint32
	LoRA      string   // adapter name; "" for none
	CacheSalt string   // "" for none
	MM        []MMItem // sorted by Offset
}

// BlockExtras returns the canonical extras of block i of r: the salt on
// block 0, then the multimodal items overlapping the block.
func (r *Request) BlockExtras(dst []Extra, i, blockSize int) []Extra {
	if i == 0 && r.CacheSalt != "" {
		dst = append(dst, SaltExtra(r.CacheSalt))
	}
	start, end := i*blockSize, (i+1)*blockSize
	for _, m := range r.MM {
		if m.overlaps(start, end) {
			dst = append(dst, Extra{Kind: ExtraMM, Data: m.Identifier, Offset: int64(m.Offset - start)})
		}
	}
	return dst
}

// AppendKeys appends the canonical keys of every full block of r for the
// given model and block size. It equals AppendChain from Root(model, r.LoRA)
// with BlockExtras per block, without allocating extras when the request
// has no salt or multimodal items.
func (r *Request) AppendKeys(dst []Key, model string, blockSize int) []Key {
	root := Root(model, r.LoRA)
	if blockSize <= 0 {
		return dst
	}
	if len(r.MM) == 0 {
		if r.CacheSalt == "" || len(r.Tokens) < blockSize {
			return AppendChain(dst, root, blockSize, r.Tokens, nil)
		}
		first := Next(root, r.Tokens[:blockSize], []Extra{SaltExtra(r.CacheSalt)})
		dst = append(dst, first)
		return AppendChain(dst, first, blockSize, r.Tokens[blockSize:], nil)
	}
	n := len(r.Tokens) / blockSize
	extras := make([][]Extra, n)
	for i := range extras {
		extras[i] = r.BlockExtras(nil, i, blockSize)
	}
	return AppendChain(dst, root, blockSize, r.Tokens, extras)
}
