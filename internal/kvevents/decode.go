package kvevents

import (
	"encoding/binary"
	"math"
)

// Limits on decoding.
const (
	// DefaultMaxPayload caps a batch's payload size. A vLLM step that stores
	// a few hundred thousand tokens stays well below it.
	DefaultMaxPayload = 64 << 20
	// MaxDepth caps the nesting of extra keys (vLLM nests at most a tuple
	// inside the key list).
	MaxDepth = 8
)

// Decoder decodes batches, reusing its memory between calls. The zero value
// is ready to use with DefaultMaxPayload. A Decoder is not safe for
// concurrent use.
type Decoder struct {
	// MaxPayload caps the payload size in bytes; 0 means DefaultMaxPayload.
	MaxPayload int

	events []Event
	tokens []uint32
	hashes []Hash
}

// Decode decodes one payload into a fresh Batch that shares no memory with
// later calls.
func Decode(payload []byte) (*Batch, error) {
	var d Decoder
	b := new(Batch)
	if err := d.Decode(payload, b); err != nil {
		return nil, err
	}
	return b, nil
}

// Decode decodes payload into b. The slices in b (events, hashes, tokens)
// point into the Decoder's buffers and stay valid only until the next call
// to Decode on the same Decoder. On error b is reset to the zero Batch.
func (d *Decoder) Decode(payload []byte, b *Batch) error {
	err := d.decode(payload, b)
	if err != nil {
		*b = Batch{}
	}
	return err
}

func (d *Decoder) decode(payload []byte, b *Batch) error {
	r := reader{b: payload}
	max := d.MaxPayload
	if max <= 0 {
		max = DefaultMaxPayload
	}
	if len(payload) > max {
		return r.errorf("payload of %d bytes exceeds the %d-byte limit", len(payload), max)
	}
	d.events, d.tokens, d.hashes = d.events[:0], d.tokens[:0], d.hashes[:0]

	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return r.errorf("batch has %d elements, want [ts, events, data_parallel_rank]", n)
	}
	ts, err := r.float()
	if err != nil {
		return err
	}
	ne, err := r.arrayLen()
	if err != nil {
		return err
	}
	layout, layoutSet := LayoutMap, false
	for i := 0; i < ne; i++ {
		c, err := r.peek()
		if err != nil {
			return err
		}
		l := LayoutMap
		if c >= 0x90 && c <= 0x9f || c == mpArray16 || c == mpArray32 {
			l = LayoutArray
		}
		if !layoutSet {
			layout, layoutSet = l, true
		} else if l != layout {
			return r.errorf("event %d mixes map and array layouts", i)
		}
		d.events = append(d.events, Event{})
		ev := &d.events[len(d.events)-1]
		if l == LayoutArray {
			err = d.arrayEvent(&r, ev)
		} else {
			err = d.mapEvent(&r, ev)
		}
		if err != nil {
			return err
		}
	}
	var rank OptInt
	if n >= 3 {
		if rank, err = r.optInt(); err != nil {
			return err
		}
		for i := 3; i < n; i++ { // fields a newer vLLM may append
			if err := r.skip(MaxDepth); err != nil {
				return err
			}
		}
	}
	if r.left() != 0 {
		return r.errorf("%d trailing bytes after the batch", r.left())
	}
	*b = Batch{TS: ts, Events: d.events[:ne:ne], DataParallelRank: rank, Layout: layout}
	return nil
}

// eventType maps a wire tag to its type.
func eventType(tag []byte) EventType {
	switch string(tag) {
	case "BlockStored":
		return TypeBlockStored
	case "BlockRemoved":
		return TypeBlockRemoved
	case "AllBlocksCleared":
		return TypeAllBlocksCleared
	}
	return TypeUnknown
}

func (d *Decoder) setType(ev *Event, tag []byte) {
	ev.Type = eventType(tag)
	if ev.Type == TypeUnknown {
		ev.TypeName = string(tag)
	}
}

// Field names, in vLLM's declaration order. The array layout is positional
// in exactly this order.
var (
	storedFields = []string{
		"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
		"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
		"kv_cache_spec_sliding_window", "locality", "ownership", "session_id",
	}
	removedFields = []string{"block_hashes", "medium", "group_idx", "locality", "ownership"}
)

func (d *Decoder) mapEvent(r *reader, ev *Event) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	body := r.off
	// msgspec writes the tag first; if another key comes first, find the
	// tag before decoding fields, since which fields apply depends on it.
	sawType := false
	for i := 0; i < n && !sawType; i++ {
		key, err := r.strBytes()
		if err != nil {
			return err
		}
		if string(key) != "type" {
			if err := r.skip(MaxDepth); err != nil {
				return err
			}
			continue
		}
		tag, err := r.strBytes()
		if err != nil {
			return err
		}
		d.setType(ev, tag)
		sawType = true
	}
	if !sawType {
		return r.errorf("event map without a \"type\" key")
	}
	r.off = body
	sawHashes := false
	for i := 0; i < n; i++ {
		key, err := r.strBytes()
		if err != nil {
			return err
		}
		switch string(key) {
		case "type":
			err = r.skip(MaxDepth)
		case "block_hashes":
			sawHashes = true
			fallthrough
		default:
			err = d.field(r, ev, string(key))
		}
		if err != nil {
			return err
		}
	}
	return requireHashes(r, ev, sawHashes)
}

