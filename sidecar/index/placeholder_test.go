package index

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/test/enginesim/kvcache"
)

// The events below are shaped as vLLM sends them: GPU runs with group 0
// and kind full_attention, placeholders (OffloadingConnector without
// self-describing events) with hashes, group and medium only.

// blockTokens are the tokens of test block h (a one-block run from token 0).
func blockTokens(h uint64) []uint32 { return tokens(16, uint32(h)*1000) }

// keyOf is the canonical key of test block h.
func keyOf(h uint64) blockkey.Key {
	return (&blockkey.Request{Tokens: blockTokens(h)}).AppendKeys(nil, model, 16)[0]
}

func hashes(hs []uint64) []kvevents.Hash {
	out := make([]kvevents.Hash, len(hs))
	for i, h := range hs {
		out[i] = kvevents.IntHash(h)
	}
	return out
}

// run is a one-block, self-describing BlockStored of test block h.
func run(medium string, h uint64) kvevents.Event {
	return kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: hashes([]uint64{h}), TokenIDs: blockTokens(h),
		BlockSize: 16, Medium: medium, GroupIdx: kvevents.Some(0), KVCacheSpecKind: "full_attention"}
}

// ph is a placeholder BlockStored: hashes only, token_ids [], block_size 0.
func ph(medium string, hs ...uint64) kvevents.Event {
	return kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: hashes(hs), TokenIDs: []uint32{},
		Medium: medium, GroupIdx: kvevents.Some(0)}
}

func rm(medium string, hs ...uint64) kvevents.Event {
	return kvevents.Event{Type: kvevents.TypeBlockRemoved, BlockHashes: hashes(hs), Medium: medium, GroupIdx: kvevents.Some(0)}
}

// group moves ev to KV-cache group g, with spec kind kind ("" for none).
func group(ev kvevents.Event, g int64, kind string) kvevents.Event {
	ev.GroupIdx, ev.KVCacheSpecKind = kvevents.Some(g), kind
	return ev
}

var cleared = kvevents.Event{Type: kvevents.TypeAllBlocksCleared}

// held is what each tier holds: test block → copies.
type held map[tier.Tier]map[uint64]int

// checkHeld compares every tier's map and summary with want; seen lists
// every test block the case touched (to check absent ones).
func checkHeld(t *testing.T, x *Index, want held, seen map[uint64]bool, at string) {
	t.Helper()
	for _, tr := range tier.All() {
		w := want[tr]
		if x.Blocks(tr) != len(w) {
			t.Errorf("%s: %v holds %d blocks, want %d", at, tr, x.Blocks(tr), len(w))
		}
		sum := x.Summary(tr)
		if sum == nil {
			if len(w) != 0 {
				t.Errorf("%s: %v has no summary", at, tr)
			}
		} else if sum.Keys() != len(w) {
			t.Errorf("%s: %v summary holds %d keys, want %d", at, tr, sum.Keys(), len(w))
		}
		for h := range seen {
			k, refs, ok := x.LookupEngine(tr, h)
			n := w[h]
			switch {
			case n == 0 && ok:
				t.Errorf("%s: %v holds block %d (%d copies), want none", at, tr, h, refs)
			case n > 0 && (!ok || k != keyOf(h) || refs != n):
				t.Errorf("%s: %v block %d: ok %v, key ok %v, %d copies, want %d", at, tr, h, ok, k == keyOf(h), refs, n)
			case n > 0 && !sum.MayContain(keyOf(h)):
				t.Errorf("%s: %v summary misses block %d", at, tr, h)
			}
		}
	}
}

