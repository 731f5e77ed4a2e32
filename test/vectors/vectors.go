package vectors

import (
	"bytes"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

//go:embed testdata/*.json
var files embed.FS

// Capture is one vLLM-captured BlockStored event with its prompt.
type Capture struct {
	Prompt      string   `json:"prompt"`
	ModelName   string   `json:"model_name"`
	LoraName    *string  `json:"lora_name"`
	LoraPath    string   `json:"lora_path"`
	BlockHashes []uint64 `json:"block_hashes"`
	Parent      *uint64  `json:"parent_block_hash"`
	TokenIDs    []uint32 `json:"token_ids"`
	BlockSize   int      `json:"block_size"`
	Medium      string   `json:"medium"`
	HashSeed    string   `json:"hash_seed"`
}

// Base is the capture without LoRA (Qwen/Qwen3-0.6B, block size 16,
// sha256_cbor, PYTHONHASHSEED=42).
func Base() (*Capture, error) { return capture("llmd_kv_event_base.json") }

// LoRA is the same prompt with LoRA adapter "Alice" active.
func LoRA() (*Capture, error) { return capture("llmd_kv_event_lora.json") }

func capture(name string) (*Capture, error) {
	var c Capture
	if err := load(name, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// HashCase is one row of derived_block_hash_vectors.json.
type HashCase struct {
	Algo          string   `json:"algo"`
	Seed          string   `json:"none_hash_seed"`
	ExtraKeys     *string  `json:"extra_keys"` // a description, not data
	NoneHashHex   string   `json:"none_hash_hex"`
	FirstBlockHex string   `json:"first_block_serialized_hex"`
	FullHex       []string `json:"block_hashes_full_hex"`
	EventUint64   []uint64 `json:"block_hashes_event_uint64"`
}

// Derived holds the derived hash cases and the tokens they were computed on.
type Derived struct {
	BlockSize int        `json:"block_size"`
	Cases     []HashCase `json:"cases"`
}

// DerivedHashes loads derived_block_hash_vectors.json.
func DerivedHashes() (*Derived, error) {
	var d Derived
	if err := load("derived_block_hash_vectors.json", &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// EventBatch is one msgpack batch sample: its payload and decoded form
// (json.Number for numbers, so 64-bit hashes stay exact).
type EventBatch struct {
	Name    string
	Payload []byte
	Decoded any
}

// EventBatches loads derived_msgpack_event_batches.json: the map-layout
// sample first, then the array-layout one, and the ZMQ topic and seq frames.
func EventBatches() (batches []EventBatch, topic string, seq []byte, err error) {
	raw, err := files.ReadFile("testdata/derived_msgpack_event_batches.json")
	if err != nil {
		return nil, "", nil, err
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, "", nil, err
	}
	if err := json.Unmarshal(doc["zmq_topic"], &topic); err != nil {
		return nil, "", nil, err
	}
	var seqHex string
	if err := json.Unmarshal(doc["zmq_seq_hex"], &seqHex); err != nil {
		return nil, "", nil, err
	}
	if seq, err = hex.DecodeString(seqHex); err != nil {
		return nil, "", nil, err
	}
	for _, name := range []string{"current_main_map_events", "legacy_array_events"} {
		var s struct {
			PayloadHex string          `json:"payload_hex"`
			Decoded    json.RawMessage `json:"decoded"`
		}
		if err := json.Unmarshal(doc[name], &s); err != nil {
			return nil, "", nil, fmt.Errorf("%s: %w", name, err)
		}
		b := EventBatch{Name: name}
		if b.Payload, err = hex.DecodeString(s.PayloadHex); err != nil {
			return nil, "", nil, fmt.Errorf("%s: %w", name, err)
		}
		dec := json.NewDecoder(bytes.NewReader(s.Decoded))
		dec.UseNumber()
		if err := dec.Decode(&b.Decoded); err != nil {
			return nil, "", nil, fmt.Errorf("%s: %w", name, err)
		}
		batches = append(batches, b)
	}
	return batches, topic, seq, nil
}

func load(name string, v any) error {
	raw, err := files.ReadFile("testdata/" + name)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
