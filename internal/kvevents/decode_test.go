package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

// build writes msgpack with the package's writer, for hand-made payloads.
func build(f func(w *writer)) []byte {
	var w writer
	f(&w)
	return w.b
}

func storedEvent(blocks, blockSize int, parent bool) Event {
	ev := Event{
		Type:            TypeBlockStored,
		BlockSize:       blockSize,
		Medium:          MediumGPU,
		GroupIdx:        Some(0),
		KVCacheSpecKind: "full_attention",
	}
	for i := 0; i < blocks; i++ {
		ev.BlockHashes = append(ev.BlockHashes, IntHash(uint64(i)*0x9e3779b97f4a7c15))
		ev.ExtraKeys = append(ev.ExtraKeys, nil)
		for j := 0; j < blockSize; j++ {
			ev.TokenIDs = append(ev.TokenIDs, uint32(i*1000+j*37))
		}
	}
	if parent {
		ev.ParentBlockHash, ev.HasParent = IntHash(math.MaxUint64-7), true
	}
	return ev
}

func TestRoundTripAllFields(t *testing.T) {
	full := storedEvent(3, 4, true)
	full.LoraID = Some(7)
	full.LoraName = "Alice"
	full.ExtraKeys = [][]any{{"Alice", "salt"}, {"Alice", []any{"mm-hash", int64(-3)}}, {"Alice", []byte{1, 2, 3}, true, 1.5, uint64(math.MaxUint64)}}
	full.KVCacheSpecSlidingWindow = Some(4096)
	full.Locality = "LOCAL"
	full.Ownership = "tier-1"
	full.SessionID = "sess"
	full.Medium = MediumStorage
	raw := storedEvent(1, 2, false)
	raw.BlockHashes = []Hash{RawHash(bytes.Repeat([]byte{0xab}, 32))}
	raw.ParentBlockHash, raw.HasParent = RawHash([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}), true
	removed := Event{Type: TypeBlockRemoved, BlockHashes: []Hash{IntHash(1), IntHash(1 << 63)}, Medium: MediumCPU, GroupIdx: Some(2), Locality: "REMOTE", Ownership: "o"}
	minimal := Event{Type: TypeBlockRemoved, BlockHashes: []Hash{IntHash(5)}}
	for _, layout := range []Layout{LayoutMap, LayoutArray} {
		for _, rank := range []OptInt{{}, Some(0), Some(3)} {
			in := &Batch{TS: 1.25e9, DataParallelRank: rank, Layout: layout,
				Events: []Event{full, raw, removed, minimal, {Type: TypeAllBlocksCleared}}}
			p, err := Encode(in, layout)
			if err != nil {
				t.Fatal(err)
			}
			out, err := Decode(p)
			if err != nil {
				t.Fatalf("%v: %v", layout, err)
			}
			if !reflect.DeepEqual(in, out) {
				t.Errorf("%v rank %+v: round trip\n got %+v\nwant %+v", layout, rank, out, in)
			}
		}
	}
}

func TestHashForms(t *testing.T) {
	digest, _ := hex.DecodeString("7235f837d217eb40003197e4e27040edecc66c7d7fe49f86f5b600d19aef97ac")
	h := RawHash(digest)
	if h.Int != 17705339885301241772 { // the event form vLLM publishes for this digest
		t.Fatalf("raw digest Int = %d", h.Int)
	}
	// A negative int64 on the wire is taken as its two's complement.
	p := build(func(w *writer) {
		w.arrayHeader(3)
		w.float64(1)
		w.arrayHeader(1)
		w.mapHeader(3)
		w.str("type")
		w.str("BlockRemoved")
		w.str("block_hashes")
		w.arrayHeader(3)
		w.int(-1)
		w.b = append(w.b, mpInt64)
		w.b = append(w.b, 0x80, 0, 0, 0, 0, 0, 0, 0)
		w.bin(digest)
		w.str("medium")
		w.str("GPU")
		w.nil()
	})
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	got := b.Events[0].BlockHashes
	if got[0].Int != math.MaxUint64 || got[1].Int != 1<<63 || got[2] != h {
		t.Fatalf("hashes = %+v", got)
	}
	if b.DataParallelRank.Valid {
		t.Fatalf("nil rank decoded as %+v", b.DataParallelRank)
	}
}

