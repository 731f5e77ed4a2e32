package index

import (
	"runtime"
	"testing"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
)

// ingestPayloads builds msgpack batches of chained 16-block BlockStored
// runs (16-token blocks), each batch followed later by the removal of an
// older run, as a busy engine publishes them.
func ingestPayloads(b *testing.B, runs int) [][]byte {
	x := uint64(0x9e3779b97f4a7c15)
	next := func() uint64 { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x }
	var payloads [][]byte
	var hashes [][]kvevents.Hash
	for r := 0; r < runs; r++ {
		ev := kvevents.Event{Type: kvevents.TypeBlockStored, BlockSize: 16, Medium: "GPU", GroupIdx: kvevents.Some(0), KVCacheSpecKind: "full_attention"}
		if r%4 != 0 { // chained to the previous run
			prev := hashes[len(hashes)-1]
			ev.ParentBlockHash, ev.HasParent = prev[len(prev)-1], true
		}
		for i := 0; i < 16; i++ {
			ev.BlockHashes = append(ev.BlockHashes, kvevents.IntHash(next()))
			ev.ExtraKeys = append(ev.ExtraKeys, nil)
			for j := 0; j < 16; j++ {
				ev.TokenIDs = append(ev.TokenIDs, uint32(next()%151000))
			}
		}
		hashes = append(hashes, ev.BlockHashes)
		batch := kvevents.Batch{TS: 1, Events: []kvevents.Event{ev}, DataParallelRank: kvevents.Some(0)}
		if r >= 64 && r%4 == 3 { // remove four old runs, children first
			for k := r - 61; k >= r-64; k-- {
				old := hashes[k]
				for i := len(old) - 1; i >= 0; i-- {
					batch.Events = append(batch.Events, kvevents.Event{Type: kvevents.TypeBlockRemoved, BlockHashes: []kvevents.Hash{old[i]}, Medium: "GPU", GroupIdx: kvevents.Some(0)})
				}
			}
		}
		p, err := kvevents.Encode(&batch, kvevents.LayoutMap)
		if err != nil {
			b.Fatal(err)
		}
		payloads = append(payloads, p)
	}
	return payloads
}

// BenchmarkIngest is the sidecar's per-block cost: decode, resolve the
// parent, compute canonical keys, update the map and the summary; with a
// steady state of stores and removals. Target: ≥ 1M blocks/s on one core.
func BenchmarkIngest(b *testing.B) {
	payloads := ingestPayloads(b, 4096)
	var dec kvevents.Decoder
	var batch kvevents.Batch
	blocks := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cfg := DefaultConfig()
		cfg.Model = "m"
		x, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		for n, p := range payloads {
			if n%64 == 63 { // deltas, as the sidecar takes them every interval
				x.Summary(tier.GPU).TakeDelta()
			}
			if err := dec.Decode(p, &batch); err != nil {
				b.Fatal(err)
			}
			for j := range batch.Events {
				if err := x.Apply(&batch.Events[j]); err != nil {
					b.Fatal(err)
				}
				blocks += len(batch.Events[j].BlockHashes)
			}
		}
		if i == 0 {
			b.Logf("%d blocks indexed at the end, %d stored, %d removed", x.Blocks(tier.GPU), x.Stats().StoredBlocks, x.Stats().RemovedBlocks)
		}
	}
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkMemoryPerBlock indexes 262,144 blocks into an index whose
// summary is sized for them and reports the bytes held per cached block
// (map and summary), deltas being taken as the sidecar takes them.
// Target: ≤ 64 bytes.
func BenchmarkMemoryPerBlock(b *testing.B) {
	const n = 1 << 18
	for i := 0; i < b.N; i++ {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		cfg := DefaultConfig()
		cfg.Model, cfg.Params = "m", summary.ForCapacity(n)
		x, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		ev := kvevents.Event{Type: kvevents.TypeBlockStored, BlockSize: 1, Medium: "GPU"}
		for k := 0; k < n; k += 256 {
			ev.BlockHashes, ev.TokenIDs, ev.HasParent = ev.BlockHashes[:0], ev.TokenIDs[:0], false
			for j := 0; j < 256; j++ {
				ev.BlockHashes = append(ev.BlockHashes, kvevents.IntHash(uint64(k+j)*0x9e3779b97f4a7c15+1))
				ev.TokenIDs = append(ev.TokenIDs, uint32(k+j))
			}
			if err := x.Apply(&ev); err != nil {
				b.Fatal(err)
			}
			x.Summary(tier.GPU).TakeDelta() // as the sidecar does every delta interval
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if x.Blocks(tier.GPU) != n {
			b.Fatalf("%d blocks", x.Blocks(tier.GPU))
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/block")
		runtime.KeepAlive(x)
	}
}
