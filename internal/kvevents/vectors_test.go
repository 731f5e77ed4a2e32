package kvevents

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/test/vectors"
)

// norm turns a decoded JSON value (json.Number numbers) into a comparable
// form: integers as decimal strings, other numbers as float64.
func norm(v any) any {
	switch v := v.(type) {
	case json.Number:
		if _, err := strconv.ParseUint(string(v), 10, 64); err == nil {
			return string(v)
		}
		if _, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return string(v)
		}
		f, _ := v.Float64()
		return f
	case []any:
		out := make([]any, len(v))
		for i := range v {
			out[i] = norm(v[i])
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			out[k] = norm(x)
		}
		return out
	}
	return v
}

// generic renders a decoded field in the same comparable form.
func generic(ev *Event, name string) any {
	str := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	optInt := func(o OptInt) any {
		if !o.Valid {
			return nil
		}
		return strconv.FormatInt(o.Value, 10)
	}
	hash := func(h Hash) any { return strconv.FormatUint(h.Int, 10) }
	switch name {
	case "type":
		return ev.Type.String()
	case "block_hashes":
		out := []any{}
		for _, h := range ev.BlockHashes {
			out = append(out, hash(h))
		}
		return out
	case "parent_block_hash":
		if !ev.HasParent {
			return nil
		}
		return hash(ev.ParentBlockHash)
	case "token_ids":
		out := []any{}
		for _, t := range ev.TokenIDs {
			out = append(out, strconv.FormatUint(uint64(t), 10))
		}
		return out
	case "block_size":
		return strconv.Itoa(ev.BlockSize)
	case "lora_id":
		return optInt(ev.LoraID)
	case "medium":
		return str(ev.Medium)
	case "lora_name":
		return str(ev.LoraName)
	case "extra_keys":
		if ev.ExtraKeys == nil {
			return nil
		}
		out := []any{}
		for _, k := range ev.ExtraKeys {
			if k == nil {
				out = append(out, nil)
			} else {
				out = append(out, fmt.Sprint(k))
			}
		}
		return out
	case "group_idx":
		return optInt(ev.GroupIdx)
	case "kv_cache_spec_kind":
		return str(ev.KVCacheSpecKind)
	}
	return fmt.Sprintf("unexpected field %q", name)
}

func TestDecodeVectors(t *testing.T) {
	batches, _, _, err := vectors.EventBatches()
	if err != nil {
		t.Fatal(err)
	}
	for i, vb := range batches {
		t.Run(vb.Name, func(t *testing.T) {
			b, err := Decode(vb.Payload)
			if err != nil {
				t.Fatal(err)
			}
			want := norm(vb.Decoded).([]any)
			if b.TS != want[0].(float64) {
				t.Errorf("ts = %v, want %v", b.TS, want[0])
			}
			if !b.DataParallelRank.Valid || strconv.FormatInt(b.DataParallelRank.Value, 10) != want[2] {
				t.Errorf("data_parallel_rank = %+v, want %v", b.DataParallelRank, want[2])
			}
			wantLayout := LayoutMap
			if i == 1 {
				wantLayout = LayoutArray
			}
			if b.Layout != wantLayout {
				t.Errorf("layout = %v, want %v", b.Layout, wantLayout)
			}
			wantEvents := want[1].([]any)
			if len(b.Events) != len(wantEvents) {
				t.Fatalf("%d events, want %d", len(b.Events), len(wantEvents))
			}
			for j, we := range wantEvents {
				ev := &b.Events[j]
				if err := ev.Validate(); err != nil {
					t.Errorf("event %d: %v", j, err)
				}
				fields := map[string]any{}
				switch we := we.(type) {
				case map[string]any:
					fields = we
				case []any:
					fields["type"] = we[0]
					names := storedFields
					if we[0] == "BlockRemoved" {
						names = removedFields
					}
					for k, v := range we[1:] {
						fields[names[k]] = v
					}
				}
				for name, wv := range fields {
					got := generic(ev, name)
					if name == "extra_keys" && wv != nil {
						// compare nil-ness per block
						ws := wv.([]any)
						gs := got.([]any)
						if len(ws) != len(gs) {
							t.Errorf("event %d extra_keys: %v, want %v", j, gs, ws)
						}
						continue
					}
					if !reflect.DeepEqual(got, wv) {
						t.Errorf("event %d %s = %v, want %v", j, name, got, wv)
					}
				}
			}
		})
	}
}

// TestEncodeVectors re-encodes the decoded samples: the bytes must equal the
// vectors, so the encoder writes what msgspec writes.
func TestEncodeVectors(t *testing.T) {
	batches, topic, seq, err := vectors.EventBatches()
	if err != nil {
		t.Fatal(err)
	}
	for _, vb := range batches {
		b, err := Decode(vb.Payload)
		if err != nil {
			t.Fatal(err)
		}
		out, err := Encode(b, b.Layout)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, vb.Payload) {
			t.Errorf("%s: re-encoded\n%x\nwant\n%x", vb.Name, out, vb.Payload)
		}
		// The live frames around it.
		m := Message{Topic: []byte(topic), Seq: 0, Payload: out}
		frames := m.Frames()
		if !bytes.Equal(frames[1], seq) {
			t.Errorf("seq frame %x, want %x", frames[1], seq)
		}
		back, err := ParseMessage(frames)
		if err != nil || string(back.Topic) != topic || back.Seq != 0 || !bytes.Equal(back.Payload, vb.Payload) {
			t.Errorf("ParseMessage = %+v, %v", back, err)
		}
	}
}

// TestLayoutsCarrySameEvents: the map and the array samples decode to the
// same events, and each converts into the other byte for byte.
func TestLayoutsCarrySameEvents(t *testing.T) {
	batches, _, _, err := vectors.EventBatches()
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(batches[0].Payload)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Decode(batches[1].Payload)
	if err != nil {
		t.Fatal(err)
	}
	a.Layout = LayoutMap
	if !reflect.DeepEqual(m, a) {
		t.Fatalf("layouts decode differently:\n%+v\n%+v", m, a)
	}
	asArray, err := Encode(m, LayoutArray)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(asArray, batches[1].Payload) {
		t.Errorf("map→array\n%x\nwant\n%x", asArray, batches[1].Payload)
	}
}
