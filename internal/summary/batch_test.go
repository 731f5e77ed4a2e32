package summary

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestTranspose64(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 64))
	for range 100 {
		var m, orig [64]uint64
		for i := range m {
			m[i] = rng.Uint64() & (rng.Uint64() | rng.Uint64()) // uneven density
		}
		orig = m
		transpose64(&m)
		for i := range 64 {
			for j := range 64 {
				if m[i]>>j&1 != orig[j]>>i&1 {
					t.Fatalf("bit %d of word %d: %d, want bit %d of input word %d: %d", j, i, m[i]>>j&1, i, j, orig[j]>>i&1)
				}
			}
		}
		if transpose64(&m); m != orig {
			t.Fatal("transposing twice is not the identity")
		}
	}
}

// randomSnapshot is m bits at about the given density.
func randomSnapshot(rng *rand.Rand, p Params, seq uint64, density float64) Snapshot {
	words := make([]uint64, p.M/64)
	for i := range words {
		for b := range 64 {
			if rng.Float64() < density {
				words[i] |= 1 << b
			}
		}
	}
	return Snapshot{Params: p, Seq: seq, Words: words}
}

// TestLoadBatchMatchesOneByOne: a batch of loads over one or more row
// words (some with one load, some with many), written in steps of random
// size while the fleet grows and slots are removed or reloaded under it,
// leaves the index bit for bit as loading the same snapshots one at a time
// (SetSnapshot) does, the slots not in the batch untouched; until its last
// step a batched slot reads as absent.
func TestLoadBatchMatchesOneByOne(t *testing.T) {
	p := Params{M: 16 * BlockBits, K: 8, Probe: ProbeV1}
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		got, _ := NewFleet(p, 100)
		want, _ := NewFleet(p, 100)
		// Every slot of both fleets loaded once: the batch overwrites dirty rows.
		for s := range 128 {
			snap := randomSnapshot(rng, p, 1, 0.3)
			if got.SetSnapshot(s, 1, snap) != nil || want.SetSnapshot(s, 1, snap) != nil {
				t.Fatal("set")
			}
		}
		col := 0
		slots := rng.Perm(128)[:1+rng.IntN(128)]
		if seed%4 == 0 { // one column
			col, slots = rng.IntN(2), rng.Perm(64)[:1+rng.IntN(64)]
		} else if seed%4 == 1 { // one load in one column, the rest in the other
			slots = append(rng.Perm(64)[:1+rng.IntN(63)], 64+rng.IntN(64))
		}
		var loads []*SnapshotLoad
		snaps := map[int]Snapshot{}
		for _, s := range slots {
			s += col * 64
			snaps[s] = randomSnapshot(rng, p, 2+uint64(rng.IntN(5)), rng.Float64())
			l, err := got.LoadSnapshot(s, 2, snaps[s])
			if err != nil {
				t.Fatal(err)
			}
			loads = append(loads, l)
		}
		b, ok := NewLoadBatch(loads)
		if !ok {
			t.Fatal("a valid batch refused")
		}
		removed, reloaded := map[int]bool{}, map[int]*SnapshotLoad{}
		var abandoned []*SnapshotLoad
		for steps := 0; ; steps++ {
			if steps > 1000 {
				t.Fatal("the batch does not finish")
			}
			done, ab := b.Step(1 + rng.IntN(5))
			abandoned = append(abandoned, ab...)
			if done {
				break
			}
			for _, s := range slots {
				if s += col * 64; !removed[s] && reloaded[s] == nil {
					if _, _, ok := got.Position(s); ok {
						t.Fatalf("seed %d: half-loaded slot %d has a position", seed, s)
					}
				}
			}
			switch s := slots[rng.IntN(len(slots))] + col*64; rng.IntN(8) {
			case 0:
				got.Remove(s)
				delete(reloaded, s)
				removed[s] = true
			case 1:
				snap := randomSnapshot(rng, p, 9, 0.5)
				l, _ := got.LoadSnapshot(s, 3, snap)
				reloaded[s], snaps[s] = l, snap
				delete(removed, s)
			case 2:
				if err := got.Grow(got.Slots() + 64); err != nil {
					t.Fatal(err)
				}
			}
		}
		for s, l := range reloaded {
			if _, err := l.Step(int(p.M / 64)); err != nil {
				t.Fatal(err)
			}
			if err := want.SetSnapshot(s, 3, snaps[s]); err != nil {
				t.Fatal(err)
			}
		}
		for _, s := range slots {
			s += col * 64
			switch {
			case removed[s]:
				want.Remove(s)
			case reloaded[s] == nil:
				if err := want.SetSnapshot(s, 2, snaps[s]); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n := len(removed) + len(reloaded); len(abandoned) > n {
			t.Fatalf("seed %d: %d loads abandoned, %d slots changed", seed, len(abandoned), n)
		}
		for _, l := range abandoned {
			if !removed[l.slot] && reloaded[l.slot] == nil {
				t.Fatalf("seed %d: slot %d's load abandoned, the slot unchanged", seed, l.slot)
			}
		}
		if err := want.Grow(got.Slots()); err != nil {
			t.Fatal(err)
		}
		for s := range got.Slots() {
			e1, q1, ok1 := got.Position(s)
			e2, q2, ok2 := want.Position(s)
			if e1 != e2 || q1 != q2 || ok1 != ok2 {
				t.Fatalf("seed %d: slot %d at (%d,%d,%v), want (%d,%d,%v)", seed, s, e1, q1, ok1, e2, q2, ok2)
			}
		}
		if !slices.Equal(got.rows, want.rows) {
			for i := range got.rows {
				if got.rows[i] != want.rows[i] {
					t.Fatalf("seed %d: row %d word %d: %#x, want %#x", seed, i/got.words, i%got.words, got.rows[i], want.rows[i])
				}
			}
		}
	}
}

func TestNewLoadBatchRefuses(t *testing.T) {
	p := Params{M: 4 * BlockBits, K: 4, Probe: ProbeV1}
	rng := rand.New(rand.NewPCG(2, 2))
	f, _ := NewFleet(p, 200)
	g, _ := NewFleet(p, 200)
	load := func(f *Fleet, slot int) *SnapshotLoad {
		l, err := f.LoadSnapshot(slot, 1, randomSnapshot(rng, p, 1, 0.5))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	started := load(f, 5)
	started.Step(1)
	dup := load(f, 7)
	for name, loads := range map[string][]*SnapshotLoad{
		"none":            nil,
		"two fleets":      {load(f, 2), load(g, 3)},
		"a started load":  {load(f, 4), started},
		"one slot twice":  {dup, dup},
		"one slot, twice": {load(f, 9), load(f, 9)},
	} {
		if _, ok := NewLoadBatch(loads); ok {
			t.Errorf("%s: batched", name)
		}
	}
	if _, ok := NewLoadBatch([]*SnapshotLoad{load(f, 10), load(f, 11), load(f, 63), load(f, 64), load(f, 199)}); !ok {
		t.Error("a valid batch refused")
	}
}
