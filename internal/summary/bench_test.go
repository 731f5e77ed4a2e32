package summary

import (
	"math/rand/v2"
	"testing"
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
