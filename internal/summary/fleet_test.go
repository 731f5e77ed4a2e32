package summary

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
)

// randomFleet gives each of n endpoints a random set of chains: prefixes
// of a few shared conversations at random depths, plus unrelated keys.
func randomFleet(rng *rand.Rand, n, convs, depth, noise int) ([][]blockkey.Key, []map[blockkey.Key]bool) {
	chains := make([][]blockkey.Key, convs)
	for c := range chains {
		chains[c] = randKeys(rng, depth)
	}
	sets := make([]map[blockkey.Key]bool, n)
	for e := range sets {
		sets[e] = map[blockkey.Key]bool{}
		for c := range chains {
			if rng.IntN(2) == 0 {
				continue
			}
			held := rng.IntN(depth + 1)
			for _, k := range chains[c][:held] {
				sets[e][k] = true
			}
		}
		for _, k := range randKeys(rng, noise) {
			sets[e][k] = true
		}
	}
	return chains, sets
}

func exactMatch(set map[blockkey.Key]bool, chain []blockkey.Key) int {
	n := 0
	for n < len(chain) && set[chain[n]] {
		n++
	}
	return n
}

// TestFleetMatchesExactReference: on random fleets the one-pass walk gives
// every endpoint its exact matched length, except the rare extension a
// false positive causes (never a shortening).
func TestFleetMatchesExactReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{1, 5, 64, 65, 130, 300, 1000} {
		p := ForCapacity(4096)
		f, err := NewFleet(p, n)
		if err != nil {
			t.Fatal(err)
		}
		chains, sets := randomFleet(rng, n, 8, 200, 1000)
		for e, set := range sets {
			c := NewCounting(p)
			for k := range set {
				c.Add(k)
			}
			c.TakeDelta()
			if err := f.SetSnapshot(e, 1, c.Snapshot()); err != nil {
				t.Fatal(err)
			}
		}
		matched := make([]int, f.Slots())
		extended, compared := 0, 0
		linear := make([]int, f.Slots())
		for _, chain := range chains {
			best := f.Match(chain, matched)
			if lbest := f.MatchLinear(chain, linear); lbest != best || fmt.Sprint(linear) != fmt.Sprint(matched) {
				t.Fatalf("%d endpoints: search %v, linear walk %v", n, matched, linear)
			}
			top := 0
			for e, set := range sets {
				want := exactMatch(set, chain)
				compared++
				if matched[e] < want {
					t.Fatalf("%d endpoints: endpoint %d matched %d, holds %d", n, e, matched[e], want)
				}
				if matched[e] > want {
					extended++
				}
				top = max(top, matched[e])
			}
			if best != top {
				t.Fatalf("longest %d, max %d", best, top)
			}
			for s := n; s < f.Slots(); s++ {
				if matched[s] != 0 {
					t.Fatal("an unused slot matched")
				}
			}
		}
		if extended*50 > compared {
			t.Fatalf("%d endpoints: %d of %d answers extended by false positives", n, extended, compared)
		}
	}
}

