package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// EventType names a KV-cache event.
type EventType uint8

// The event types vLLM publishes. TypeUnknown is a tag this package does not
// know (a newer vLLM); such events are kept, with their tag in TypeName, so a
// consumer can count them instead of losing the whole batch.
const (
	TypeUnknown EventType = iota
	TypeBlockStored
	TypeBlockRemoved
	TypeAllBlocksCleared
)

// String returns vLLM's tag for t.
func (t EventType) String() string {
	switch t {
	case TypeBlockStored:
		return "BlockStored"
	case TypeBlockRemoved:
		return "BlockRemoved"
	case TypeAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// Layout is how events are laid out inside a batch.
type Layout uint8

const (
	// LayoutMap: each event is a msgpack map whose first key is "type"
	// (vLLM since PR #42892, v0.26 and later).
	LayoutMap Layout = iota
	// LayoutArray: each event is a tagged array ["BlockStored", f1, f2, …]
	// with trailing defaults omitted (older vLLM).
	LayoutArray
)

// String returns "map" or "array".
func (l Layout) String() string {
	if l == LayoutArray {
		return "array"
	}
	return "map"
}

// ParseLayout parses "map" or "array".
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "map":
		return LayoutMap, nil
	case "array":
		return LayoutArray, nil
	}
	return 0, fmt.Errorf("kvevents: unknown event layout %q (want map or array)", s)
}

// Media of a BlockStored/BlockRemoved event (vLLM's MEDIUM_* constants).
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// Hash is an engine block hash as it appeared on the wire. vLLM sends the
// 64-bit form by default (the last 8 bytes of the digest, big-endian) and the
// raw digest when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0. Either way Int holds
// the 64-bit form, so both representations of one block compare equal by
// Int. The value is opaque: it cannot be fed back into vLLM's chain.
type Hash struct {
	Int uint64 // the 64-bit form; for a raw digest, its last 8 bytes big-endian
	Raw string // the raw digest bytes when the wire carried bytes, else ""
}

// IntHash returns the hash of a 64-bit wire value.
func IntHash(v uint64) Hash { return Hash{Int: v} }

// RawHash returns the hash of raw digest bytes.
func RawHash(digest []byte) Hash {
	return Hash{Int: last8(digest), Raw: string(digest)}
}

// last8 reads the last (up to) 8 bytes big-endian, as vLLM's
// maybe_convert_block_hash does.
func last8(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// String formats the hash as vLLM logs it: decimal for the 64-bit form, hex
// for a raw digest.
func (h Hash) String() string {
	if h.Raw != "" {
		return fmt.Sprintf("%x", h.Raw)
	}
	return fmt.Sprintf("%d", h.Int)
}

// OptInt is an integer field that may be absent (None on the vLLM side).
type OptInt struct {
	Value int64
	Valid bool
}

// Some returns a present OptInt.
func Some(v int64) OptInt { return OptInt{Value: v, Valid: true} }

// Event is one KV-cache event. Which fields are meaningful depends on Type:
//
//   - BlockStored: every field up to SessionID.
//   - BlockRemoved: BlockHashes, Medium, GroupIdx, Locality, Ownership.
//   - AllBlocksCleared: none.
//
// Optional string fields use "" for None.
type Event struct {
	Type     EventType
	TypeName string // the wire tag when Type is TypeUnknown

	BlockHashes     []Hash
	ParentBlockHash Hash
	HasParent       bool     // false when parent_block_hash is nil (the run starts at token 0)
	TokenIDs        []uint32 // all tokens of the run, len = len(BlockHashes)*BlockSize
	BlockSize       int
	LoraID          OptInt // deprecated by vLLM; LoraName is the identity
	Medium          string
	LoraName        string
	// ExtraKeys holds one entry per block: nil for None, else the block's
	// extra keys (string, []byte, int64, uint64, float64, bool or nested
	// []any). ExtraKeys itself is nil when the field is absent.
	ExtraKeys                [][]any
	GroupIdx                 OptInt
	KVCacheSpecKind          string
	KVCacheSpecSlidingWindow OptInt
	Locality                 string
	Ownership                string
	SessionID                string
}

// Batch is one published message: vLLM's KVEventBatch.
type Batch struct {
	TS               float64 // wall-clock seconds; not for ordering (use seq)
	Events           []Event
	DataParallelRank OptInt
	Layout           Layout // layout of the events as decoded (map when there are none)
}

// Semantic errors returned by Validate.
var (
	ErrTokenCount = errors.New("kvevents: token count is not blocks × block size")
	ErrNoHashes   = errors.New("kvevents: event without block hashes")
)

// Validate checks what the wire format cannot express: a BlockStored run
// carries exactly len(BlockHashes)*BlockSize tokens (connector placeholder
// events, with no tokens and block size 0, are valid too), extra keys come one
// per block, and removals name at least one block.
func (e *Event) Validate() error {
	switch e.Type {
	case TypeBlockStored:
		if len(e.BlockHashes) == 0 {
			return ErrNoHashes
		}
		if e.BlockSize == 0 && len(e.TokenIDs) == 0 {
			return nil // placeholder event: not self-describing
		}
		if e.BlockSize <= 0 || len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
			return fmt.Errorf("%w: %d tokens, %d blocks of %d", ErrTokenCount, len(e.TokenIDs), len(e.BlockHashes), e.BlockSize)
		}
		if e.ExtraKeys != nil && len(e.ExtraKeys) != len(e.BlockHashes) {
			return fmt.Errorf("kvevents: %d extra-key entries for %d blocks", len(e.ExtraKeys), len(e.BlockHashes))
		}
	case TypeBlockRemoved:
		if len(e.BlockHashes) == 0 {
			return ErrNoHashes
		}
	}
	return nil
}

// Placeholder reports whether e is a connector placeholder BlockStored event
// that carries no tokens (CPU offload without self-describing events).
func (e *Event) Placeholder() bool {
	return e.Type == TypeBlockStored && len(e.TokenIDs) == 0 && e.BlockSize == 0
}
