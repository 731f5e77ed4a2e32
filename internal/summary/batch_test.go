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
// words (some with one load, some with many), some joining at the start
// and the rest while the others are being written, written in steps of
// random size while the fleet grows and slots are removed or reloaded
// under it — between a step's Prepare and its Commit too — leaves the
// index bit for bit as loading the same snapshots one at a time
// (SetSnapshot) does, the slots not in the batch untouched; until it
// finishes a batched slot reads as absent.
func TestLoadBatchMatchesOneByOne(t *testing.T) {
	p := Params{M: 16 * BlockBits, K: 8, Probe: ProbeV1}
	for seed := range uint64(60) {
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
		for i := range slots {
			slots[i] += col * 64
		}
		b := NewLoadBatch(got)
		snaps := map[int]Snapshot{}
		batched := map[int]*SnapshotLoad{} // the batch's load of each slot
		join := func(s int) {
			snaps[s] = randomSnapshot(rng, p, 2+uint64(rng.IntN(5)), rng.Float64())
			l, err := got.LoadSnapshot(s, 2, snaps[s])
			if err != nil {
				t.Fatal(err)
			}
			if !b.Add(l) {
				t.Fatalf("seed %d: slot %d's load refused", seed, s)
			}
			batched[s] = l
		}
		late := slots[rng.IntN(len(slots)):] // join while the others are written
		for _, s := range slots[:len(slots)-len(late)] {
			join(s)
		}
		removed, reloaded := map[int]bool{}, map[int]*SnapshotLoad{}
		finished := map[int]bool{}
		var abandoned []*SnapshotLoad
		for steps := 0; ; steps++ {
			if steps > 10000 {
				t.Fatal("the batch does not finish")
			}
			if len(late) > 0 && rng.IntN(4) == 0 {
				join(late[0])
				late = late[1:]
			}
			if b.Live() == 0 && len(late) == 0 {
				break
			}
			if b.Live() == 0 {
				continue
			}
			b.Prepare(1 + rng.IntN(5))
			interfere := func() {
				var s int
				if len(batched) == 0 {
					return
				}
				for s = range batched {
					break
				}
				switch rng.IntN(16) {
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
			interfere() // between Prepare and Commit: the lock is released
			fin, ab := b.Commit()
			abandoned = append(abandoned, ab...)
			for _, l := range ab {
				delete(batched, l.slot)
			}
			for _, l := range fin {
				if finished[l.slot] || batched[l.slot] != l {
					t.Fatalf("seed %d: slot %d finished twice, or not its batched load", seed, l.slot)
				}
				finished[l.slot] = true
				delete(batched, l.slot)
			}
			interfere()
			for s := range batched {
				if _, _, ok := got.Position(s); ok {
					t.Fatalf("seed %d: half-loaded slot %d has a position", seed, s)
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
			switch {
			case removed[s]:
				want.Remove(s)
			case reloaded[s] == nil:
				if !finished[s] {
					t.Fatalf("seed %d: slot %d unchanged, its load not finished", seed, s)
				}
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

// TestLoadBatchLap: a load is written one lap after it joins, wherever
// the cursor is: stepping a word at a time, a load that joins before step
// s finishes in step s+words-1, its slot in use from then on; the batch
// never waits for loads that came earlier.
func TestLoadBatchLap(t *testing.T) {
	p := Params{M: 4 * BlockBits, K: 4, Probe: ProbeV1} // 32 words
	words := int(p.M / 64)
	rng := rand.New(rand.NewPCG(3, 3))
	f, _ := NewFleet(p, 200)
	b := NewLoadBatch(f)
	joinedAt := map[*SnapshotLoad]int{}
	for step := 0; step < 5*words; step++ {
		if step < 3*words && rng.IntN(3) == 0 {
			l, err := f.LoadSnapshot(rng.IntN(200), 1, randomSnapshot(rng, p, 1, 0.5))
			if err != nil {
				t.Fatal(err)
			}
			for o := range joinedAt { // a load of the same slot still in the batch is overtaken
				if o.slot == l.slot {
					delete(joinedAt, o)
				}
			}
			if b.Add(l) {
				joinedAt[l] = step
			}
		}
		fin, _ := b.Step(1)
		for _, l := range fin {
			if at, ok := joinedAt[l]; !ok || step != at+words-1 {
				t.Fatalf("slot %d finished at step %d, joined at %d (%v): want one lap of %d words", l.slot, step, at, ok, words)
			}
			if _, _, ok := f.Position(l.slot); !ok {
				t.Fatalf("slot %d finished, not in use", l.slot)
			}
			delete(joinedAt, l)
		}
	}
	if len(joinedAt) > 0 || b.Live() > 0 {
		t.Fatalf("%d loads never finished (%d live)", len(joinedAt), b.Live())
	}
}

func TestLoadBatchRefuses(t *testing.T) {
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
	b := NewLoadBatch(f)
	started := load(f, 5)
	started.Step(1)
	for name, l := range map[string]*SnapshotLoad{
		"another fleet's": load(g, 3),
		"a stepped load":  started,
	} {
		if b.Add(l) {
			t.Errorf("%s: batched", name)
		}
	}
	for _, s := range []int{10, 11, 63, 64, 199} {
		if !b.Add(load(f, s)) {
			t.Errorf("slot %d: a valid load refused", s)
		}
	}
	dup := load(f, 7)
	if !b.Add(dup) || b.Add(dup) {
		t.Error("one load batched twice")
	}
	if b.Add(load(f, 7)) {
		t.Error("a second load of a slot batched while the first is in the batch")
	}
	b.Prepare(1)
	if b.Add(load(f, 8)) {
		t.Error("a load batched between Prepare and Commit")
	}
	if _, ab := b.Commit(); len(ab) != 1 || ab[0] != dup {
		t.Errorf("abandoned %v, want slot 7's first load", ab)
	}
	if !b.Add(load(f, 8)) {
		t.Error("a load refused after the Commit")
	}
	other := NewLoadBatch(f)
	l := load(f, 20)
	if !other.Add(l) || b.Add(l) {
		t.Error("one load in two batches")
	}
}
