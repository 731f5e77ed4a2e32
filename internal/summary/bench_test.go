package summary

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// BenchmarkAddRemove is the summary's share of the sidecar's ingest cost:
// one key counted in and one out per iteration, on a summary at capacity,
// with a delta taken every 1,024 iterations (≈ every 10 ms at 100k blocks/s).
func BenchmarkAddRemove(b *testing.B) {
	p := ForCapacity(65536)
	c := NewCounting(p)
	rng := rand.New(rand.NewPCG(1, 1))
	keys := randKeys(rng, 65536)
	for _, k := range keys {
		c.Add(k)
	}
	fresh := randKeys(rng, 1<<16)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		j := i & (1<<16 - 1)
		c.Add(fresh[j])
		c.Remove(keys[j])
		keys[j], fresh[j] = fresh[j], keys[j]
		if i%1024 == 1023 { // a delta every 1,024 stores and removals
			c.TakeDelta()
		}
	}
}

// fleetBench fills a fleet of n endpoints, each holding 16,384 blocks of
// its own; holders of them (all when holders ≥ n) also hold a prefix, at a
// random depth, of each of 16 request chains of depth keys. With shared >
// 0, every endpoint also holds the chains' first shared keys (a system
// prompt every replica has).
func fleetBench(b *testing.B, n, depth, holders int, shared ...int) (*Fleet, [][]blockkey.Key) {
	rng := rand.New(rand.NewPCG(5, 5))
	p := ForCapacity(65536)
	f, err := NewFleet(p, n)
	if err != nil {
		b.Fatal(err)
	}
	chains := make([][]blockkey.Key, 16)
	for i := range chains {
		chains[i] = randKeys(rng, depth)
	}
	for e := 0; e < n; e++ {
		c := NewCounting(p)
		for _, k := range randKeys(rng, 16384) {
			c.Add(k)
		}
		for _, sh := range shared {
			for _, chain := range chains {
				for _, k := range chain[:sh] {
					c.Add(k)
				}
			}
		}
		if e < holders {
			for _, chain := range chains {
				for _, k := range chain[:rng.IntN(depth+1)] {
					c.Add(k)
				}
			}
		}
		c.TakeDelta()
		if err := f.SetSnapshot(e, 1, c.Snapshot()); err != nil {
			b.Fatal(err)
		}
	}
	return f, chains
}

// BenchmarkFleetMatch is the picker's lookup: every endpoint's matched
// length for a request's key chain, with p50/p99 over the lookups.
// Targets: 8k tokens (512 keys) × 64 endpoints p99 ≤ 20 µs; 128k tokens
// (8,192 keys) × 256 endpoints ≤ 500 µs. "all" has every endpoint hold the
// prefix at its own random depth (the worst case for the search); "two"
// has two endpoints hold it, the usual shape of a conversation's traffic;
// "shared" has every endpoint hold a 2k-token system prompt and two hold
// the conversation beyond it at random depths (an agent fleet). The
// 256- and 1,000-endpoint cases are how the lookup grows with a model's
// endpoints (issue 21).
func BenchmarkFleetMatch(b *testing.B) {
	for _, c := range []struct {
		name                             string
		endpoints, keys, holders, shared int
	}{
		{"8k-tokens-64-endpoints-all", 64, 512, 64, 0},
		{"8k-tokens-64-endpoints-two", 64, 512, 2, 0},
		{"8k-tokens-64-endpoints-shared", 64, 512, 2, 128},
		{"128k-tokens-256-endpoints-all", 256, 8192, 256, 0},
		{"128k-tokens-256-endpoints-two", 256, 8192, 2, 0},
		{"128k-tokens-256-endpoints-shared", 256, 8192, 2, 128},
		// Growth with the group's endpoints (issue 21): one model of 1,000.
		{"8k-tokens-256-endpoints-all", 256, 512, 256, 0},
		{"8k-tokens-256-endpoints-two", 256, 512, 2, 0},
		{"8k-tokens-1000-endpoints-all", 1000, 512, 1000, 0},
		{"8k-tokens-1000-endpoints-two", 1000, 512, 2, 0},
		{"8k-tokens-1000-endpoints-shared", 1000, 512, 2, 128},
		{"128k-tokens-1000-endpoints-all", 1000, 8192, 1000, 0},
		{"128k-tokens-1000-endpoints-two", 1000, 8192, 2, 0},
		{"128k-tokens-1000-endpoints-shared", 1000, 8192, 2, 128},
	} {
		b.Run(c.name, func(b *testing.B) {
			f, chains := fleetBench(b, c.endpoints, c.keys, c.holders, c.shared)
			matched := make([]int, f.Slots())
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				f.Match(chains[i%len(chains)], matched)
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1000, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1000, "p99-µs")
		})
	}
}

