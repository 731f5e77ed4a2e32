package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// AppendBatch appends the msgpack payload of b to dst, with events in the
// given layout, byte for byte as vLLM's msgspec encoder writes it:
//
//   - the batch is a positional array [ts, events, data_parallel_rank]
//     (data_parallel_rank dropped when absent, per omit_defaults);
//   - map events start with "type" and list fields in declaration order,
//     fields without a default always present (nil when empty) and fields
//     with a default omitted when None;
//   - array events are [tag, fields…] with trailing None defaults omitted;
//   - integers in their shortest form, ts as float64.
//
// It fails only for an event of unknown type or an extra key of a type
// msgpack cannot carry.
func AppendBatch(dst []byte, b *Batch, layout Layout) ([]byte, error) {
	w := writer{b: dst}
	if b.DataParallelRank.Valid {
		w.arrayHeader(3)
	} else {
		w.arrayHeader(2)
	}
	w.float64(b.TS)
	w.arrayHeader(len(b.Events))
	for i := range b.Events {
		var err error
		if layout == LayoutArray {
			err = w.arrayEvent(&b.Events[i])
		} else {
			err = w.mapEvent(&b.Events[i])
		}
		if err != nil {
			return dst, err
		}
	}
	if b.DataParallelRank.Valid {
		w.int(b.DataParallelRank.Value)
	}
	return w.b, nil
}

// Encode returns the payload of b in the given layout.
func Encode(b *Batch, layout Layout) ([]byte, error) {
	return AppendBatch(nil, b, layout)
}

type writer struct{ b []byte }

// field is one field of an event as msgspec sees it.
type field struct {
	name       string
	hasDefault bool // declared with a default (None): omitted when None
	none       bool // the value is None
	write      func(w *writer) error
}

func (w *writer) mapEvent(ev *Event) error {
	fields, err := eventFields(ev)
	if err != nil {
		return err
	}
	n := 1
	for _, f := range fields {
		if !(f.hasDefault && f.none) {
			n++
		}
	}
	w.mapHeader(n)
	w.str("type")
	w.str(ev.Type.String())
	for _, f := range fields {
		if f.hasDefault && f.none {
			continue
		}
		w.str(f.name)
		if err := f.write(w); err != nil {
			return err
		}
	}
	return nil
}

func (w *writer) arrayEvent(ev *Event) error {
	fields, err := eventFields(ev)
	if err != nil {
		return err
	}
	n := len(fields)
	for n > 0 && fields[n-1].hasDefault && fields[n-1].none {
		n--
	}
	w.arrayHeader(1 + n)
	w.str(ev.Type.String())
	for _, f := range fields[:n] {
		if err := f.write(w); err != nil {
			return err
		}
	}
	return nil
}

// eventFields lists ev's fields in vLLM's declaration order.
func eventFields(ev *Event) ([]field, error) {
	hashes := field{"block_hashes", false, false, func(w *writer) error { w.hashes(ev.BlockHashes); return nil }}
	medium := optStr("medium", false, ev.Medium)
	group := optInt("group_idx", true, ev.GroupIdx)
	locality := optStr("locality", true, ev.Locality)
	ownership := optStr("ownership", true, ev.Ownership)
	switch ev.Type {
	case TypeBlockStored:
		return []field{
			hashes,
			{"parent_block_hash", false, !ev.HasParent, func(w *writer) error {
				if ev.HasParent {
					w.hash(ev.ParentBlockHash)
				} else {
					w.nil()
				}
				return nil
			}},
			{"token_ids", false, false, func(w *writer) error {
				w.arrayHeader(len(ev.TokenIDs))
				for _, t := range ev.TokenIDs {
					w.uint(uint64(t))
				}
				return nil
			}},
			{"block_size", false, false, func(w *writer) error { w.int(int64(ev.BlockSize)); return nil }},
			optInt("lora_id", false, ev.LoraID),
			medium,
			optStr("lora_name", false, ev.LoraName),
			{"extra_keys", true, ev.ExtraKeys == nil, func(w *writer) error { return w.extraKeys(ev.ExtraKeys) }},
			group,
			optStr("kv_cache_spec_kind", true, ev.KVCacheSpecKind),
			optInt("kv_cache_spec_sliding_window", true, ev.KVCacheSpecSlidingWindow),
			locality,
			ownership,
			optStr("session_id", true, ev.SessionID),
		}, nil
	case TypeBlockRemoved:
		return []field{hashes, medium, group, locality, ownership}, nil
	case TypeAllBlocksCleared:
		return nil, nil
	}
	return nil, fmt.Errorf("kvevents: cannot encode an event of unknown type %q", ev.TypeName)
}