func TestUnknownKeysAndTypes(t *testing.T) {
	p := build(func(w *writer) {
		w.arrayHeader(4) // a fourth, future batch field is skipped
		w.float64(2)
		w.arrayHeader(2)
		w.mapHeader(5)
		w.str("future_field")
		w.mapHeader(1)
		w.str("x")
		w.arrayHeader(3)
		w.int(1)
		w.b = append(w.b, mpFixExt4, 1, 0, 0, 0, 0)
		w.b = append(append(w.b, mpFixExt16, 2), make([]byte, 16)...)
		w.str("block_hashes")
		w.arrayHeader(1)
		w.uint(9)
		w.str("type") // "type" need not come first
		w.str("BlockRemoved")
		w.str("medium")
		w.str("GPU")
		w.str("token_ids") // not a BlockRemoved field: ignored
		w.arrayHeader(1)
		w.uint(1)
		w.mapHeader(2)
		w.str("type")
		w.str("BlockUpdated")
		w.str("block_hashes")
		w.arrayHeader(0)
		w.int(1)
		w.str("extra batch field")
	})
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 2 || b.Events[0].Type != TypeBlockRemoved || b.Events[0].BlockHashes[0].Int != 9 || b.Events[0].TokenIDs != nil {
		t.Fatalf("events = %+v", b.Events)
	}
	if b.Events[1].Type != TypeUnknown || b.Events[1].TypeName != "BlockUpdated" {
		t.Fatalf("unknown event = %+v", b.Events[1])
	}
	if _, err := Encode(b, LayoutMap); err == nil {
		t.Fatal("encoding an unknown event type succeeded")
	}
	// Older array events with fewer fields, and newer ones with more.
	p = build(func(w *writer) {
		w.arrayHeader(2)
		w.float64(3)
		w.arrayHeader(2)
		w.arrayHeader(5)
		w.str("BlockStored")
		w.arrayHeader(1)
		w.uint(1)
		w.nil()
		w.arrayHeader(2)
		w.uint(5)
		w.uint(6)
		w.uint(2)
		w.arrayHeader(8)
		w.str("BlockRemoved")
		w.arrayHeader(1)
		w.uint(1)
		w.str("GPU")
		w.nil()
		w.nil()
		w.nil()
		w.str("future 1")
		w.arrayHeader(0)
	})
	b, err = Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if b.Layout != LayoutArray || b.Events[0].BlockSize != 2 || len(b.Events[0].TokenIDs) != 2 || b.Events[0].Validate() != nil || b.Events[1].Medium != "GPU" {
		t.Fatalf("decoded %+v", b)
	}
}

