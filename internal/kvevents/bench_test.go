package kvevents

import (
	"testing"
)

// benchBatch returns a batch of events BlockStored events, each a run of 16
// blocks of blockSize tokens with vocabulary-sized token ids and 64-bit
// hashes, as vLLM publishes them.
func benchBatch(events, blockSize int) *Batch {
	b := &Batch{TS: 1.7e9, DataParallelRank: Some(0)}
	x := uint64(0x9e3779b97f4a7c15)
	next := func() uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x }
	for e := 0; e < events; e++ {
		ev := Event{Type: TypeBlockStored, BlockSize: blockSize, Medium: MediumGPU,
			GroupIdx: Some(0), KVCacheSpecKind: "full_attention"}
		if e > 0 {
			ev.ParentBlockHash, ev.HasParent = IntHash(next()), true
		}
		for i := 0; i < 16; i++ {
			ev.BlockHashes = append(ev.BlockHashes, IntHash(next()|1<<63))
			ev.ExtraKeys = append(ev.ExtraKeys, nil)
			for j := 0; j < blockSize; j++ {
				ev.TokenIDs = append(ev.TokenIDs, uint32(next()%151_000))
			}
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

// BenchmarkDecodeBlockStored decodes batches of 16-block BlockStored runs
// (16-token blocks) with a reused Decoder, as the sidecar does. The target
// is ≥ 1M blocks/s per core.
func BenchmarkDecodeBlockStored(b *testing.B) {
	for _, layout := range []Layout{LayoutMap, LayoutArray} {
		b.Run(layout.String(), func(b *testing.B) {
			p, err := Encode(benchBatch(8, 16), layout)
			if err != nil {
				b.Fatal(err)
			}
			var d Decoder
			var batch Batch
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := d.Decode(p, &batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*8*16)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// BenchmarkDecodeFresh decodes with the allocating package-level Decode.
func BenchmarkDecodeFresh(b *testing.B) {
	p, err := Encode(benchBatch(8, 16), LayoutMap)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Decode(p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*8*16)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkEncodeBlockStored measures the encoder the simulated engine uses.
func BenchmarkEncodeBlockStored(b *testing.B) {
	batch := benchBatch(8, 16)
	var buf []byte
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var err error
		if buf, err = AppendBatch(buf[:0], batch, LayoutMap); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*8*16)/b.Elapsed().Seconds(), "blocks/s")
}
