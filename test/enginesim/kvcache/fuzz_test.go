package kvcache

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/internal/kvevents"
)

// FuzzCPUTier drives a tiered cache with prompts from a few shared
// prefixes (admitting with loads, computing in chunks, decoding, freeing,
// inserting pulled blocks, resetting) and checks after every operation:
// the tier within its capacity and its LRU list whole; every event valid;
// the placeholder stores and removals, replayed, naming exactly the
// chunks the tier holds; a sequence's computed tokens never past its
// tokens, and what it loaded never past its len−1 cap.
func FuzzCPUTier(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{3, 3, 3, 200, 7, 7, 1, 250, 9, 42, 17, 99})
	f.Fuzz(func(t *testing.T, ops []byte) {
		ob := 1 + len(ops)%3
		c, err := New(Config{NumBlocks: 24, BlockSize: 2, EmitEvents: true, CPUBlocks: 6 * ob, OffloadBlocks: ob, OffloadPromptOnly: len(ops)%2 == 0})
		if err != nil {
			t.Fatal(err)
		}
		held := map[kvevents.Hash]bool{}
		var live []*Seq
		for i, op := range ops {
			switch op % 6 {
			case 0, 1: // a new prompt: prefix op/6%4, length 3..34
				s := seqOf(3+int(op)%32, 1000*uint32(op/6%4))
				gpu, cpu := c.Probe(s)
				n, err := c.AdmitLoad(s, 1+int(op)%16, cpu)
				if errors.Is(err, ErrNoSpace) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if s.Computed() > (len(s.Tokens)-1)/2*2 || s.Computed() < gpu*2 || n < 1 {
					t.Fatalf("op %d: computed %d of %d (probe %d+%d), %d to compute", i, s.Computed(), len(s.Tokens), gpu, cpu, n)
				}
				c.Commit(s, n)
				live = append(live, s)
			case 2: // compute or decode the oldest further
				if len(live) == 0 {
					continue
				}
				s := live[0]
				if s.Computed() == len(s.Tokens) {
					s.Tokens = append(s.Tokens, uint32(op))
				}
				if c.Schedule(s, 1) == nil {
					c.Commit(s, 1)
				}
			case 3: // free the newest
				if len(live) > 0 {
					c.Free(live[len(live)-1])
					live = live[:len(live)-1]
				}
			case 4: // a pull of a prompt's first blocks into the tier
				s := seqOf(3+int(op)%32, 1000*uint32(op/6%4))
				c.Insert(s, 0, int(op)%12)
			case 5:
				if op%4 == 1 {
					c.ResetCPU()
					clear(held)
				} else if len(live) == 0 && c.Reset() != nil {
					t.Fatal("reset refused with nothing held")
				}
			}
			for _, e := range c.TakeEvents() {
				if err := e.Validate(); err != nil {
					t.Fatalf("op %d: %+v: %v", i, e, err)
				}
				if e.Medium != kvevents.MediumCPU {
					continue
				}
				for _, h := range e.BlockHashes {
					if e.Type == kvevents.TypeBlockStored {
						held[h] = true
					} else if !held[h] {
						t.Fatalf("op %d: removal of %v, never stored", i, h)
					} else {
						delete(held, h)
					}
				}
			}
			checkTier(t, c, held)
		}
	})
}

// checkTier checks the tier's LRU list against its map and capacity, and
// that held (replayed from events) names its chunks exactly.
func checkTier(t *testing.T, c *Cache, held map[kvevents.Hash]bool) {
	t.Helper()
	tier := c.cpu
	n := 0
	for x := tier.head; x != nil; x = x.next {
		if tier.chunks[x.key] != x || (x.next != nil && x.next.prev != x) {
			t.Fatal("LRU list broken")
		}
		if !held[c.wireHash(x.key)] {
			t.Fatalf("chunk %x held but not published", x.key[:4])
		}
		n++
	}
	if n != len(tier.chunks) || n > tier.capacity || len(held) != n || c.CPU().Used != n*c.cfg.chunkBlocks() {
		t.Fatalf("%d chunks listed, %d mapped, %d published, capacity %d", n, len(tier.chunks), len(held), tier.capacity)
	}
}