// TestPlaceholderOrderings drives placeholders through every ordering
// against GPU stores, removals and clears, checking each tier after
// every event and the counters at the end.
func TestPlaceholderOrderings(t *testing.T) {
	gpu, cpu, sto := tier.GPU, tier.CPU, tier.Storage
	type step struct {
		ev   kvevents.Event
		want held
		err  bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
		stats Stats
	}{
		{"GPU store, CPU placeholder, GPU removal, CPU removal", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 1}, cpu: {1: 1}}},
			{ev: rm("GPU", 1), want: held{cpu: {1: 1}}},
			{ev: rm("CPU", 1), want: held{}},
		}, Stats{StoredBlocks: 2, RemovedBlocks: 2, Placeholders: 1, PlaceholdersResolved: 1}},

		{"CPU removal before the GPU removal", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 1}, cpu: {1: 1}}},
			{ev: rm("CPU", 1), want: held{gpu: {1: 1}}},
			{ev: rm("GPU", 1), want: held{}},
		}, Stats{StoredBlocks: 2, RemovedBlocks: 2, Placeholders: 1, PlaceholdersResolved: 1}},

		{"CPU placeholder before any GPU store is dropped, its removal ignored", []step{
			{ev: ph("CPU", 1), want: held{}},
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: rm("CPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 1}, cpu: {1: 1}}}, // now mapped
		}, Stats{StoredBlocks: 2, UnknownRemovals: 1, Placeholders: 2, PlaceholdersResolved: 1, PlaceholdersUnresolved: 1}},

		{"duplicate placeholders are reference counted", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 1}, cpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 1}, cpu: {1: 2}}},
			{ev: rm("GPU", 1), want: held{cpu: {1: 2}}},
			{ev: rm("CPU", 1), want: held{cpu: {1: 1}}},
			{ev: rm("CPU", 1), want: held{}},
			{ev: rm("CPU", 1), want: held{}},
		}, Stats{StoredBlocks: 3, RemovedBlocks: 3, UnknownRemovals: 1, Placeholders: 2, PlaceholdersResolved: 2}},

		{"a placeholder after the GPU copy is gone resolves through the CPU copy", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 1}, cpu: {1: 1}}},
			{ev: rm("GPU", 1), want: held{cpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{cpu: {1: 2}}},
			{ev: rm("CPU", 1, 1), want: held{}},
		}, Stats{StoredBlocks: 3, RemovedBlocks: 3, Placeholders: 2, PlaceholdersResolved: 2}},

		{"GPU copies and the CPU copy are counted apart", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: run("GPU", 1), want: held{gpu: {1: 2}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 2}, cpu: {1: 1}}},
			{ev: rm("GPU", 1), want: held{gpu: {1: 1}, cpu: {1: 1}}},
			{ev: rm("GPU", 1), want: held{cpu: {1: 1}}},
		}, Stats{StoredBlocks: 3, RemovedBlocks: 2, Placeholders: 1, PlaceholdersResolved: 1}},

		{"AllBlocksCleared empties the CPU tier too", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 1}, cpu: {1: 1}}},
			{ev: cleared, want: held{}},
			{ev: rm("CPU", 1), want: held{}},
			{ev: ph("CPU", 1), want: held{}}, // the map went with the GPU copy
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 1}, cpu: {1: 1}}},
		}, Stats{StoredBlocks: 4, Clears: 1, UnknownRemovals: 1, Placeholders: 3, PlaceholdersResolved: 2, PlaceholdersUnresolved: 1}},

		{"each hash of a placeholder stands alone", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: run("GPU", 3), want: held{gpu: {1: 1, 3: 1}}},
			{ev: ph("CPU", 1, 2, 3), want: held{gpu: {1: 1, 3: 1}, cpu: {1: 1, 3: 1}}},
			{ev: rm("CPU", 3, 2, 1), want: held{gpu: {1: 1, 3: 1}}},
		}, Stats{StoredBlocks: 4, RemovedBlocks: 2, UnknownRemovals: 1, Placeholders: 1, PlaceholdersResolved: 2, PlaceholdersUnresolved: 1}},

		{"a STORAGE placeholder resolves through the CPU copy, then its own", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{gpu: {1: 1}, cpu: {1: 1}}},
			{ev: rm("GPU", 1), want: held{cpu: {1: 1}}},
			{ev: ph("STORAGE", 1), want: held{cpu: {1: 1}, sto: {1: 1}}},
			{ev: rm("CPU", 1), want: held{sto: {1: 1}}},
			{ev: ph("FS", 1), want: held{sto: {1: 2}}}, // vLLM 0.26's medium
			{ev: rm("STORAGE", 1), want: held{sto: {1: 1}}},
		}, Stats{StoredBlocks: 4, RemovedBlocks: 3, Placeholders: 3, PlaceholdersResolved: 3}},

		{"a promotion placeholder after a self-describing CPU store", []step{
			{ev: run("CPU", 1), want: held{cpu: {1: 1}}},
			{ev: ph("CPU", 1), want: held{cpu: {1: 2}}},
			{ev: rm("CPU", 1), want: held{cpu: {1: 1}}},
		}, Stats{StoredBlocks: 2, RemovedBlocks: 1, Placeholders: 1, PlaceholdersResolved: 1}},

		{"a GPU placeholder has no source and is dropped", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("", 1), want: held{gpu: {1: 1}}},
		}, Stats{StoredBlocks: 1, Placeholders: 2, PlaceholdersUnresolved: 2}},

		{"a placeholder of an unknown medium is rejected", []step{
			{ev: run("GPU", 1), want: held{gpu: {1: 1}}},
			{ev: ph("NVME", 1), want: held{gpu: {1: 1}}, err: true},
		}, Stats{StoredBlocks: 1, Placeholders: 1, Invalid: 1}},

		// A hybrid model whose full-attention layers are group 1 and whose
		// sliding-window layers (same hashes) are group 0: events without
		// a kind follow the kind learned for their group.
		{"kind-less events follow their group's learned kind", []step{
			{ev: group(run("GPU", 1), 1, "full_attention"), want: held{gpu: {1: 1}}},
			{ev: group(run("GPU", 1), 0, "sliding_window"), want: held{gpu: {1: 1}}},
			{ev: group(ph("CPU", 1), 0, ""), want: held{gpu: {1: 1}}},
			{ev: group(ph("CPU", 1), 1, ""), want: held{gpu: {1: 1}, cpu: {1: 1}}},
			{ev: group(ph("CPU", 1), 2, ""), want: held{gpu: {1: 1}, cpu: {1: 1}}}, // unlearned, not group 0
			{ev: group(rm("GPU", 1), 0, ""), want: held{gpu: {1: 1}, cpu: {1: 1}}},
			{ev: group(rm("GPU", 1), 1, ""), want: held{cpu: {1: 1}}},
			{ev: group(rm("CPU", 1), 1, ""), want: held{}},
		}, Stats{StoredBlocks: 2, RemovedBlocks: 2, SkippedGroups: 4, Placeholders: 1, PlaceholdersResolved: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newIndex(t)
			seen := map[uint64]bool{}
			for i, s := range tc.steps {
				for _, h := range s.ev.BlockHashes {
					seen[h.Int] = true
				}
				if err := x.Apply(&s.ev); (err != nil) != s.err {
					t.Fatalf("step %d: error %v, want error %v", i, err, s.err)
				}
				checkHeld(t, x, s.want, seen, fmt.Sprintf("step %d", i))
			}
			if got := x.Stats(); got != tc.stats {
				t.Errorf("stats\n got %+v\nwant %+v", got, tc.stats)
			}
		})
	}
}

