package index

import (
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/tier"
)

// driveTiers reads ops as (operation, block) byte pairs — GPU and
// self-describing CPU stores, CPU and STORAGE placeholders, removals in
// every tier, clears — over test blocks 0..7, and checks the index
// against a model of the contract after every event: per tier, copies
// per engine hash; a placeholder takes its tier's own map, else any
// other tier's, else is dropped; a clear empties every tier.
func driveTiers(t *testing.T, ops []byte) {
	x := newIndex(t)
	copies := [tier.Count]map[uint64]int{{}, {}, {}}
	var want Stats
	media := [tier.Count]string{"GPU", "CPU", "STORAGE"}
	for i := 0; i+1 < len(ops); i += 2 {
		h := uint64(ops[i+1] % 8)
		var ev kvevents.Event
		switch op := ops[i] % 8; op {
		case 0, 1: // a GPU or self-describing CPU run
			tr := tier.Tier(op)
			ev = run(media[tr], h)
			copies[tr][h]++
			want.StoredBlocks++
		case 2, 3: // a CPU or STORAGE placeholder
			tr := tier.Tier(op - 1)
			ev = ph(media[tr], h)
			want.Placeholders++
			if copies[0][h]+copies[1][h]+copies[2][h] > 0 {
				copies[tr][h]++
				want.PlaceholdersResolved++
				want.StoredBlocks++
			} else {
				want.PlaceholdersUnresolved++
			}
		case 4, 5, 6: // a removal
			tr := tier.Tier(op - 4)
			ev = rm(media[tr], h)
			if copies[tr][h] > 0 {
				copies[tr][h]--
				want.RemovedBlocks++
			} else {
				want.UnknownRemovals++
			}
		case 7:
			ev = cleared
			copies = [tier.Count]map[uint64]int{{}, {}, {}}
			want.Clears++
		}
		if err := x.Apply(&ev); err != nil {
			t.Fatalf("op %d: %v", i/2, err)
		}
		for tr := range copies {
			for h := uint64(0); h < 8; h++ {
				k, refs, ok := x.LookupEngine(tier.Tier(tr), h)
				n := copies[tr][h]
				if ok != (n > 0) || (ok && (refs != n || k != keyOf(h))) {
					t.Fatalf("op %d: %v block %d: ok %v, %d copies, key ok %v; want %d copies",
						i/2, tier.Tier(tr), h, ok, refs, k == keyOf(h), n)
				}
			}
			distinct := 0
			for _, n := range copies[tr] {
				if n > 0 {
					distinct++
				}
			}
			if x.Blocks(tier.Tier(tr)) != distinct {
				t.Fatalf("op %d: %v holds %d blocks, want %d", i/2, tier.Tier(tr), x.Blocks(tier.Tier(tr)), distinct)
			}
			if s := x.Summary(tier.Tier(tr)); s != nil && s.Keys() != distinct {
				t.Fatalf("op %d: %v summary holds %d keys, want %d", i/2, tier.Tier(tr), s.Keys(), distinct)
			}
		}
		if got := x.Stats(); got != want {
			t.Fatalf("op %d: stats\n got %+v\nwant %+v", i/2, got, want)
		}
	}
}

// FuzzTiers checks the index against the model for any event sequence.
func FuzzTiers(f *testing.F) {
	f.Add([]byte{0, 1, 2, 1, 4, 1, 5, 1})       // GPU store, CPU placeholder, GPU removal, CPU removal
	f.Add([]byte{2, 1, 0, 1, 5, 1, 2, 1})       // placeholder first: dropped, removal ignored
	f.Add([]byte{0, 1, 2, 1, 2, 1, 4, 1, 5, 1}) // duplicate placeholders
	f.Add([]byte{0, 0, 2, 0, 7, 0, 2, 0, 5, 0}) // clear between (hash 0)
	f.Add([]byte{0, 3, 2, 3, 4, 3, 3, 3, 5, 3, 3, 3, 6, 3})
	f.Fuzz(driveTiers)
}

// TestTiersMatchModel runs long random sequences through the model (the
// fuzz target's seeds are short).
func TestTiersMatchModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 0; n < 20; n++ {
		ops := make([]byte, 2000)
		for i := range ops {
			ops[i] = byte(rng.Uint32())
			if i%2 == 0 && ops[i]%8 == 7 && rng.IntN(8) != 0 {
				ops[i]-- // clears are rarer than the rest
			}
		}
		driveTiers(t, ops)
	}
}