// TestFleetDeltasAndLifecycle: deltas keep a slot equal to its sidecar's
// summary; out-of-order deltas ask for a snapshot; Remove and a new epoch
// drop stale bits.
func TestFleetDeltasAndLifecycle(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	p := ForCapacity(2048)
	f, err := NewFleet(p, 3)
	if err != nil {
		t.Fatal(err)
	}
	c := NewCounting(p)
	if err := f.SetSnapshot(1, 7, c.Snapshot()); err != nil {
		t.Fatal(err)
	}
	chain := randKeys(rng, 50)
	for _, k := range chain[:30] {
		c.Add(k)
	}
	d, _ := c.TakeDelta()
	if err := f.ApplyDelta(1, 7, d); err != nil {
		t.Fatal(err)
	}
	matched := make([]int, f.Slots())
	if f.Match(chain, matched); matched[1] != 30 || matched[0] != 0 {
		t.Fatalf("matched %v", matched)
	}
	for _, k := range chain[20:30] {
		c.Remove(k)
	}
	d2, _ := c.TakeDelta()
	var se *SeqError
	if err := f.ApplyDelta(1, 8, d2); !errors.As(err, &se) {
		t.Fatalf("wrong epoch: %v", err)
	}
	if err := f.ApplyDelta(1, 7, Delta{Seq: d2.Seq + 1}); !errors.As(err, &se) {
		t.Fatalf("skipped delta: %v", err)
	}
	if err := f.ApplyDelta(1, 7, d2); err != nil {
		t.Fatal(err)
	}
	if f.Match(chain, matched); matched[1] != 20 {
		t.Fatalf("after removals matched %d", matched[1])
	}
	if e, s, ok := f.Position(1); !ok || e != 7 || s != d2.Seq {
		t.Fatalf("position %d %d %v", e, s, ok)
	}
	// A new epoch replaces everything.
	if err := f.SetSnapshot(1, 8, NewCounting(p).Snapshot()); err != nil {
		t.Fatal(err)
	}
	if f.Match(chain, matched); matched[1] != 0 {
		t.Fatal("stale bits after a new epoch")
	}
	f.Remove(1)
	if _, _, ok := f.Position(1); ok {
		t.Fatal("removed slot still used")
	}
	if err := f.SetSnapshot(0, 1, Snapshot{Params: ForCapacity(10)}); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("incompatible snapshot: %v", err)
	}
	if err := f.ApplyDelta(0, 1, Delta{Seq: 1, Flips: []uint32{p.M}}); err == nil {
		t.Fatal("delta on an empty slot accepted")
	}
	if _, err := NewFleet(p, 0); err == nil {
		t.Fatal("zero slots accepted")
	}
}

// TestVerifyCatchesAHole: an endpoint holding a chain with a hole (a lost
// parent) is over-reported by the search and corrected by Verify.
func TestVerifyCatchesAHole(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	p := ForCapacity(4096)
	f, err := NewFleet(p, 2)
	if err != nil {
		t.Fatal(err)
	}
	chain := randKeys(rng, 64)
	c := NewCounting(p)
	for i, k := range chain {
		if i != 5 { // block 5 lost
			c.Add(k)
		}
	}
	c.TakeDelta()
	if err := f.SetSnapshot(0, 1, c.Snapshot()); err != nil {
		t.Fatal(err)
	}
	matched := make([]int, f.Slots())
	f.Match(chain, matched)
	if got := f.Verify(chain, 0, matched[0]); got != 5 {
		t.Fatalf("verified %d (search said %d), want 5", got, matched[0])
	}
	if f.Verify(chain, 1, 10) != 0 {
		t.Fatal("an unused slot verified")
	}
}