// takeSnapshot publishes c's pending flips and returns its bitmap.
func takeSnapshot(c *summary.Counting) summary.Snapshot {
	c.TakeDelta()
	return c.Snapshot()
}

// TestPlaceholdersFillTheCPUTier: an engine's GPU runs, then one CPU
// placeholder per block (as the OffloadingConnector sends them): the CPU
// tier's summary matches the whole prefix, the GPU summary is untouched,
// and the CPU tier keeps matching after the GPU copies are evicted.
func TestPlaceholdersFillTheCPUTier(t *testing.T) {
	x := newIndex(t)
	e := newEngine(t, 200)
	toks := tokens(100, 3000)
	evs := e.run(&kvcache.Seq{Tokens: toks})
	apply(t, x, evs)
	chain := (&blockkey.Request{Tokens: toks}).AppendKeys(nil, model, 16)
	if len(chain) != 6 || x.Blocks(tier.GPU) != 6 {
		t.Fatalf("%d keys, %d GPU blocks", len(chain), x.Blocks(tier.GPU))
	}
	gpuBefore := takeSnapshot(x.Summary(tier.GPU))

	var stored []kvevents.Hash
	for _, ev := range evs {
		if ev.Type == kvevents.TypeBlockStored {
			stored = append(stored, ev.BlockHashes...)
		}
	}
	for _, h := range stored {
		p := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{h}, TokenIDs: []uint32{},
			Medium: kvevents.MediumCPU, GroupIdx: kvevents.Some(0)}
		apply(t, x, []kvevents.Event{p})
	}
	if x.Summary(tier.GPU).Pending() || x.Blocks(tier.GPU) != 6 || x.Summary(tier.GPU).Keys() != 6 {
		t.Fatal("placeholders touched the GPU tier")
	}
	for i, h := range stored {
		if k, refs, ok := x.LookupEngine(tier.CPU, h.Int); !ok || k != chain[i] || refs != 1 {
			t.Fatalf("CPU block %d: ok %v refs %d, key ok %v", i, ok, refs, k == chain[i])
		}
	}
	if s := x.Stats(); s.Placeholders != 6 || s.PlaceholdersResolved != 6 || s.PlaceholdersUnresolved != 0 {
		t.Fatalf("stats %+v", s)
	}

	match := func(want0, want1 int) {
		t.Helper()
		f, err := summary.NewFleet(x.Summary(tier.GPU).Params(), 2)
		if err != nil {
			t.Fatal(err)
		}
		gpuSnap := takeSnapshot(x.Summary(tier.GPU))
		for slot, s := range []summary.Snapshot{gpuSnap, takeSnapshot(x.Summary(tier.CPU))} {
			if err := f.SetSnapshot(slot, 1, s); err != nil {
				t.Fatal(err)
			}
		}
		matched := make([]int, f.Slots())
		f.Match(chain, matched)
		if matched[0] != want0 || matched[1] != want1 {
			t.Fatalf("matched GPU %d, CPU %d; want %d, %d", matched[0], matched[1], want0, want1)
		}
	}
	match(6, 6)
	if got := takeSnapshot(x.Summary(tier.GPU)); !slices.Equal(got.Words, gpuBefore.Words) {
		t.Fatal("the GPU bitmap changed")
	}

	// Evict the GPU copies (tail first, as vLLM does): the CPU tier stays.
	for i := len(stored) - 1; i >= 0; i-- {
		apply(t, x, []kvevents.Event{{Type: kvevents.TypeBlockRemoved, BlockHashes: stored[i : i+1],
			Medium: kvevents.MediumGPU, GroupIdx: kvevents.Some(0)}})
	}
	match(0, 6)
	// Drop the CPU tail: the CPU match shortens accordingly.
	apply(t, x, []kvevents.Event{{Type: kvevents.TypeBlockRemoved, BlockHashes: stored[4:], Medium: kvevents.MediumCPU, GroupIdx: kvevents.Some(0)}})
	match(0, 4)
}