func TestDecodeErrors(t *testing.T) {
	header := func(w *writer, events int) {
		w.arrayHeader(3)
		w.float64(1)
		w.arrayHeader(events)
	}
	good := build(func(w *writer) {
		header(w, 1)
		w.mapHeader(2)
		w.str("type")
		w.str("AllBlocksCleared")
		w.str("x")
		w.nil()
		w.int(0)
	})
	if _, err := Decode(good); err != nil {
		t.Fatalf("control payload: %v", err)
	}
	cases := map[string][]byte{
		"empty":             {},
		"not an array":      {0x80},
		"one element":       {0x91, 0x00},
		"ts is a string":    build(func(w *writer) { w.arrayHeader(2); w.str("x"); w.arrayHeader(0) }),
		"events not array":  build(func(w *writer) { w.arrayHeader(2); w.float64(1); w.nil() }),
		"huge event count":  {0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"huge array16":      {0x92, 0x00, 0xdc, 0xff, 0xff, 0x80},
		"truncated float":   {0x92, 0xcb, 0x00},
		"trailing bytes":    append(append([]byte{}, good...), 0x00),
		"event not map":     build(func(w *writer) { header(w, 1); w.str("BlockStored"); w.int(0) }),
		"map without type":  build(func(w *writer) { header(w, 1); w.mapHeader(1); w.str("medium"); w.nil(); w.int(0) }),
		"type not string":   build(func(w *writer) { header(w, 1); w.mapHeader(1); w.str("type"); w.int(3); w.int(0) }),
		"key not string":    build(func(w *writer) { header(w, 1); w.mapHeader(1); w.int(1); w.int(3); w.int(0) }),
		"empty event array": build(func(w *writer) { header(w, 1); w.arrayHeader(0); w.int(0) }),
		"stored no hashes":  build(func(w *writer) { header(w, 1); w.mapHeader(1); w.str("type"); w.str("BlockStored"); w.int(0) }),
		"removed no hashes": build(func(w *writer) { header(w, 1); w.arrayHeader(1); w.str("BlockRemoved"); w.int(0) }),
		"mixed layouts": build(func(w *writer) {
			header(w, 2)
			w.arrayHeader(1)
			w.str("AllBlocksCleared")
			w.mapHeader(1)
			w.str("type")
			w.str("AllBlocksCleared")
			w.int(0)
		}),
		"negative token": build(func(w *writer) {
			header(w, 1)
			w.mapHeader(3)
			w.str("type")
			w.str("BlockStored")
			w.str("block_hashes")
			w.arrayHeader(0)
			w.str("token_ids")
			w.arrayHeader(1)
			w.int(-5)
			w.int(0)
		}),
		"token over 32 bits": build(func(w *writer) {
			header(w, 1)
			w.arrayHeader(4)
			w.str("BlockStored")
			w.arrayHeader(0)
			w.nil()
			w.arrayHeader(1)
			w.uint(1 << 40)
			w.int(0)
		}),
		"negative block size": build(func(w *writer) {
			header(w, 1)
			w.arrayHeader(5)
			w.str("BlockStored")
			w.arrayHeader(0)
			w.nil()
			w.arrayHeader(0)
			w.int(-16)
			w.int(0)
		}),
		"hash is a string": build(func(w *writer) {
			header(w, 1)
			w.arrayHeader(2)
			w.str("BlockRemoved")
			w.arrayHeader(1)
			w.str("abc")
			w.int(0)
		}),
		"empty raw hash": build(func(w *writer) {
			header(w, 1)
			w.arrayHeader(2)
			w.str("BlockRemoved")
			w.arrayHeader(1)
			w.bin(nil)
			w.int(0)
		}),
		"extra keys not lists": build(func(w *writer) {
			header(w, 1)
			w.mapHeader(3)
			w.str("type")
			w.str("BlockStored")
			w.str("block_hashes")
			w.arrayHeader(0)
			w.str("extra_keys")
			w.arrayHeader(1)
			w.str("salt")
			w.int(0)
		}),
		"extra keys with a map": build(func(w *writer) {
			header(w, 1)
			w.mapHeader(3)
			w.str("type")
			w.str("BlockStored")
			w.str("block_hashes")
			w.arrayHeader(0)
			w.str("extra_keys")
			w.arrayHeader(1)
			w.arrayHeader(1)
			w.mapHeader(0)
			w.int(0)
		}),
		"extra keys too deep": build(func(w *writer) {
			header(w, 1)
			w.mapHeader(3)
			w.str("type")
			w.str("BlockStored")
			w.str("block_hashes")
			w.arrayHeader(0)
			w.str("extra_keys")
			w.arrayHeader(1)
			for i := 0; i < MaxDepth+1; i++ {
				w.arrayHeader(1)
			}
			w.nil()
			w.int(0)
		}),
		"skipped value too deep": build(func(w *writer) {
			header(w, 1)
			w.mapHeader(2)
			w.str("type")
			w.str("AllBlocksCleared")
			w.str("future")
			for i := 0; i < 100; i++ {
				w.arrayHeader(1)
			}
			w.nil()
			w.int(0)
		}),
		"unknown format in skip": build(func(w *writer) {
			header(w, 1)
			w.mapHeader(2)
			w.str("type")
			w.str("AllBlocksCleared")
			w.str("future")
			w.b = append(w.b, 0xc1)
			w.int(0)
		}),
		"rank is a string": build(func(w *writer) { header(w, 0); w.str("0") }),
		"string past end":  {0x92, 0x00, 0x91, 0x81, 0xdb, 0xff, 0xff, 0xff, 0xff},
		"bin past end": build(func(w *writer) {
			header(w, 1)
			w.arrayHeader(2)
			w.str("BlockRemoved")
			w.arrayHeader(1)
			w.b = append(w.b, mpBin32, 0x7f, 0xff, 0xff, 0xff)
		}),
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			var d Decoder
			b := &Batch{TS: 9, Events: []Event{{}}}
			err := d.Decode(p, b)
			if err == nil {
				t.Fatalf("decoded %x without error: %+v", p, b)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("error %v does not wrap ErrMalformed", err)
			}
			if !reflect.DeepEqual(*b, Batch{}) {
				t.Errorf("batch not reset after error: %+v", b)
			}
		})
	}
}

func TestMaxPayload(t *testing.T) {
	ev := storedEvent(4, 16, false)
	p, err := Encode(&Batch{TS: 1, Events: []Event{ev}, DataParallelRank: Some(0)}, LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	d := Decoder{MaxPayload: len(p) - 1}
	var b Batch
	if err := d.Decode(p, &b); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversized payload: %v", err)
	}
	d.MaxPayload = len(p)
	if err := d.Decode(p, &b); err != nil {
		t.Fatal(err)
	}
}

