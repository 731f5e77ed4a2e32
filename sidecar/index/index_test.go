package index

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/test/enginesim/kvcache"
	"github.com/kvroute/kvroute/test/vectors"
)

const model = "Qwen/Qwen3-0.6B"

func newIndex(t *testing.T) *Index {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Model, cfg.Params = model, summary.ForCapacity(4096)
	x, err := New(cfg)
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
		if x.Blocks(tier.GPU) != len(want) {
			t.Fatalf("%+v: %d blocks indexed, want %d", c, x.Blocks(tier.GPU), len(want))
		}
		for i, d := range vllm {
			k, refs, ok := x.LookupEngine(tier.GPU, blockkey.EventHash(d))
			if !ok || k != want[i] || refs != 1 {
				t.Fatalf("%+v: block %d: key %v ok %v refs %d, want %v", c, i, k, ok, refs, want[i])
			}
			if !x.Summary(tier.GPU).MayContain(want[i]) {
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
			if len(x.LookupCanonical(tier.GPU, k)) != 1 {
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
	k, refs, ok := x.LookupEngine(tier.GPU, 11)
	if !ok || refs != 1 || !x.Summary(tier.GPU).MayContain(k) {
		t.Fatalf("after one of two removals: ok %v refs %d", ok, refs)
	}
	apply(t, x, []kvevents.Event{removed, removed})
	if _, _, ok := x.LookupEngine(tier.GPU, 11); ok || x.Summary(tier.GPU).MayContain(k) || x.Summary(tier.GPU).Keys() != 0 {
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
	if x.Blocks(tier.GPU) != 1 || x.Blocks(tier.CPU) != 1 || x.Blocks(tier.Storage) != 1 {
		t.Fatalf("tiers %v: %d %d %d", x.Tiers(), x.Blocks(tier.GPU), x.Blocks(tier.CPU), x.Blocks(tier.Storage))
	}
	s := x.Stats()
	if s.SkippedGroups != 2 || s.Placeholders != 1 || s.UnknownEvents != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Removing from GPU leaves CPU alone.
	apply(t, x, []kvevents.Event{{Type: kvevents.TypeBlockRemoved, BlockHashes: []kvevents.Hash{kvevents.IntHash(5)}, Medium: "GPU"}})
	if x.Blocks(tier.GPU) != 0 || x.Blocks(tier.CPU) != 1 {
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
	if x.Blocks(tier.CPU) != 0 || x.Stats().Clears != 1 || x.Summary(tier.CPU).Fill() != 0 {
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
	if x.Blocks(tier.GPU) != 1 {
		t.Fatalf("%d blocks", x.Blocks(tier.GPU))
	}
	c, err := vectors.Base()
	if err != nil {
		t.Fatal(err)
	}
	want := (&blockkey.Request{Tokens: c.TokenIDs[:16]}).AppendKeys(nil, model, 16)
	if k, _, ok := x.LookupEngine(tier.GPU, c.BlockHashes[0]); !ok || k != want[0] {
		t.Fatal("vector block 0 keyed differently")
	}
}

// TestNewValidates: DefaultConfig plus a model is valid; a zero or
// contradictory value is rejected, never filled in.
func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		ok   bool
	}{
		{"defaults and a model", func(c *Config) {}, true},
		{"a known block size", func(c *Config) { c.BlockSize, c.LearnBlockSize = 16, false }, true},
		{"the zero Config", func(c *Config) { *c = Config{} }, false},
		{"empty model", func(c *Config) { c.Model = "" }, false},
		{"zero params", func(c *Config) { c.Params = summary.Params{} }, false},
		{"no block size, none to learn", func(c *Config) { c.LearnBlockSize = false }, false},
		{"negative block size", func(c *Config) { c.BlockSize, c.LearnBlockSize = -16, false }, false},
		{"a block size and learning", func(c *Config) { c.BlockSize = 16 }, false},
	} {
		cfg := DefaultConfig()
		cfg.Model = "m"
		tc.edit(&cfg)
		if _, err := New(cfg); (err == nil) != tc.ok {
			t.Errorf("%s: New error %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestKnownBlockSize: with the block size given, a run of another size
// is rejected even as the first run.
func TestKnownBlockSize(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Model, cfg.BlockSize, cfg.LearnBlockSize = model, 16, false
	x, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(1)}, TokenIDs: tokens(32, 1), BlockSize: 32}
	if err := x.Apply(&run); err == nil || x.BlockSize() != 16 {
		t.Fatalf("a 32-token run on a 16-token endpoint: %v, block size %d", err, x.BlockSize())
	}
}

// TestTierOrder: Tiers lists only tiers seen, in tier order.
func TestTierOrder(t *testing.T) {
	x := newIndex(t)
	for _, medium := range []string{"STORAGE", "GPU"} {
		apply(t, x, []kvevents.Event{{Type: kvevents.TypeBlockStored, BlockHashes: []kvevents.Hash{kvevents.IntHash(3)},
			TokenIDs: tokens(16, 1), BlockSize: 16, Medium: medium}})
	}
	if got := x.Tiers(); len(got) != 2 || got[0] != tier.GPU || got[1] != tier.Storage {
		t.Fatalf("tiers %v", got)
	}
	if x.Summary(tier.CPU) != nil || x.Blocks(tier.Tier(tier.Count)) != 0 || x.Summary(tier.Tier(200)) != nil {
		t.Fatal("an unseen or invalid tier has a summary or blocks")
	}
}
