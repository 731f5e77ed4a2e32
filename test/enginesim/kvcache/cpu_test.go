package kvcache

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// tiered is a cache of gpu blocks (one the null block) of 4 tokens with
// a CPU tier of cpu blocks in chunks of ob, offloading prompts only.
func tiered(t *testing.T, gpu, cpu, ob int, selfDescribing bool) *Cache {
	t.Helper()
	c, err := New(Config{NumBlocks: gpu, BlockSize: 4, Seed: "42", EmitEvents: true, CPUBlocks: cpu, OffloadBlocks: ob,
		OffloadPromptOnly: true, SelfDescribing: selfDescribing})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wire is the 64-bit wire form of s's block digests [from, to).
func wire(c *Cache, s *Seq, from, to int) []kvevents.Hash {
	var out []kvevents.Hash
	for _, d := range c.Hashes(s, from, to) {
		out = append(out, kvevents.IntHash(blockkey.EventHash(d)))
	}
	return out
}

// byMedium splits events by medium and type.
func byMedium(events []kvevents.Event, medium string, typ kvevents.EventType) []kvevents.Event {
	var out []kvevents.Event
	for _, e := range events {
		if e.Medium == medium && e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// TestCPUPlaceholderEvents: a prefill offloads its prompt's full blocks;
// the tier publishes vLLM's placeholders after the GPU's run, one
// BlockStored per chunk carrying only its key; every field is checked.
func TestCPUPlaceholderEvents(t *testing.T) {
	c := tiered(t, 64, 32, 1, false)
	s := seqOf(18, 100) // 4 full blocks and 2 tokens
	s.LoRA, s.LoraID, s.Salt = "ad", 3, "salt"
	prefill(t, c, s)
	ev := c.TakeEvents()
	if len(ev) != 5 || ev[0].Medium != kvevents.MediumGPU {
		t.Fatalf("events %+v: want the GPU run, then 4 CPU stores", ev)
	}
	hashes := wire(c, s, 0, 4)
	for i, e := range ev[1:] {
		want := kvevents.Event{Type: kvevents.TypeBlockStored, BlockHashes: hashes[i : i+1], Medium: "CPU", GroupIdx: kvevents.Some(0)}
		if e.Type != want.Type || !slices.Equal(e.BlockHashes, want.BlockHashes) || e.HasParent || len(e.TokenIDs) != 0 ||
			e.BlockSize != 0 || e.LoraID.Valid || e.LoraName != "" || e.ExtraKeys != nil || e.Medium != "CPU" ||
			e.GroupIdx != want.GroupIdx || e.KVCacheSpecKind != "" || !e.Placeholder() || e.Validate() != nil {
			t.Errorf("CPU store %d: %+v, want %+v", i, e, want)
		}
	}
	if st := c.CPU(); st.Used != 4 || st.Stored != 4 || st.Capacity != 32 || c.CPUUsage() != 4.0/32 {
		t.Errorf("figures %+v, usage %v", st, c.CPUUsage())
	}
}

// TestCPUSelfDescribingEvents: chunks of two GPU blocks, self-describing:
// a BlockStored per chunk with both blocks' hashes, the chunk's tokens,
// the GPU block size, the parent, LoRA, group and kind, no extra keys;
// an eviction lists the evicted chunks' GPU blocks' hashes.
func TestCPUSelfDescribingEvents(t *testing.T) {
	c := tiered(t, 64, 4, 2, true) // two chunks
	s := seqOf(17, 100)            // 4 full blocks: chunks 0 and 1
	s.LoRA, s.LoraID = "ad", 3
	prefill(t, c, s)
	ev := byMedium(c.TakeEvents(), "CPU", kvevents.TypeBlockStored)
	hashes := wire(c, s, 0, 4)
	if len(ev) != 2 {
		t.Fatalf("%d CPU stores, want 2", len(ev))
	}
	for i, e := range ev {
		if !slices.Equal(e.BlockHashes, hashes[2*i:2*i+2]) || e.HasParent != (i > 0) || (i > 0 && e.ParentBlockHash != hashes[1]) ||
			!slices.Equal(e.TokenIDs, s.Tokens[8*i:8*i+8]) || e.BlockSize != 4 || e.LoraID != kvevents.Some(3) || e.LoraName != "ad" ||
			e.ExtraKeys != nil || e.GroupIdx != kvevents.Some(0) || e.KVCacheSpecKind != "full_attention" || e.Placeholder() || e.Validate() != nil {
			t.Errorf("chunk %d: %+v", i, e)
		}
	}
	// Another prompt of two chunks evicts s's (its tail first), in one removal.
	o := seqOf(17, 900)
	prefill(t, c, o)
	rm := byMedium(c.TakeEvents(), "CPU", kvevents.TypeBlockRemoved)
	want := append(append([]kvevents.Hash(nil), hashes[2:4]...), hashes[0:2]...)
	if len(rm) != 1 || !slices.Equal(rm[0].BlockHashes, want) || rm[0].GroupIdx != kvevents.Some(0) {
		t.Fatalf("removals %+v, want one of %v", rm, want)
	}
	if st := c.CPU(); st.Evicted != 4 || st.Used != 4 {
		t.Errorf("figures %+v", st)
	}
}

// TestCPULRU: a full tier evicts its least recently used chunks in one
// removal per store batch, a sequence's tail before its head; a lookup
// touches; chunks already there are not stored again.
func TestCPULRU(t *testing.T) {
	c := tiered(t, 64, 4, 1, false)
	a := seqOf(12, 100) // 3 blocks
	prefill(t, c, a)
	c.Free(a)
	b := seqOf(8, 500) // 2 blocks: one eviction (a's tail)
	prefill(t, c, b)
	c.Free(b)
	ha, hb := wire(c, a, 0, 3), wire(c, b, 0, 2)
	rm := byMedium(c.TakeEvents(), "CPU", kvevents.TypeBlockRemoved)
	if len(rm) != 1 || !slices.Equal(rm[0].BlockHashes, ha[2:3]) {
		t.Fatalf("first removal %+v, want a's last block %v", rm, ha[2])
	}
	// Probing a touches its two chunks left: b's are now the oldest.
	if gpu, cpu := c.Probe(seqOf(12, 100)); gpu != 2 || cpu != 0 {
		t.Fatalf("probe a: %d GPU, %d CPU (a is still on the GPU)", gpu, cpu)
	}
	d := seqOf(12, 700) // 3 blocks: evicts b's tail, then b's head
	prefill(t, c, d)
	rm = byMedium(c.TakeEvents(), "CPU", kvevents.TypeBlockRemoved)
	if want := []kvevents.Hash{hb[1], hb[0], ha[1]}; len(rm) != 1 || !slices.Equal(rm[0].BlockHashes, want[:3]) {
		t.Fatalf("removal %+v, want %v", rm, want)
	}
	// Storing d again stores nothing new.
	again := seqOf(13, 700)
	prefill(t, c, again)
	if ev := byMedium(c.TakeEvents(), "CPU", kvevents.TypeBlockStored); len(ev) != 0 {
		t.Fatalf("a stored chunk stored again: %+v", ev)
	}
}

// TestCPUPromptOnly: with OffloadPromptOnly decode blocks never reach the
// tier; without it they do, as they fill.
func TestCPUPromptOnly(t *testing.T) {
	for _, promptOnly := range []bool{true, false} {
		c, err := New(Config{NumBlocks: 64, BlockSize: 4, EmitEvents: true, CPUBlocks: 32, OffloadPromptOnly: promptOnly})
		if err != nil {
			t.Fatal(err)
		}
		s := seqOf(6, 1) // one full prompt block
		prefill(t, c, s)
		for i := 0; i < 10; i++ { // decode: blocks 1 (mixed), 2 and 3 fill
			s.Tokens = append(s.Tokens, uint32(9000+i))
			if err := c.Schedule(s, 1); err != nil {
				t.Fatal(err)
			}
			c.Commit(s, 1)
		}
		want := 1
		if !promptOnly {
			want = 4
		}
		if got := c.CPU().Stored; got != want {
			t.Errorf("prompt only %v: %d blocks offloaded, want %d", promptOnly, got, want)
		}
	}
}

// TestCPULoad: blocks evicted from the GPU but held by the tier are found
// by Probe right after the GPU hit, within the len−1 cap, and loaded by
// AdmitLoad: computed without compute, cached and published on the GPU,
// counted as cached (loaded) tokens.
func TestCPULoad(t *testing.T) {
	for _, c := range []struct {
		name        string
		tokens      int // of the revisiting prompt
		ob          int
		gpu, cpu    int // probe
		load        int // asked
		loaded      int // done
		toCompute   int
		gpuStoredAt int // first block of the GPU run published at admission
	}{
		{"all in CPU, capped at len−1", 16, 1, 0, 3, 3, 3, 4, 0},
		{"one more token: all four blocks", 17, 1, 0, 4, 4, 4, 1, 0},
		{"asked for fewer", 17, 1, 0, 4, 2, 2, 9, 0},
		{"chunks of two: the cap takes a whole chunk", 16, 2, 0, 2, 2, 2, 8, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := tiered(t, 6, 16, c.ob, false) // 5 usable GPU blocks
			a := seqOf(17, 100)
			prefill(t, k, a)
			k.Free(a)
			flush := seqOf(20, 5000) // 5 blocks: evicts all of a from the GPU
			prefill(t, k, flush)
			k.Free(flush)
			k.TakeEvents()
			s := seqOf(c.tokens, 100)
			if gpu, cpu := k.Probe(s); gpu != c.gpu || cpu != c.cpu {
				t.Fatalf("probe: %d GPU, %d CPU; want %d, %d", gpu, cpu, c.gpu, c.cpu)
			}
			n, err := k.AdmitLoad(s, 1<<20, c.load)
			if err != nil || n != c.toCompute || s.Computed() != c.loaded*4 || s.CachedTokens() != c.loaded*4 ||
				s.LoadedTokens() != c.loaded*4 || s.GPUHitTokens() != 0 {
				t.Fatalf("admit: %d to compute (%v), computed %d, cached %d; want %d, %d loaded", n, err, s.Computed(), s.CachedTokens(), c.toCompute, c.loaded)
			}
			gpuStored := byMedium(k.TakeEvents(), "GPU", kvevents.TypeBlockStored)
			if len(gpuStored) != 1 || !slices.Equal(gpuStored[0].BlockHashes, wire(k, s, 0, c.loaded)) {
				t.Fatalf("GPU stores at admission %+v, want the %d loaded blocks", gpuStored, c.loaded)
			}
			if k.CPU().Loaded != c.loaded {
				t.Errorf("loaded figure %d", k.CPU().Loaded)
			}
			k.Commit(s, n)
			k.Free(s)
			if again := seqOf(c.tokens, 100); k.lookup(again) != min(c.tokens-1, len(s.Tokens))/4 {
				t.Errorf("after the load the GPU holds %d blocks", k.lookup(again))
			}
		})
	}
}

// TestCPULoadRechecks: a block evicted from the tier between the probe
// and the admission is computed, not assumed; a GPU hit not on a chunk
// boundary loads the rest of its chunk.
func TestCPULoadRechecks(t *testing.T) {
	k := tiered(t, 64, 8, 1, false)
	b := seqOf(17, 7000)
	prefill(t, k, b)
	k.Free(b)
	if err := k.Reset(); err != nil { // the GPU forgets b; the tier keeps it
		t.Fatal(err)
	}
	probe := seqOf(17, 7000)
	if gpu, cpu := k.Probe(probe); gpu != 0 || cpu != 4 {
		t.Fatalf("probe: %d GPU, %d CPU; want 0, 4", gpu, cpu)
	}
	other := seqOf(25, 8000) // 6 blocks: evicts b's last two from the tier
	prefill(t, k, other)
	k.Free(other)
	if n, err := k.AdmitLoad(probe, 100, 4); err != nil || probe.LoadedTokens() != 8 || n != 9 {
		t.Fatalf("the probe said 4 blocks; loaded %d tokens, %d to compute (%v); want 8 and 9", probe.LoadedTokens(), n, err)
	}

	// Chunks of 2, GPU hit of 3 blocks: the chunk holding block 3 is
	// loaded from block 3 on.
	k = tiered(t, 20, 8, 2, false)
	a := seqOf(17, 100) // 4 blocks: chunks 0, 1
	prefill(t, k, a)
	k.Free(a)
	if gpu, cpu := k.Probe(seqOf(13, 100)); gpu != 3 || cpu != 0 {
		t.Fatalf("13 tokens: %d, %d; want a GPU hit of 3 and no whole chunk within the cap", gpu, cpu)
	}
	// Evict a's block 3 from the GPU only: after the never-used blocks,
	// a's tail is at the free queue's head.
	filler := seqOf(4*16, 9000)
	if _, err := k.Admit(filler, 4*16); err != nil {
		t.Fatal(err)
	}
	k.Free(filler)
	s := seqOf(17, 100)
	if gpu, cpu := k.Probe(s); gpu != 3 || cpu != 1 {
		t.Fatalf("probe: %d GPU, %d CPU; want 3 and the rest of chunk 1", gpu, cpu)
	}
	if n, err := k.AdmitLoad(s, 100, 1); err != nil || n != 1 || s.Computed() != 16 || s.CachedTokens() != 16 {
		t.Fatalf("admit: %d to compute (%v), computed %d", n, err, s.Computed())
	}
}

// TestPeerPull: a consumer asks for the blocks beyond its local hit; the
// source answers from its tier only (not its GPU); the consumer inserts
// what came, publishes CPU stores, and finds them as tier hits.
func TestPeerPull(t *testing.T) {
	src := tiered(t, 64, 8, 2, false)
	a := seqOf(25, 100) // 6 blocks: 3 chunks
	prefill(t, src, a)
	src.Free(a)
	dst := tiered(t, 64, 8, 2, false)
	s := seqOf(25, 100)
	gpu, cpu := dst.Probe(s)
	from, to := dst.LookupRange(s, gpu+cpu)
	if from != 0 || to != 6 {
		t.Fatalf("range [%d, %d), want [0, 6)", from, to)
	}
	hashes := dst.Hashes(s, from, to)
	if got := src.CPURun(hashes); got != 6 {
		t.Fatalf("source holds %d blocks, want 6", got)
	}
	if got := src.CPURun(hashes[:5]); got != 4 {
		t.Fatalf("an odd count answers %d, want whole chunks (4)", got)
	}
	// A source holding blocks on its GPU only serves nothing.
	gpuOnly := newCache(t, 64, 4)
	prefill(t, gpuOnly, seqOf(25, 100))
	if gpuOnly.CPURun(hashes) != 0 {
		t.Fatal("a source without a tier served its GPU")
	}
	if n := dst.Insert(s, from, 5); n != 4 {
		t.Fatalf("inserted %d blocks, want 4 (whole chunks)", n)
	}
	stores := byMedium(dst.TakeEvents(), "CPU", kvevents.TypeBlockStored)
	if len(stores) != 2 || dst.CPU().Inserted != 4 || dst.CPU().Stored != 0 {
		t.Fatalf("stores %+v, figures %+v", stores, dst.CPU())
	}
	if gpu, cpu := dst.Probe(s); gpu != 0 || cpu != 4 {
		t.Fatalf("after the pull: %d GPU, %d CPU", gpu, cpu)
	}
	if dst.Insert(s, 1, 4) != 0 || dst.Insert(s, 0, 1) != 0 {
		t.Fatal("an unaligned or partial insert was taken")
	}
}

// TestCPUResets: Reset keeps the tier and publishes only the GPU's
// clearing; ResetCPU empties the tier silently; Wipe empties both
// silently.
func TestCPUResets(t *testing.T) {
	c := tiered(t, 20, 8, 1, false)
	s := seqOf(9, 1)
	prefill(t, c, s)
	c.Free(s)
	c.TakeEvents()
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if ev := c.TakeEvents(); len(ev) != 1 || ev[0].Type != kvevents.TypeAllBlocksCleared {
		t.Fatalf("reset events %+v", ev)
	}
	if gpu, cpu := c.Probe(seqOf(9, 1)); gpu != 0 || cpu != 2 {
		t.Fatalf("after Reset: %d GPU, %d CPU; want the tier kept", gpu, cpu)
	}
	c.ResetCPU()
	if _, cpu := c.Probe(seqOf(9, 1)); cpu != 0 || len(c.TakeEvents()) != 0 || c.CPU().Used != 0 {
		t.Fatal("ResetCPU left blocks or made events")
	}
	prefill(t, c, seqOf(9, 1))
	c.Wipe()
	if gpu, cpu := c.Probe(seqOf(9, 1)); gpu != 0 || cpu != 0 || len(c.TakeEvents()) != 0 {
		t.Fatal("Wipe left blocks or events")
	}
}

// TestNoTierIsInert: without a tier, Probe is the GPU lookup, nothing is
// stored, loaded or published on the CPU, and the peer calls do nothing.
func TestNoTierIsInert(t *testing.T) {
	c := newCache(t, 20, 4)
	s := seqOf(9, 1)
	prefill(t, c, s)
	c.Free(s)
	if ev := c.TakeEvents(); len(ev) != 1 || ev[0].Medium != "GPU" {
		t.Fatalf("events %+v", ev)
	}
	again := seqOf(9, 1)
	if gpu, cpu := c.Probe(again); gpu != 2 || cpu != 0 {
		t.Fatalf("probe %d, %d", gpu, cpu)
	}
	if n, err := c.AdmitLoad(again, 10, 5); err != nil || n != 1 || again.LoadedTokens() != 0 {
		t.Fatalf("AdmitLoad without a tier: %d, %v", n, err)
	}
	if c.CPURun(c.Hashes(again, 0, 2)) != 0 || c.Insert(again, 0, 2) != 0 || c.CPU() != (CPUStats{}) || c.CPUUsage() != 0 {
		t.Fatal("peer calls did something without a tier")
	}
}

// TestCPUConfigValidate: the tier's settings are checked.
func TestCPUConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{NumBlocks: 10, BlockSize: 4, CPUBlocks: 8}, true},
		{Config{NumBlocks: 10, BlockSize: 4, CPUBlocks: 8, OffloadBlocks: 8}, true},
		{Config{NumBlocks: 10, BlockSize: 4, CPUBlocks: 0, OffloadBlocks: 8}, true},
		{Config{NumBlocks: 10, BlockSize: 4, CPUBlocks: -1}, false},
		{Config{NumBlocks: 10, BlockSize: 4, CPUBlocks: 4, OffloadBlocks: 8}, false},
		{Config{NumBlocks: 10, BlockSize: 4, CPUBlocks: 8, OffloadBlocks: -1}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.cfg, err)
		}
	}
	_ = errors.New
}