// BenchmarkFleetSync is a restarted picker's catch-up, sidecars simulated
// in one process: decode 64 endpoints' snapshots of 65,536 blocks each
// (the wire encoding) and load them into a fleet index. Target ≤ 1 s.
func BenchmarkFleetSync(b *testing.B) {
	rng := rand.New(rand.NewPCG(9, 9))
	p := ForCapacity(65536)
	var wire [][]byte
	total := 0
	for e := 0; e < 64; e++ {
		c := NewCounting(p)
		for _, k := range randKeys(rng, 65536) {
			c.Add(k)
		}
		c.TakeDelta()
		w := AppendSnapshot(nil, c.Snapshot())
		total += len(w)
		wire = append(wire, w)
	}
	b.ResetTimer()
	defer func() { b.ReportMetric(float64(total)/64/1024, "KiB/snapshot") }()
	for i := 0; i < b.N; i++ {
		f, err := NewFleet(p, 64)
		if err != nil {
			b.Fatal(err)
		}
		for e, w := range wire {
			s, err := DecodeSnapshot(w, p)
			if err != nil {
				b.Fatal(err)
			}
			if err := f.SetSnapshot(e, 1, s); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkFleetLoad: loading full 65,536-block snapshots into a
// 1,024-slot index (a thousand-endpoint group, 128 MiB): 64 loads into one
// row word one at a time (SnapshotLoad.Step, each load a pass over every
// row), the same 64 as one LoadBatch (one lap), and all 1,024 slots as
// one LoadBatch, stepped as the picker's loader steps them (1,024 column
// words a step: the words over the row words with loads). Each step is
// prepared (the transposes) and committed (the index written: what the
// picker holds its lock for); the commits' median and 99th percentile
// are reported. The batches are what a restarted picker's loader does
// with the snapshots that arrive together.
func BenchmarkFleetLoad(b *testing.B) {
	rng := rand.New(rand.NewPCG(9, 10))
	p := ForCapacity(65536)
	snaps := make([]Snapshot, 64)
	for e := range snaps {
		c := NewCounting(p)
		for _, k := range randKeys(rng, 65536) {
			c.Add(k)
		}
		c.TakeDelta()
		snaps[e] = c.Snapshot()
	}
	f, err := NewFleet(p, 1024)
	if err != nil {
		b.Fatal(err)
	}
	// Every slot its own copy: a thousand snapshots in memory at once, as
	// a picker's sync has them (64 shared ones would sit in the cache).
	own := make([]Snapshot, 1024)
	for e := range own {
		own[e] = snaps[e%len(snaps)]
		own[e].Words = slices.Clone(own[e].Words)
	}
	loads := func(from, n int) []*SnapshotLoad {
		out := make([]*SnapshotLoad, n)
		for e := range out {
			if out[e], err = f.LoadSnapshot(from+e, 1, own[from+e]); err != nil {
				b.Fatal(err)
			}
		}
		return out
	}
	words := len(snaps[0].Words)
	b.Run("64/one-at-a-time", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			for _, l := range loads(i%16*64, 64) {
				if done, err := l.Step(words); !done || err != nil {
					b.Fatal(done, err)
				}
			}
		}
	})
	batch := func(b *testing.B, n int) {
		var commits []time.Duration
		for i := 0; i < b.N; i++ {
			lb := NewLoadBatch(f)
			for _, l := range loads(i%(1024/n)*n, n) {
				if !lb.Add(l) {
					b.Fatal("not batched")
				}
			}
			for lb.Live() > 0 {
				lb.Prepare(max(1, (1<<10)/lb.Columns()))
				t0 := time.Now()
				_, ab := lb.Commit()
				commits = append(commits, time.Since(t0))
				if len(ab) > 0 {
					b.Fatal(ab)
				}
			}
		}
		slices.Sort(commits)
		b.ReportMetric(float64(commits[len(commits)/2].Microseconds()), "commit-p50-µs")
		b.ReportMetric(float64(commits[len(commits)*99/100].Microseconds()), "commit-p99-µs")
	}
	b.Run("64/batch", func(b *testing.B) { batch(b, 64) })
	b.Run("1024/batch", func(b *testing.B) { batch(b, 1024) })
}
