package summary

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
)

func randKeys(rng *rand.Rand, n int) []blockkey.Key {
	out := make([]blockkey.Key, n)
	for i := range out {
		out[i] = blockkey.Key(rng.Uint64())
	}
	return out
}

func TestParams(t *testing.T) {
	p := ForCapacity(65536)
	if p.M != 65536*16 || p.K != 8 || p.Probe != ProbeV1 || p.Validate() != nil {
		t.Fatalf("ForCapacity = %+v", p)
	}
	if q := ForCapacity(1); q.M != BlockBits || q.Validate() != nil {
		t.Fatalf("ForCapacity(1) = %+v", q)
	}
	for _, bad := range []Params{{M: 0, K: 8, Probe: ProbeV1}, {M: 1000, K: 8, Probe: ProbeV1}, {M: 512, K: 0, Probe: ProbeV1},
		{M: 512, K: 17, Probe: ProbeV1}, {M: 512, K: 8, Probe: "other"}} {
		if bad.Validate() == nil {
			t.Errorf("%+v valid", bad)
		}
	}
	if err := p.Compatible(ForCapacity(1000)); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("Compatible = %v", err)
	}
	if p.Compatible(p) != nil {
		t.Fatal("p incompatible with itself")
	}
}

// TestProbesGolden pins the probe function: changing it must change ProbeV1.
func TestProbesGolden(t *testing.T) {
	p := Params{M: 1 << 20, K: 8, Probe: ProbeV1}
	var buf [MaxK]uint32
	got := fmt.Sprint(p.Probes(0x0123456789abcdef, &buf))
	const want = "[87613 87744 87769 87920 87709 87566 87563 87574]"
	if got != want {
		t.Fatalf("probes changed:\n got %s\nwant %s", got, want)
	}
}

// referenceProbes is the probe function as first written (the loop the
// golden above was taken from); Probes must give its positions for every k.
func referenceProbes(p Params, key blockkey.Key) []uint32 {
	h := splitmix(uint64(key))
	base := uint32(((h >> 32) * uint64(p.M/BlockBits)) >> 32 * BlockBits)
	var out []uint32
	for i, round := 0, uint64(1); i < int(p.K); round++ {
		x := splitmix(h + round)
		for end := min(i+7, int(p.K)); i < end; i++ {
			out = append(out, base+uint32(x&(BlockBits-1)))
			x >>= 9
		}
	}
	return out
}

func TestProbesMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for k := uint8(1); k <= MaxK; k++ {
		p := Params{M: 1 << 20, K: k, Probe: ProbeV1}
		for range 1000 {
			key := blockkey.Key(rng.Uint64())
			var buf [MaxK]uint32
			if got, want := p.Probes(key, &buf), referenceProbes(p, key); !slices.Equal(got, want) {
				t.Fatalf("k=%d key %x: %v, want %v", k, key, got, want)
			}
		}
	}
}

func TestProbesShape(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, p := range []Params{ForCapacity(1), ForCapacity(1000), {M: 1 << 20, K: 16, Probe: ProbeV1}} {
		for i := 0; i < 2000; i++ {
			var buf [MaxK]uint32
			pos := slices.Clone(p.Probes(blockkey.Key(rng.Uint64()), &buf))
			if len(pos) != int(p.K) {
				t.Fatal("wrong count")
			}
			block := pos[0] / BlockBits
			for _, x := range pos {
				if x >= p.M || x/BlockBits != block {
					t.Fatalf("%v leaves one block", pos)
				}
			}
		}
	}
}

