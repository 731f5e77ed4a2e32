package kvcache

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/vectors"
)

func newCache(t *testing.T, blocks, bs int) *Cache {
	t.Helper()
	c, err := New(Config{NumBlocks: blocks, BlockSize: bs, Seed: "42", EmitEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func seqOf(n int, base uint32) *Seq {
	s := &Seq{}
	for i := 0; i < n; i++ {
		s.Tokens = append(s.Tokens, base+uint32(i))
	}
	return s
}

// prefill schedules and computes all of s's tokens.
func prefill(t *testing.T, c *Cache, s *Seq) {
	t.Helper()
	n, err := c.Admit(s, len(s.Tokens))
	if err != nil {
		t.Fatal(err)
	}
	c.Commit(s, n)
}

func TestReproducesVLLMCaptures(t *testing.T) {
	for name, load := range map[string]func() (*vectors.Capture, error){"base": vectors.Base, "lora": vectors.LoRA} {
		cap, err := load()
		if err != nil {
			t.Fatal(err)
		}
		c := newCache(t, 100, cap.BlockSize)
		s := &Seq{Tokens: cap.TokenIDs}
		if cap.LoraName != nil {
			s.LoRA, s.LoraID = *cap.LoraName, 1
		}
		prefill(t, c, s)
		ev := c.TakeEvents()
		if len(ev) != 1 || ev[0].Type != kvevents.TypeBlockStored {
			t.Fatalf("%s: events %+v", name, ev)
		}
		e := ev[0]
		if e.HasParent || e.BlockSize != 16 || len(e.TokenIDs) != 400 || e.Medium != "GPU" || e.LoraName != s.LoRA {
			t.Fatalf("%s: event %+v", name, e)
		}
		for i, h := range e.BlockHashes {
			if h.Int != cap.BlockHashes[i] {
				t.Fatalf("%s: block %d hash %d, vLLM %d", name, i, h.Int, cap.BlockHashes[i])
			}
			if s.LoRA != "" && (len(e.ExtraKeys[i]) != 1 || e.ExtraKeys[i][0] != "Alice") {
				t.Fatalf("%s: extra keys %v", name, e.ExtraKeys[i])
			}
		}
		if err := e.Validate(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPrefixHitCappedAtLenMinusOne(t *testing.T) {
	c := newCache(t, 100, 16)
	a := seqOf(64, 1000)
	prefill(t, c, a)
	c.Free(a)
	for _, tc := range []struct {
		tokens int
		hit    int
	}{{64, 48}, {65, 64}, {80, 64}, {63, 48}, {16, 0}, {17, 16}} {
		s := seqOf(tc.tokens, 1000)
		if n, err := c.Admit(s, 1<<20); err != nil || n != tc.tokens-tc.hit {
			t.Fatalf("Admit = %d, %v", n, err)
		}
		if s.CachedTokens() != tc.hit || s.Computed() != tc.hit {
			t.Errorf("%d tokens: hit %d (computed %d), want %d", tc.tokens, s.CachedTokens(), s.Computed(), tc.hit)
		}
		c.Commit(s, tc.tokens-tc.hit)
		c.Free(s)
	}
	// A different first token shares nothing.
	s := seqOf(64, 1001)
	if _, err := c.Admit(s, 64); err != nil || s.CachedTokens() != 0 {
		t.Fatalf("unrelated prompt hit %d (%v)", s.CachedTokens(), err)
	}
}

func TestSaltIsolatesAndIsPublished(t *testing.T) {
	c := newCache(t, 100, 16)
	a := seqOf(48, 7)
	a.Salt = "tenant-a"
	prefill(t, c, a)
	c.Free(a)
	ev := c.TakeEvents()[0]
	if len(ev.ExtraKeys) != 3 || len(ev.ExtraKeys[0]) != 1 || ev.ExtraKeys[0][0] != "tenant-a" || ev.ExtraKeys[1] != nil {
		t.Fatalf("extra keys %v", ev.ExtraKeys)
	}
	for _, salt := range []string{"", "tenant-b"} {
		b := seqOf(48, 7)
		b.Salt = salt
		if _, err := c.Admit(b, 48); err != nil || b.CachedTokens() != 0 {
			t.Fatalf("salt %q hit %d of tenant-a's blocks", salt, b.CachedTokens())
		}
		c.Free(b)
	}
	same := seqOf(48, 7)
	same.Salt = "tenant-a"
	if _, err := c.Admit(same, 16); err != nil || same.CachedTokens() != 32 {
		t.Fatalf("same salt hit %d", same.CachedTokens())
	}
}

func TestEvictionTailFirstAndBlockRemoved(t *testing.T) {
	c := newCache(t, 9, 4) // 8 usable blocks
	a := seqOf(16, 100)    // 4 blocks
	prefill(t, c, a)
	storedA := c.TakeEvents()[0].BlockHashes
	c.Free(a)
	if c.Usage() != 0 || c.NumCached() != 4 {
		t.Fatalf("usage %v cached %d", c.Usage(), c.NumCached())
	}
	b := seqOf(24, 500) // 6 blocks: 4 never-used blocks, then 2 of a's
	prefill(t, c, b)
	var removed []uint64
	for _, e := range c.TakeEvents() {
		if e.Type == kvevents.TypeBlockRemoved {
			if len(e.BlockHashes) != 1 {
				t.Fatalf("removal of %d hashes", len(e.BlockHashes))
			}
			removed = append(removed, e.BlockHashes[0].Int)
		}
	}
	// a's tail goes first: blocks 3, then 2.
	if len(removed) != 2 || removed[0] != storedA[3].Int || removed[1] != storedA[2].Int {
		t.Fatalf("removed %v, a stored %v", removed, storedA)
	}
	if c.Usage() != 6.0/8 {
		t.Fatalf("usage %v", c.Usage())
	}
	// a's head is still cached.
	c.Free(b)
	again := seqOf(16, 100)
	if _, err := c.Admit(again, 8); err != nil || again.CachedTokens() != 8 {
		t.Fatalf("hit %d after partial eviction (%v)", again.CachedTokens(), err)
	}
}

func TestNoSpaceChangesNothing(t *testing.T) {
	c := newCache(t, 5, 4) // 4 usable blocks
	s := seqOf(20, 1)
	if _, err := c.Admit(s, 20); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Schedule = %v", err)
	}
	if c.NumFree() != 4 || s.NumBlocks() != 0 || s.CachedTokens() != -1 {
		t.Fatalf("state changed: free %d blocks %d", c.NumFree(), s.NumBlocks())
	}
	// Hit blocks in the free queue count as taken when checking room.
	a := seqOf(12, 1)
	prefill(t, c, a)
	c.Free(a)
	b := seqOf(13, 1) // hit 12 (3 blocks), needs 1 more: fits exactly
	if n, err := c.Admit(b, 1); err != nil || n != 1 || b.CachedTokens() != 12 {
		t.Fatalf("exact fit: %v, hit %d", err, b.CachedTokens())
	}
	d := seqOf(5, 900)
	if _, err := c.Admit(d, 5); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("overcommit: %v", err)
	}
}

func TestDecodeBlocksAreStoredAsTheyFill(t *testing.T) {
	c := newCache(t, 50, 4)
	s := seqOf(6, 1)
	prefill(t, c, s) // 1 full block stored
	first := c.TakeEvents()
	if len(first) != 1 || len(first[0].BlockHashes) != 1 {
		t.Fatalf("prefill events %+v", first)
	}
	var stored []kvevents.Event
	for i := 0; i < 6; i++ { // generate; each step computes the previous token
		s.Tokens = append(s.Tokens, uint32(9000+i))
		if err := c.Schedule(s, 1); err != nil {
			t.Fatal(err)
		}
		c.Commit(s, 1)
		stored = append(stored, c.TakeEvents()...)
	}
	// computed = 12 tokens → blocks 1 and 2 filled during decode.
	if len(stored) != 2 || !stored[0].HasParent || stored[0].ParentBlockHash != first[0].BlockHashes[0] ||
		stored[1].ParentBlockHash != stored[0].BlockHashes[0] {
		t.Fatalf("decode events %+v", stored)
	}
	if got := stored[1].TokenIDs; got[0] != 9002 || len(got) != 4 {
		t.Fatalf("decode block tokens %v", got)
	}
}

func TestConcurrentCopiesArePublishedEach(t *testing.T) {
	c := newCache(t, 20, 4)
	a, b := seqOf(9, 1), seqOf(9, 1)
	for _, s := range []*Seq{a, b} { // both scheduled before either computes
		if _, err := c.Admit(s, 9); err != nil {
			t.Fatal(err)
		}
	}
	c.Commit(a, 9)
	c.Commit(b, 9)
	ev := c.TakeEvents()
	if len(ev) != 2 || ev[0].BlockHashes[0] != ev[1].BlockHashes[0] || c.NumCached() != 4 {
		t.Fatalf("events %d, cached %d", len(ev), c.NumCached())
	}
	c.Free(a)
	c.Free(b)
	// Evict everything one block at a time; the content stays findable until
	// its last copy goes, and each copy's eviction is published.
	removed := 0
	big := seqOf(4*19, 5000)
	if _, err := c.Admit(big, len(big.Tokens)); err != nil {
		t.Fatal(err)
	}
	for _, e := range c.TakeEvents() {
		if e.Type == kvevents.TypeBlockRemoved {
			removed++
		}
	}
	if removed != 4 || c.NumCached() != 0 {
		t.Fatalf("removed %d, cached %d", removed, c.NumCached())
	}
}

func TestResetAndWipe(t *testing.T) {
	c := newCache(t, 20, 4)
	s := seqOf(8, 1)
	prefill(t, c, s)
	c.TakeEvents()
	if err := c.Reset(); !errors.Is(err, ErrBlocksInUse) {
		t.Fatalf("Reset while in use: %v", err)
	}
	c.Free(s)
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	ev := c.TakeEvents()
	if len(ev) != 1 || ev[0].Type != kvevents.TypeAllBlocksCleared || c.NumCached() != 0 || c.NumFree() != 19 {
		t.Fatalf("after reset: %+v cached %d free %d", ev, c.NumCached(), c.NumFree())
	}
	again := seqOf(8, 1)
	if _, err := c.Admit(again, 8); err != nil || again.CachedTokens() != 0 {
		t.Fatal("hit after reset")
	}
	c.Commit(again, 8)
	c.Wipe()
	if len(c.TakeEvents()) != 0 || c.NumCached() != 0 || c.NumFree() != 19 {
		t.Fatal("Wipe left state or events")
	}
}

func TestPreemptedSequenceRecomputes(t *testing.T) {
	c := newCache(t, 20, 4)
	s := seqOf(10, 1)
	prefill(t, c, s)
	c.Free(s) // preempted
	if n, err := c.Admit(s, 100); err != nil || n != 2 {
		t.Fatal(n, err)
	}
	if _, err := c.Admit(s, 1); !errors.Is(err, ErrAdmitted) {
		t.Fatal("second Admit accepted")
	}
	// It finds its own cached blocks again; num_cached_tokens keeps the first admission's value.
	if s.Computed() != 8 || s.CachedTokens() != 0 {
		t.Fatalf("computed %d cached %d", s.Computed(), s.CachedTokens())
	}
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []Config{{NumBlocks: 1, BlockSize: 16}, {NumBlocks: 10, BlockSize: 0}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	c, err := New(Config{NumBlocks: 10, BlockSize: 4, RawHashes: true, EmitEvents: true})
	if err != nil {
		t.Fatal(err)
	}
	s := seqOf(4, 1)
	if _, err := c.Admit(s, 4); err != nil {
		t.Fatal(err)
	}
	c.Commit(s, 4)
	if h := c.TakeEvents()[0].BlockHashes[0]; len(h.Raw) != 32 {
		t.Fatalf("raw hash %+v", h)
	}
}
