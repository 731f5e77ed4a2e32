package summary

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
)

func TestDeltaCodec(t *testing.T) {
	p := ForCapacity(1000)
	for _, d := range []Delta{
		{Seq: 1, Flips: nil},
		{Seq: 2, Flips: []uint32{0}},
		{Seq: 1 << 40, Flips: []uint32{0, 1, 2, 511, 512, p.M - 1}},
	} {
		b := AppendDelta(nil, d)
		got, err := DecodeDelta(b, p)
		if err != nil || got.Seq != d.Seq || !slices.Equal(got.Flips, d.Flips) {
			t.Fatalf("%+v → %+v, %v", d, got, err)
		}
	}
	bad := map[string][]byte{
		"empty":         {},
		"version":       {2, 1, 0},
		"no seq":        {1},
		"count too big": {1, 1, 0xff, 0x01},
		"beyond m":      AppendDelta(nil, Delta{Seq: 1, Flips: []uint32{p.M}}),
		"trailing":      append(AppendDelta(nil, Delta{Seq: 1, Flips: []uint32{3}}), 0),
		"truncated":     AppendDelta(nil, Delta{Seq: 1, Flips: []uint32{3, 300000}})[:5],
	}
	for name, b := range bad {
		if _, err := DecodeDelta(b, p); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestSnapshotCodec(t *testing.T) {
	p := ForCapacity(4096)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{0, 10, 4096} { // sparse and dense encodings
		c := NewCounting(p)
		for _, k := range randKeys(rng, n) {
			c.Add(k)
		}
		c.TakeDelta()
		s := c.Snapshot()
		b := AppendSnapshot(nil, s)
		got, err := DecodeSnapshot(b, p)
		if err != nil || got.Seq != s.Seq || !slices.Equal(got.Words, s.Words) {
			t.Fatalf("%d keys: %v", n, err)
		}
		if n == 10 && len(b) > 200 {
			t.Errorf("sparse snapshot of 10 keys is %d bytes", len(b))
		}
		if n == 4096 && len(b) > int(p.M/8)+64 {
			t.Errorf("dense snapshot is %d bytes for %d bits", len(b), p.M)
		}
	}
	good := AppendSnapshot(nil, NewCounting(p).Snapshot())
	if _, err := DecodeSnapshot(good, ForCapacity(10)); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("other params: %v", err)
	}
	raw := AppendSnapshot(nil, Snapshot{Params: p, Seq: 3, Words: slices.Repeat([]uint64{^uint64(0)}, int(p.M/64))})
	for name, b := range map[string][]byte{
		"empty":      {},
		"version":    {9},
		"short raw":  raw[:len(raw)-1],
		"long raw":   append(slices.Clone(raw), 0),
		"format":     append(slices.Clone(good[:len(good)-2]), 7, 0),
		"probe long": {1, 0x80, 0x80, 0x04, 8, 0xff, 0x01},
	} {
		if _, err := DecodeSnapshot(b, p); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// FuzzDecodeDelta: any bytes decode to a delta within m or an error; a
// decoded delta re-encodes to the same bytes.
func FuzzDecodeDelta(f *testing.F) {
	p := ForCapacity(1000)
	f.Add(AppendDelta(nil, Delta{Seq: 5, Flips: []uint32{1, 2, 900}}))
	f.Add([]byte{1, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDelta(b, p)
		if err != nil {
			return
		}
		for i, pos := range d.Flips {
			if pos >= p.M || (i > 0 && pos <= d.Flips[i-1]) {
				t.Fatalf("decoded flips %v", d.Flips)
			}
		}
		if again, err := DecodeDelta(AppendDelta(nil, d), p); err != nil || !slices.Equal(again.Flips, d.Flips) || again.Seq != d.Seq {
			t.Fatal("delta does not round-trip")
		}
	})
}

// FuzzDecodeSnapshot: any bytes decode to a snapshot of the wanted
// parameters or an error; a decoded snapshot round-trips and applies deltas.
func FuzzDecodeSnapshot(f *testing.F) {
	p := ForCapacity(100)
	c := NewCounting(p)
	c.Add(blockkey.Key(42))
	c.TakeDelta()
	f.Add(AppendSnapshot(nil, c.Snapshot()))
	f.Add(AppendSnapshot(nil, NewCounting(p).Snapshot()))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeSnapshot(b, p)
		if err != nil {
			return
		}
		if len(s.Words) != int(p.M/64) {
			t.Fatalf("%d words", len(s.Words))
		}
		again, err := DecodeSnapshot(AppendSnapshot(nil, s), p)
		if err != nil || !slices.Equal(again.Words, s.Words) {
			t.Fatal("snapshot does not round-trip")
		}
		if err := s.Apply(Delta{Seq: s.Seq + 1, Flips: []uint32{0}}); err != nil {
			t.Fatal(err)
		}
	})
}