func (d *Decoder) arrayEvent(r *reader, ev *Event) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n == 0 {
		return r.errorf("empty event array")
	}
	tag, err := r.strBytes()
	if err != nil {
		return err
	}
	d.setType(ev, tag)
	var names []string
	switch ev.Type {
	case TypeBlockStored:
		names = storedFields
	case TypeBlockRemoved:
		names = removedFields
	}
	for i := 1; i < n; i++ {
		if i-1 < len(names) {
			if err := d.field(r, ev, names[i-1]); err != nil {
				return err
			}
		} else if err := r.skip(MaxDepth); err != nil {
			return err
		}
	}
	return requireHashes(r, ev, n > 1)
}

func requireHashes(r *reader, ev *Event, saw bool) error {
	if !saw && (ev.Type == TypeBlockStored || ev.Type == TypeBlockRemoved) {
		return r.errorf("%s without block_hashes", ev.Type)
	}
	return nil
}

// field decodes the value of one named field into ev. Fields that do not
// belong to the event's type, and unknown fields, are skipped.
func (d *Decoder) field(r *reader, ev *Event, name string) error {
	var err error
	switch ev.Type {
	case TypeBlockStored, TypeBlockRemoved:
	default:
		return r.skip(MaxDepth)
	}
	stored := ev.Type == TypeBlockStored
	switch {
	case name == "block_hashes":
		ev.BlockHashes, err = d.hashList(r)
	case name == "medium":
		ev.Medium, err = r.optString()
	case name == "group_idx":
		ev.GroupIdx, err = r.optInt()
	case name == "locality":
		ev.Locality, err = r.optString()
	case name == "ownership":
		ev.Ownership, err = r.optString()
	case !stored:
		err = r.skip(MaxDepth)
	case name == "parent_block_hash":
		if !r.tryNil() {
			ev.ParentBlockHash, err = hash(r)
			ev.HasParent = err == nil
		}
	case name == "token_ids":
		ev.TokenIDs, err = d.tokenList(r)
	case name == "block_size":
		var v int64
		v, err = r.int64v()
		if err == nil && (v < 0 || v > math.MaxInt32) {
			err = r.errorf("block_size %d out of range", v)
		}
		ev.BlockSize = int(v)
	case name == "lora_id":
		ev.LoraID, err = r.optInt()
	case name == "lora_name":
		ev.LoraName, err = r.optString()
	case name == "extra_keys":
		ev.ExtraKeys, err = extraKeys(r)
	case name == "kv_cache_spec_kind":
		ev.KVCacheSpecKind, err = r.optString()
	case name == "kv_cache_spec_sliding_window":
		ev.KVCacheSpecSlidingWindow, err = r.optInt()
	case name == "session_id":
		ev.SessionID, err = r.optString()
	default:
		err = r.skip(MaxDepth)
	}
	return err
}

// hash reads one block hash: an integer (negative int64 values are taken as
// their 64-bit two's complement) or raw digest bytes.
func hash(r *reader) (Hash, error) {
	c, err := r.peek()
	if err != nil {
		return Hash{}, err
	}
	if c >= mpBin8 && c <= mpBin32 {
		b, err := r.binBytes()
		if err != nil {
			return Hash{}, err
		}
		if len(b) == 0 {
			return Hash{}, r.errorf("empty block hash")
		}
		return RawHash(b), nil
	}
	v, _, err := r.integer()
	return Hash{Int: v}, err
}

func (d *Decoder) hashList(r *reader) ([]Hash, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	start := len(d.hashes)
	for i := 0; i < n; i++ {
		h, err := hash(r)
		if err != nil {
			return nil, err
		}
		d.hashes = append(d.hashes, h)
	}
	return d.hashes[start:len(d.hashes):len(d.hashes)], nil
}

func (d *Decoder) tokenList(r *reader) ([]uint32, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	start := len(d.tokens)
	if cap(d.tokens)-start < n {
		// n ≤ bytes left (checked by arrayLen): growth is bounded by the payload.
		grown := make([]uint32, start, start+n+cap(d.tokens))
		copy(grown, d.tokens)
		d.tokens = grown
	}
	for i := 0; i < n; i++ {
		// Fast path for the unsigned forms msgspec writes for token ids.
		if b := r.b[r.off:]; len(b) >= 5 {
			switch c := b[0]; {
			case c <= 0x7f:
				d.tokens = append(d.tokens, uint32(c))
				r.off++
				continue
			case c == mpUint8:
				d.tokens = append(d.tokens, uint32(b[1]))
				r.off += 2
				continue
			case c == mpUint16:
				d.tokens = append(d.tokens, uint32(binary.BigEndian.Uint16(b[1:3])))
				r.off += 3
				continue
			case c == mpUint32:
				d.tokens = append(d.tokens, binary.BigEndian.Uint32(b[1:5]))
				r.off += 5
				continue
			}
		}
		v, neg, err := r.integer()
		if err != nil {
			return nil, err
		}
		if neg || v > math.MaxUint32 {
			return nil, r.errorf("token id %d out of range", int64(v))
		}
		d.tokens = append(d.tokens, uint32(v))
	}
	return d.tokens[start:len(d.tokens):len(d.tokens)], nil
}

func extraKeys(r *reader) ([][]any, error) {
	if r.tryNil() {
		return nil, nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([][]any, n)
	for i := range out {
		if r.tryNil() {
			continue
		}
		v, err := r.value(MaxDepth)
		if err != nil {
			return nil, err
		}
		keys, ok := v.([]any)
		if !ok {
			return nil, r.errorf("extra keys of block %d are %T, want a list", i, v)
		}
		out[i] = keys
	}
	return out, nil
}