func TestFleetGrowKeepsSlots(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	p := ForCapacity(1024)
	f, err := NewFleet(p, 64)
	if err != nil {
		t.Fatal(err)
	}
	chain := randKeys(rng, 20)
	c := NewCounting(p)
	for _, k := range chain[:12] {
		c.Add(k)
	}
	c.TakeDelta()
	if err := f.SetSnapshot(63, 4, c.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if err := f.Grow(130); err != nil || f.Slots() != 192 {
		t.Fatalf("Grow: %v, %d slots", err, f.Slots())
	}
	if err := f.SetSnapshot(150, 1, c.Snapshot()); err != nil {
		t.Fatal(err)
	}
	matched := make([]int, f.Slots())
	f.Match(chain, matched)
	if matched[63] != 12 || matched[150] != 12 {
		t.Fatalf("after Grow: slot 63 %d, slot 150 %d", matched[63], matched[150])
	}
	if e, _, ok := f.Position(63); !ok || e != 4 {
		t.Fatal("position lost by Grow")
	}
	if f.Grow(10) != nil || f.Slots() != 192 {
		t.Fatal("Grow shrank")
	}
	if f.SetSnapshot(192, 1, c.Snapshot()) == nil || f.ApplyDelta(-1, 1, Delta{Seq: 1}) == nil || f.Verify(chain, 500, 3) != 0 {
		t.Fatal("out-of-range slots accepted")
	}
	f.Remove(999)
	if _, _, ok := f.Position(999); ok {
		t.Fatal("position of an out-of-range slot")
	}
}

// TestSnapshotLoadInSteps: a load written a part at a time leaves the slot
// absent until its last step, then equals SetSnapshot; a change to the
// slot meanwhile abandons it without leaving its bits behind.
func TestSnapshotLoadInSteps(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	p := ForCapacity(4096)
	f, err := NewFleet(p, 2)
	if err != nil {
		t.Fatal(err)
	}
	old, fresh := randKeys(rng, 40), randKeys(rng, 40)
	snapOf := func(keys []blockkey.Key) Snapshot {
		c := NewCounting(p)
		for _, k := range keys {
			c.Add(k)
		}
		c.TakeDelta()
		return c.Snapshot()
	}
	if err := f.SetSnapshot(0, 1, snapOf(old)); err != nil {
		t.Fatal(err)
	}
	matched := make([]int, f.Slots())
	l, err := f.LoadSnapshot(0, 2, snapOf(fresh))
	if err != nil {
		t.Fatal(err)
	}
	steps := 0
	for {
		done, err := l.Step(7)
		if err != nil {
			t.Fatal(err)
		}
		steps++
		if done {
			break
		}
		if _, _, ok := f.Position(0); ok {
			t.Fatal("a half-loaded slot has a position")
		}
		if f.Match(fresh, matched); matched[0] != 0 {
			t.Fatal("Match sees a half-loaded slot")
		}
		if f.MatchLinear(old, matched); matched[0] != 0 {
			t.Fatal("MatchLinear sees a half-loaded slot")
		}
		if f.Verify(fresh, 0, len(fresh)) != 0 {
			t.Fatal("Verify sees a half-loaded slot")
		}
	}
	if want := int(p.M/64+6) / 7; steps != want {
		t.Fatalf("%d steps, want %d", steps, want)
	}
	if e, _, ok := f.Position(0); !ok || e != 2 {
		t.Fatal("loaded slot has no position")
	}
	if f.Match(fresh, matched); matched[0] != len(fresh) {
		t.Fatalf("loaded slot matches %d of %d", matched[0], len(fresh))
	}
	if f.MatchLinear(old, matched); matched[0] > 1 {
		t.Fatalf("the replaced summary's keys still match %d deep", matched[0])
	}
	// Abandoned by a removal: the next owner of the slot starts clean.
	l, _ = f.LoadSnapshot(1, 1, snapOf(old))
	if done, err := l.Step(int(p.M / 128)); done || err != nil {
		t.Fatalf("half a load: %v %v", done, err)
	}
	f.Remove(1)
	if _, err := l.Step(1); !errors.Is(err, ErrAbandoned) {
		t.Fatalf("step after removal: %v", err)
	}
	if err := f.SetSnapshot(1, 1, snapOf(nil)); err != nil {
		t.Fatal(err)
	}
	if f.MatchLinear(old, matched); matched[1] > 1 {
		t.Fatalf("an abandoned load's bits match %d deep", matched[1])
	}
	// Abandoned by a newer load.
	l1, _ := f.LoadSnapshot(1, 2, snapOf(old))
	l2, _ := f.LoadSnapshot(1, 3, snapOf(fresh))
	if _, err := l1.Step(1); !errors.Is(err, ErrAbandoned) {
		t.Fatalf("overtaken load stepped: %v", err)
	}
	if done, err := l2.Step(int(p.M / 64)); !done || err != nil {
		t.Fatalf("newer load: %v %v", done, err)
	}
}

// TestProbeWalksAgree: the probe walks inside the index (and1 for a
// one-word fleet, andWord for any) give what Params.Probes' positions
// give, for every k: they compute the positions without its buffer.
func TestProbeWalksAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, k := range []uint8{1, 6, 7, 8, 13, 14, 15, 16} {
		for _, slots := range []int{64, 200} {
			p := Params{M: 8 * BlockBits, K: k, Probe: ProbeV1} // small: rows are dense with set bits
			f, err := NewFleet(p, slots)
			if err != nil {
				t.Fatal(err)
			}
			for i := range f.rows {
				f.rows[i] = rng.Uint64() | rng.Uint64() // ¾ of the bits set
			}
			var buf [MaxK]uint32
			for range 500 {
				key := blockkey.Key(rng.Uint64())
				for w := range f.words {
					want := ^uint64(0)
					for _, pos := range p.Probes(key, &buf) {
						want &= f.rows[int(pos)*f.words+w]
					}
					if got := f.andWord(key, w, ^uint64(0)); got != want {
						t.Fatalf("k=%d slots=%d word %d: andWord %x, probes %x", k, slots, w, got, want)
					}
					if f.words == 1 {
						if got := f.and1(key, ^uint64(0)); got != want {
							t.Fatalf("k=%d: and1 %x, probes %x", k, got, want)
						}
					}
				}
			}
		}
	}
}