// TestFalsePositiveRateAtCapacity compares against an exact set: at the
// capacity the parameters were sized for, no member is missed and the rate
// of non-members testing positive is ≤ 1e-3 per probe, at 16 bits a block.
func TestFalsePositiveRateAtCapacity(t *testing.T) {
	const capacity = 65536
	p := ForCapacity(capacity)
	if bitsPerKey := float64(p.M) / capacity; bitsPerKey > 16 {
		t.Fatalf("%.1f bits per cached block", bitsPerKey)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	c := NewCounting(p)
	exact := map[blockkey.Key]bool{}
	for _, k := range randKeys(rng, capacity) {
		c.Add(k)
		exact[k] = true
	}
	for k := range exact {
		if !c.MayContain(k) {
			t.Fatal("a member tests negative")
		}
	}
	const probes = 1_000_000
	fp, n := 0, 0
	for n < probes {
		k := blockkey.Key(rng.Uint64())
		if exact[k] {
			continue
		}
		n++
		if c.MayContain(k) {
			fp++
		}
	}
	rate := float64(fp) / probes
	t.Logf("false-positive rate at capacity: %.2e (%d of %d), fill %.3f", rate, fp, probes, c.Fill())
	if rate > 1e-3 {
		t.Fatalf("false-positive rate %.2e > 1e-3", rate)
	}
}

// TestCountingMatchesExactSet: after random adds and removes, the summary
// holds every live key, its bits equal a summary built from the live keys
// alone, and snapshot + deltas reproduce the bitmap.
func TestCountingMatchesExactSet(t *testing.T) {
	p := ForCapacity(2000)
	rng := rand.New(rand.NewPCG(5, 6))
	c := NewCounting(p)
	replica := c.Snapshot()
	live := map[blockkey.Key]int{}
	var order []blockkey.Key
	for step := 0; step < 20000; step++ {
		if len(order) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(order))
			k := order[i]
			order[i] = order[len(order)-1]
			order = order[:len(order)-1]
			c.Remove(k)
			if live[k]--; live[k] == 0 {
				delete(live, k)
			}
		} else {
			k := blockkey.Key(rng.Uint64() % 3000) // repeats: the same key added twice
			c.Add(k)
			live[k]++
			order = append(order, k)
		}
		if rng.IntN(50) == 0 {
			if d, ok := c.TakeDelta(); ok {
				if err := replica.Apply(d); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if d, ok := c.TakeDelta(); ok {
		if err := replica.Apply(d); err != nil {
			t.Fatal(err)
		}
	}
	fresh := NewCounting(p)
	for k, n := range live {
		for i := 0; i < n; i++ {
			fresh.Add(k)
		}
		if !c.MayContain(k) {
			t.Fatal("live key missing")
		}
	}
	if !slices.Equal(c.bits, fresh.bits) || !slices.Equal(replica.Words, c.bits) {
		t.Fatal("bitmaps differ")
	}
	if c.Keys() != len(order) {
		t.Fatalf("Keys() = %d, want %d", c.Keys(), len(order))
	}
	snap := c.Snapshot()
	if snap.Seq != c.Seq() || !slices.Equal(snap.Words, c.bits) {
		t.Fatal("snapshot differs from the bitmap")
	}
}

func TestDeltas(t *testing.T) {
	c := NewCounting(ForCapacity(100))
	if _, ok := c.TakeDelta(); ok {
		t.Fatal("delta from an empty summary")
	}
	c.Add(1)
	c.Remove(1) // flips cancel out before a delta
	if c.Pending() {
		if d, ok := c.TakeDelta(); ok {
			t.Fatalf("cancelled flips sent: %+v", d)
		}
	}
	c.Add(2)
	d, ok := c.TakeDelta()
	if !ok || d.Seq != 1 || len(d.Flips) != 8 || !slices.IsSorted(d.Flips) {
		t.Fatalf("delta %+v", d)
	}
	before := c.Snapshot()
	c.Add(2) // counters 1→2: no flips
	if _, ok := c.TakeDelta(); ok {
		t.Fatal("a second add flipped bits")
	}
	c.Remove(2)
	c.Remove(2)
	d, ok = c.TakeDelta()
	if !ok || d.Seq != 2 || len(d.Flips) != 8 {
		t.Fatalf("removal delta %+v", d)
	}
	if err := before.Apply(d); err != nil || before.MayContain(2) {
		t.Fatalf("apply: %v", err)
	}
	var se *SeqError
	if err := before.Apply(d); !errors.As(err, &se) || se.Have != 2 || se.Got != 2 {
		t.Fatalf("out-of-order apply: %v", err)
	}
	if err := before.Apply(Delta{Seq: 3, Flips: []uint32{c.p.M}}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("flip beyond m: %v", err)
	}
	c.Add(9)
	c.Reset()
	if c.Seq() != 0 || c.Keys() != 0 || c.Fill() != 0 || c.Pending() {
		t.Fatal("Reset left state")
	}
}

func TestSaturation(t *testing.T) {
	c := NewCounting(Params{M: 512, K: 1, Probe: ProbeV1})
	for i := 0; i < 20; i++ {
		c.Add(7)
	}
	if c.Saturated() != 1 {
		t.Fatalf("saturated %d", c.Saturated())
	}
	for i := 0; i < 20; i++ {
		c.Remove(7)
	}
	if !c.MayContain(7) {
		t.Fatal("a saturated counter was decremented to zero")
	}
}