func optStr(name string, hasDefault bool, v string) field {
	return field{name, hasDefault, v == "", func(w *writer) error {
		if v == "" {
			w.nil()
		} else {
			w.str(v)
		}
		return nil
	}}
}

func optInt(name string, hasDefault bool, v OptInt) field {
	return field{name, hasDefault, !v.Valid, func(w *writer) error {
		if v.Valid {
			w.int(v.Value)
		} else {
			w.nil()
		}
		return nil
	}}
}

func (w *writer) nil() { w.b = append(w.b, mpNil) }

func (w *writer) arrayHeader(n int) {
	switch {
	case n <= 15:
		w.b = append(w.b, 0x90|byte(n))
	case n <= math.MaxUint16:
		w.b = append(w.b, mpArray16, byte(n>>8), byte(n))
	default:
		w.b = append(w.b, mpArray32)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(n))
	}
}

func (w *writer) mapHeader(n int) {
	switch {
	case n <= 15:
		w.b = append(w.b, 0x80|byte(n))
	case n <= math.MaxUint16:
		w.b = append(w.b, mpMap16, byte(n>>8), byte(n))
	default:
		w.b = append(w.b, mpMap32)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(n))
	}
}

func (w *writer) str(s string) {
	n := len(s)
	switch {
	case n <= 31:
		w.b = append(w.b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		w.b = append(w.b, mpStr8, byte(n))
	case n <= math.MaxUint16:
		w.b = append(w.b, mpStr16, byte(n>>8), byte(n))
	default:
		w.b = append(w.b, mpStr32)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(n))
	}
	w.b = append(w.b, s...)
}

func (w *writer) bin(p []byte) {
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		w.b = append(w.b, mpBin8, byte(n))
	case n <= math.MaxUint16:
		w.b = append(w.b, mpBin16, byte(n>>8), byte(n))
	default:
		w.b = append(w.b, mpBin32)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(n))
	}
	w.b = append(w.b, p...)
}

func (w *writer) uint(v uint64) {
	switch {
	case v <= 0x7f:
		w.b = append(w.b, byte(v))
	case v <= math.MaxUint8:
		w.b = append(w.b, mpUint8, byte(v))
	case v <= math.MaxUint16:
		w.b = append(w.b, mpUint16, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		w.b = append(w.b, mpUint32)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(v))
	default:
		w.b = append(w.b, mpUint64)
		w.b = binary.BigEndian.AppendUint64(w.b, v)
	}
}

func (w *writer) int(v int64) {
	if v >= 0 {
		w.uint(uint64(v))
		return
	}
	switch {
	case v >= -32:
		w.b = append(w.b, byte(v))
	case v >= math.MinInt8:
		w.b = append(w.b, mpInt8, byte(v))
	case v >= math.MinInt16:
		w.b = append(w.b, mpInt16, byte(uint16(v)>>8), byte(v))
	case v >= math.MinInt32:
		w.b = append(w.b, mpInt32)
		w.b = binary.BigEndian.AppendUint32(w.b, uint32(v))
	default:
		w.b = append(w.b, mpInt64)
		w.b = binary.BigEndian.AppendUint64(w.b, uint64(v))
	}
}

func (w *writer) float64(f float64) {
	w.b = append(w.b, mpFloat64)
	w.b = binary.BigEndian.AppendUint64(w.b, math.Float64bits(f))
}

func (w *writer) hash(h Hash) {
	if h.Raw != "" {
		w.bin([]byte(h.Raw))
	} else {
		w.uint(h.Int)
	}
}

func (w *writer) hashes(hs []Hash) {
	w.arrayHeader(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *writer) extraKeys(keys [][]any) error {
	w.arrayHeader(len(keys))
	for _, k := range keys {
		if k == nil {
			w.nil()
			continue
		}
		if err := w.value(k, MaxDepth); err != nil {
			return err
		}
	}
	return nil
}

// value writes an extra-key value: nil, bool, integers, float64, string,
// []byte or []any.
func (w *writer) value(v any, depth int) error {
	if depth <= 0 {
		return fmt.Errorf("kvevents: extra keys nested deeper than %d", MaxDepth)
	}
	switch v := v.(type) {
	case nil:
		w.nil()
	case bool:
		if v {
			w.b = append(w.b, mpTrue)
		} else {
			w.b = append(w.b, mpFalse)
		}
	case int:
		w.int(int64(v))
	case int64:
		w.int(v)
	case uint64:
		w.uint(v)
	case float64:
		w.float64(v)
	case string:
		w.str(v)
	case []byte:
		w.bin(v)
	case []any:
		w.arrayHeader(len(v))
		for _, item := range v {
			if err := w.value(item, depth-1); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("kvevents: cannot encode extra key of type %T", v)
	}
	return nil
}