// TestHostileLengthsAllocateLittle: lengths claimed by the wire never size an
// allocation beyond the bytes actually present.
func TestHostileLengthsAllocateLittle(t *testing.T) {
	hostile := [][]byte{
		{0x93, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00},
		{0x93, 0x00, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff},
		{0x93, 0x00, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0xdd, 0x7f, 0xff, 0xff, 0xff},
		{0x93, 0x00, 0x91, 0x82, 0xa4, 't', 'y', 'p', 'e', 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0xaa, 'e', 'x', 't', 'r', 'a', '_', 'k', 'e', 'y', 's', 0xdd, 0x7f, 0xff, 0xff, 0xff},
	}
	for _, p := range hostile {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := 0; i < 100; i++ {
			if _, err := Decode(p); err == nil {
				t.Fatalf("decoded hostile %x", p)
			}
		}
		runtime.ReadMemStats(&after)
		if per := (after.TotalAlloc - before.TotalAlloc) / 100; per > 4096 {
			t.Errorf("%x: %d bytes allocated per decode", p, per)
		}
	}
}

// TestDecoderReuse: a Decoder reuses its buffers, and a batch decoded by
// Decode (package function) is unaffected by later decodes.
func TestDecoderReuse(t *testing.T) {
	p1, _ := Encode(&Batch{TS: 1, Events: []Event{storedEvent(2, 4, false)}}, LayoutMap)
	p2, _ := Encode(&Batch{TS: 2, Events: []Event{storedEvent(3, 8, true), storedEvent(1, 8, false)}}, LayoutArray)
	keep, err := Decode(p1)
	if err != nil {
		t.Fatal(err)
	}
	var d Decoder
	var b Batch
	for i := 0; i < 3; i++ {
		for _, p := range [][]byte{p1, p2} {
			if err := d.Decode(p, &b); err != nil {
				t.Fatal(err)
			}
			for _, ev := range b.Events {
				if err := ev.Validate(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	want, _ := Decode(p1)
	if !reflect.DeepEqual(keep, want) {
		t.Fatal("a batch from Decode changed after later decodes")
	}
}

func TestValidate(t *testing.T) {
	ok := storedEvent(2, 4, false)
	short := storedEvent(2, 4, false)
	short.TokenIDs = short.TokenIDs[:7]
	zeroBlock := storedEvent(2, 4, false)
	zeroBlock.BlockSize = 0
	extra := storedEvent(2, 4, false)
	extra.ExtraKeys = extra.ExtraKeys[:1]
	placeholder := Event{Type: TypeBlockStored, BlockHashes: []Hash{IntHash(1)}, TokenIDs: []uint32{}}
	cases := []struct {
		name string
		ev   Event
		ok   bool
	}{
		{"ok", ok, true},
		{"placeholder", placeholder, true},
		{"short tokens", short, false},
		{"zero block size with tokens", zeroBlock, false},
		{"extra keys count", extra, false},
		{"stored no hashes", Event{Type: TypeBlockStored}, false},
		{"removed no hashes", Event{Type: TypeBlockRemoved}, false},
		{"cleared", Event{Type: TypeAllBlocksCleared}, true},
	}
	for _, c := range cases {
		if err := c.ev.Validate(); (err == nil) != c.ok {
			t.Errorf("%s: Validate() = %v", c.name, err)
		}
	}
	if !placeholder.Placeholder() || ok.Placeholder() {
		t.Error("Placeholder() wrong")
	}
}

func TestLayoutNames(t *testing.T) {
	for _, l := range []Layout{LayoutMap, LayoutArray} {
		if got, err := ParseLayout(l.String()); err != nil || got != l {
			t.Errorf("ParseLayout(%q) = %v, %v", l, got, err)
		}
	}
	if _, err := ParseLayout("tuple"); err == nil {
		t.Error("ParseLayout accepted tuple")
	}
	for _, typ := range []EventType{TypeBlockStored, TypeBlockRemoved, TypeAllBlocksCleared} {
		if eventType([]byte(typ.String())) != typ {
			t.Errorf("type %v does not round-trip", typ)
		}
	}
	if IntHash(42).String() != "42" || RawHash([]byte{0xab, 0xcd}).String() != "abcd" || RawHash([]byte{0xab, 0xcd}).Int != 0xabcd {
		t.Error("Hash formatting")
	}
}
