package index

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/test/enginesim/kvcache"
	"github.com/kvroute/kvroute/test/vectors"
)

const model = "Qwen/Qwen3-0.6B"

func newIndex(t *testing.T) *Index {
	t.Helper()
	x, err := New(Config{Model: model, Params: summary.ForCapacity(4096)})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// engine runs requests through the simulator's cache and returns its events.
type engine struct {
	t *testing.T
	c *kvcache.Cache
}

func newEngine(t *testing.T, blocks int) *engine {
	c, err := kvcache.New(kvcache.Config{NumBlocks: blocks, BlockSize: 16, Seed: "42", EmitEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	return &engine{t, c}
}

func (e *engine) run(s *kvcache.Seq) []kvevents.Event {
	n, err := e.c.Admit(s, 1<<20)
	if err != nil {
		e.t.Fatal(err)
	}
	e.c.Commit(s, n)
	e.c.Free(s)
	return e.c.TakeEvents()
}

func apply(t *testing.T, x *Index, evs []kvevents.Event) {
	t.Helper()
	for i := range evs {
		if err := x.Apply(&evs[i]); err != nil {
			t.Fatal(err)
		}
	}
}

func tokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// TestKeysMatchBlockkey: the keys the index derives from real engine
// events equal the keys the picker computes from the request, for plain,
// salted, LoRA and continued (parent-chained) runs.
func TestKeysMatchBlockkey(t *testing.T) {
	for _, c := range []struct{ salt, lora string }{{"", ""}, {"tenant-a", ""}, {"", "Alice"}, {"tenant-a", "Alice"}, {"Alice", "Alice"}} {
		x := newIndex(t)
		e := newEngine(t, 200)
		first := tokens(100, 1000)
		longer := append(append([]uint32{}, first...), tokens(90, 5000)...)
		for _, toks := range [][]uint32{first, longer} {
			evs := e.run(&kvcache.Seq{Tokens: toks, Salt: c.salt, LoRA: c.lora, LoraID: 1})
			apply(t, x, evs)
		}
		req := blockkey.Request{Tokens: longer, CacheSalt: c.salt, LoRA: c.lora}
		want := req.AppendKeys(nil, model, 16)
		vllm, err := blockkey.NewSHA256CBOR("42").VLLMChain(&req, 16)
		if err != nil {
			t.Fatal(err)
		}
		if x.Blocks(TierGPU) != len(want) {
			t.Fatalf("%+v: %d blocks indexed, want %d", c, x.Blocks(TierGPU), len(want))
		}
		for i, d := range vllm {
			k, refs, ok := x.LookupEngine(TierGPU, blockkey.EventHash(d))
			if !ok || k != want[i] || refs != 1 {
				t.Fatalf("%+v: block %d: key %v ok %v refs %d, want %v", c, i, k, ok, refs, want[i])
			}
			if !x.Summary(TierGPU).MayContain(want[i]) {
				t.Fatal("summary misses an indexed key")
			}
		}
	}
}

// TestSaltsDisjoint: different salts give disjoint canonical keys.
func TestSaltsDisjoint(t *testing.T) {
	x := newIndex(t)
	e := newEngine(t, 200)
	toks := tokens(64, 7)
	for _, salt := range []string{"a", "b", ""} {
		apply(t, x, e.run(&kvcache.Seq{Tokens: toks, Salt: salt}))
	}
	seen := map[blockkey.Key]bool{}
	for _, salt := range []string{"a", "b", ""} {
		req := blockkey.Request{Tokens: toks, CacheSalt: salt}
		for _, k := range req.AppendKeys(nil, model, 16) {
			if seen[k] {
				t.Fatal("two salts share a key")
			}
			seen[k] = true
			if len(x.LookupCanonical(TierGPU, k)) != 1 {
				t.Fatalf("salt %q key not indexed once", salt)
			}
		}
	}
}

// TestCopiesAreCounted: content held by two physical blocks stays indexed
// until both copies are removed.
func TestCopiesAreCounted(t *testing.T) {
	x := newIndex(t)
	stored := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(11)},
		TokenIDs: tokens(16, 1), BlockSize: 16, Medium: "GPU"}
	removed := kvevents.Event{Type: kvevents.TypeBlockRemoved, BlockHashes: []kvevents.Hash{kvevents.IntHash(11)}, Medium: "GPU"}
	apply(t, x, []kvevents.Event{stored, stored, removed})
	k, refs, ok := x.LookupEngine(TierGPU, 11)
	if !ok || refs != 1 || !x.Summary(TierGPU).MayContain(k) {
		t.Fatalf("after one of two removals: ok %v refs %d", ok, refs)
	}
	apply(t, x, []kvevents.Event{removed, removed})
	if _, _, ok := x.LookupEngine(TierGPU, 11); ok || x.Summary(TierGPU).MayContain(k) || x.Summary(TierGPU).Keys() != 0 {
		t.Fatal("key survived its last copy")
	}
	if s := x.Stats(); s.UnknownRemovals != 1 || s.RemovedBlocks != 2 || s.StoredBlocks != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestTiersGroupsAndBadRuns(t *testing.T) {
	x := newIndex(t)
	run := func(medium, kind string, group kvevents.OptInt) kvevents.Event {
		return kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(5)},
			TokenIDs: tokens(16, 1), BlockSize: 16, Medium: medium, KVCacheSpecKind: kind, GroupIdx: group}
	}
	apply(t, x, []kvevents.Event{
		run("GPU", "full_attention", kvevents.Some(0)),
		run("CPU", "", kvevents.OptInt{}),
		run("FS", "mla_attention", kvevents.Some(0)),
		run("GPU", "sliding_window", kvevents.Some(1)),
		run("GPU", "", kvevents.Some(1)),
		{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(9)}, TokenIDs: []uint32{}, Medium: "CPU"},
		{Type: kvevents.TypeUnknown, TypeName: "BlockUpdated"},
	})
	if x.Blocks(TierGPU) != 1 || x.Blocks(TierCPU) != 1 || x.Blocks(TierStorage) != 1 {
		t.Fatalf("tiers %v: %d %d %d", x.Tiers(), x.Blocks(TierGPU), x.Blocks(TierCPU), x.Blocks(TierStorage))
	}
	s := x.Stats()
	if s.SkippedGroups != 2 || s.Placeholders != 1 || s.UnknownEvents != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Removing from GPU leaves CPU alone.
	apply(t, x, []kvevents.Event{{Type: kvevents.TypeBlockRemoved, BlockHashes: []kvevents.Hash{kvevents.IntHash(5)}, Medium: "GPU"}})
	if x.Blocks(TierGPU) != 0 || x.Blocks(TierCPU) != 1 {
		t.Fatal("a GPU removal touched another tier")
	}
	bad := []kvevents.Event{
		{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(1)}, TokenIDs: tokens(16, 1), BlockSize: 16, Medium: "NVME"},
		{Type: kvevents.TypeBlockRemoved, BlockHashes: []kvevents.Hash{kvevents.IntHash(1)}, Medium: "junk"},
		{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(1)}, TokenIDs: tokens(15, 1), BlockSize: 16},
		{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(1)}, TokenIDs: tokens(32, 1), BlockSize: 32},
		{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(1)}, TokenIDs: tokens(16, 1), BlockSize: 16,
			ExtraKeys: [][]any{{map[string]any{}}}},
		{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(1)}, TokenIDs: tokens(16, 1), BlockSize: 16,
			HasParent: true, ParentBlockHash: kvevents.IntHash(77), ExtraKeys: [][]any{{"salt-on-a-child"}}},
	}
	parent := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(77)}, TokenIDs: tokens(16, 500), BlockSize: 16}
	apply(t, x, []kvevents.Event{parent})
	for i := range bad {
		if err := x.Apply(&bad[i]); err == nil {
			t.Errorf("bad run %d accepted", i)
		}
	}
	if len(x.Tiers()) != 3 {
		t.Fatalf("tiers %v: an unknown medium made one", x.Tiers())
	}
	orphan := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(2)}, TokenIDs: tokens(16, 1),
		BlockSize: 16, HasParent: true, ParentBlockHash: kvevents.IntHash(12345)}
	if err := x.Apply(&orphan); !errors.Is(err, ErrUnresolvedParent) || x.Stats().UnresolvedParents != 1 {
		t.Fatalf("orphan run: %v", err)
	}
	apply(t, x, []kvevents.Event{{Type: kvevents.TypeAllBlocksCleared}})
	if x.Blocks(TierCPU) != 0 || x.Stats().Clears != 1 || x.Summary(TierCPU).Fill() != 0 {
		t.Fatal("clear left blocks")
	}
}

// TestVectorBatch: the shared msgpack sample (map layout) indexes its two
// blocks, then removes one.
func TestVectorBatch(t *testing.T) {
	batches, _, _, err := vectors.EventBatches()
	if err != nil {
		t.Fatal(err)
	}
	b, err := kvevents.Decode(batches[0].Payload)
	if err != nil {
		t.Fatal(err)
	}
	x := newIndex(t)
	for i := range b.Events[:2] {
		if err := x.Apply(&b.Events[i]); err != nil {
			t.Fatal(err)
		}
	}
	if x.Blocks(TierGPU) != 1 {
		t.Fatalf("%d blocks", x.Blocks(TierGPU))
	}
	c, err := vectors.Base()
	if err != nil {
		t.Fatal(err)
	}
	want := (&blockkey.Request{Tokens: c.TokenIDs[:16]}).AppendKeys(nil, model, 16)
	if k, _, ok := x.LookupEngine(TierGPU, c.BlockHashes[0]); !ok || k != want[0] {
		t.Fatal("vector block 0 keyed differently")
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{Params: summary.ForCapacity(1)}); err == nil {
		t.Error("empty model accepted")
	}
	if _, err := New(Config{Model: "m"}); err == nil {
		t.Error("zero params accepted")
	}
}
