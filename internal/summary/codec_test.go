package summary

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
)

func TestDeltaCodec(t *testing.T) {
	p := ForCapacity(1000)
	rng := rand.New(rand.NewPCG(3, 4))
	var dense []uint32 // every position: the largest delta there is
	for pos := uint32(0); pos < p.M; pos++ {
		dense = append(dense, pos)
	}
	var random []uint32
	for pos := uint32(0); pos < p.M; pos++ {
		if rng.IntN(37) == 0 {
			random = append(random, pos)
		}
	}
	for _, d := range []Delta{
		{Seq: 1, Flips: nil},
		{Seq: 2, Flips: []uint32{0}},
		{Seq: 1 << 40, Flips: []uint32{0, 1, 2, 511, 512, p.M - 1}},
		{Seq: 3, Flips: []uint32{p.M - 1}},
		{Seq: 4, Flips: dense},
		{Seq: 5, Flips: random},
	} {
		b := AppendDelta(nil, d)
		got, err := DecodeDelta(b, d.Seq, p)
		if err != nil || got.Seq != d.Seq || !slices.Equal(got.Flips, d.Flips) {
			t.Fatalf("%d flips → %d, %v", len(d.Flips), len(got.Flips), err)
		}
	}
	// A delta for the largest summary there is: row gaps need the widest
	// Rice parameter.
	big := Params{M: 1 << 31, K: DefaultK, Probe: ProbeV1}
	far := Delta{Seq: 9, Flips: []uint32{3, big.M - 1}}
	if got, err := DecodeDelta(AppendDelta(nil, far), 9, big); err != nil || !slices.Equal(got.Flips, far.Flips) {
		t.Fatalf("far rows: %v, %v", got.Flips, err)
	}
	one := AppendDelta(nil, Delta{Flips: []uint32{3}})
	bad := map[string][]byte{
		"empty":           {},
		"version":         {1, 0},
		"no rows count":   {2},
		"rows beyond m":   {2, 9, 0, 0xff, 0xff},
		"no parameters":   {2, 1},
		"offset param":    {2, 1, 0x0a, 0xff},
		"beyond m":        AppendDelta(nil, Delta{Flips: []uint32{p.M}}),
		"trailing":        append(slices.Clone(one), 0),
		"empty trailing":  {2, 0, 0},
		"truncated":       AppendDelta(nil, Delta{Flips: []uint32{3, 3000, 3001, 3900}})[:5],
		"padding":         append(slices.Clone(one[:len(one)-1]), one[len(one)-1]|0x80),
		"unary too long":  {2, 1, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},
		"count too large": {2, 1, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00},
	}
	for name, b := range bad {
		if _, err := DecodeDelta(b, 1, p); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestDeltaBytesPerBlock pins the code's efficiency at the operating
// point: a full summary where each delta carries the flips of 10 stored and
// 10 evicted blocks must cost at most 8 bytes a block, and a block's flips
// must cost well under the 2 bytes a flip of plain varint gaps.
func TestDeltaBytesPerBlock(t *testing.T) {
	const capacity = 65536
	p := ForCapacity(capacity)
	c := NewCounting(p)
	rng := rand.New(rand.NewPCG(5, 6))
	held := randKeys(rng, capacity)
	for _, k := range held {
		c.Add(k)
	}
	c.TakeDelta()
	bytes, blocks, flips := 0, 0, 0
	for round := 0; round < 2000; round++ {
		for i := 0; i < 10; i++ {
			j := rng.IntN(len(held))
			c.Remove(held[j])
			held[j] = blockkey.Key(rng.Uint64())
			c.Add(held[j])
			blocks += 2
		}
		d, ok := c.TakeDelta()
		if !ok {
			continue
		}
		b := AppendDelta(nil, d)
		bytes += len(b)
		flips += len(d.Flips)
		got, err := DecodeDelta(b, d.Seq, p)
		if err != nil || !slices.Equal(got.Flips, d.Flips) {
			t.Fatal("delta does not round-trip", err)
		}
	}
	perBlock, perFlip := float64(bytes)/float64(blocks), float64(bytes)/float64(flips)
	t.Logf("%.2f bytes a block, %.2f flips a block, %.2f bytes a flip", perBlock, float64(flips)/float64(blocks), perFlip)
	if perBlock > 8 || perFlip > 1.6 {
		t.Fatalf("%.2f bytes a block (%.2f a flip): the delta code regressed", perBlock, perFlip)
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
// decoded delta re-encodes to the same flips.
func FuzzDecodeDelta(f *testing.F) {
	p := ForCapacity(1000)
	f.Add(AppendDelta(nil, Delta{Seq: 5, Flips: []uint32{1, 2, 900, 15000}}))
	f.Add([]byte{2, 1, 0x33, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDelta(b, 5, p)
		if err != nil {
			return
		}
		for i, pos := range d.Flips {
			if pos >= p.M || (i > 0 && pos <= d.Flips[i-1]) {
				t.Fatalf("decoded flips %v", d.Flips)
			}
		}
		if again, err := DecodeDelta(AppendDelta(nil, d), d.Seq, p); err != nil || !slices.Equal(again.Flips, d.Flips) {
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

// TestDeltaDecodeAllocation: a long run of zero bits (hostile padding of a
// row gap) costs no allocation proportional to its length before failing.
func TestDeltaDecodeAllocation(t *testing.T) {
	p := Params{M: 1 << 31, K: DefaultK, Probe: ProbeV1}
	b := make([]byte, 1<<20)
	b[0], b[1] = 2, 1
	allocs := testing.AllocsPerRun(3, func() {
		if _, err := DecodeDelta(b, 1, p); err == nil {
			t.Fatal("decoded a megabyte of zeros")
		}
	})
	var ms1, ms2 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	_, _ = DecodeDelta(b, 1, p)
	runtime.ReadMemStats(&ms2)
	if grew := ms2.TotalAlloc - ms1.TotalAlloc; grew > 1<<16 {
		t.Fatalf("decoding %d hostile bytes allocated %d bytes (%v allocations)", len(b), grew, allocs)
	}
}

// TestSnapshotEncodeAllocatesOnce: encoding a full snapshot into nil
// allocates its buffer once, not grown as it fills (a sidecar encodes
// one for every picker that syncs).
func TestSnapshotEncodeAllocatesOnce(t *testing.T) {
	p := ForCapacity(65536)
	rng := rand.New(rand.NewPCG(3, 4))
	c := NewCounting(p)
	for _, k := range randKeys(rng, 65536) {
		c.Add(k)
	}
	c.TakeDelta()
	s := c.Snapshot()
	var ms1, ms2 runtime.MemStats
	runtime.ReadMemStats(&ms1)
	b := AppendSnapshot(nil, s)
	runtime.ReadMemStats(&ms2)
	// One buffer; under the race detector, whose instrumentation of
	// slices.Grow allocates a temporary of the same size, two. Grown as it
	// filled, the encoder allocated five times the snapshot.
	bound := uint64(len(b)) + uint64(len(b))/8
	if raceEnabled {
		bound *= 2
	}
	if grew := ms2.TotalAlloc - ms1.TotalAlloc; grew > bound {
		t.Fatalf("encoding a snapshot of %d bytes allocated %d bytes", len(b), grew)
	}
}
