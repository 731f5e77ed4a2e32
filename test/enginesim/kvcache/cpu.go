package kvcache

import (
	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// chunk is one offload block in the CPU tier: OffloadBlocks consecutive
// GPU blocks of some sequence, keyed (as vLLM's OffloadKey) by the digest
// of its last GPU block, which chains to all before it.
type chunk struct {
	key    blockkey.Digest
	hashes []blockkey.Digest // its GPU blocks' digests, in order
	// What a self-describing event carries (kept only when one is made).
	parent    blockkey.Digest
	hasParent bool
	tokens    []uint32
	lora      string
	loraID    int
	// LRU links: prev is less recently used.
	prev, next *chunk
}

// cpuTier is the CPU offload tier: an LRU of whole chunks.
type cpuTier struct {
	capacity   int // in chunks
	chunks     map[blockkey.Digest]*chunk
	head, tail *chunk // least and most recently used
	events     []kvevents.Event
	// Cumulative figures, in GPU blocks.
	stored, inserted, evicted, loaded int
}

func newCPUTier(capacity int) *cpuTier {
	return &cpuTier{capacity: capacity, chunks: map[blockkey.Digest]*chunk{}}
}

func (t *cpuTier) unlink(x *chunk) {
	if x.prev != nil {
		x.prev.next = x.next
	} else {
		t.head = x.next
	}
	if x.next != nil {
		x.next.prev = x.prev
	} else {
		t.tail = x.prev
	}
	x.prev, x.next = nil, nil
}

func (t *cpuTier) pushTail(x *chunk) {
	x.prev, x.next = t.tail, nil
	if t.tail != nil {
		t.tail.next = x
	} else {
		t.head = x
	}
	t.tail = x
}

// touch makes the chunks present most recently used, the first of keys
// the most (vLLM's LRU touches in reverse, so a sequence's tail is
// evicted before its head).
func (t *cpuTier) touch(keys []blockkey.Digest) {
	for i := len(keys) - 1; i >= 0; i-- {
		if x, ok := t.chunks[keys[i]]; ok {
			t.unlink(x)
			t.pushTail(x)
		}
	}
}

// evict removes n chunks, least recently used first, none of protected;
// false, with nothing removed, when fewer than n can go.
func (t *cpuTier) evict(n int, protected map[blockkey.Digest]bool) ([]*chunk, bool) {
	var out []*chunk
	for x := t.head; x != nil && len(out) < n; x = x.next {
		if !protected[x.key] {
			out = append(out, x)
		}
	}
	if len(out) < n {
		return nil, false
	}
	for _, x := range out {
		t.unlink(x)
		delete(t.chunks, x.key)
	}
	return out, true
}

func (t *cpuTier) clear() {
	clear(t.chunks)
	t.head, t.tail, t.events = nil, nil, nil
}

// chunkKeys returns the keys of s's chunks [from, to) (hashed already).
func (c *Cache) chunkKeys(s *Seq, from, to int) []blockkey.Digest {
	ob := c.cfg.chunkBlocks()
	keys := make([]blockkey.Digest, 0, max(to-from, 0))
	for i := from; i < to; i++ {
		keys = append(keys, s.hashes[(i+1)*ob-1])
	}
	return keys
}

// storeFrom offloads the chunks of s completed among its first full
// blocks (with OffloadPromptOnly, only chunks wholly inside the prompt)
// that were not offered yet. The copy is DMA overlapping compute: it
// costs no step time.
func (c *Cache) storeFrom(s *Seq, full int) {
	if c.cpu == nil {
		return
	}
	if c.cfg.OffloadPromptOnly {
		full = min(full, s.promptLen()/c.cfg.BlockSize)
	}
	if to := full / c.cfg.chunkBlocks(); to > s.nextChunk && c.store(s, s.nextChunk, to, false) {
		s.nextChunk = to
	}
}

// store puts s's chunks [from, to) in the tier, as vLLM's prepare_store
// and complete_store do: chunks already there stay (and are touched), the
// others evict the least recently used chunks not in the batch (one
// BlockRemoved), are added in order and published (a BlockStored each);
// then every chunk of s up to to is touched, the first the most recent.
// It is false, with nothing changed, when the batch cannot fit.
func (c *Cache) store(s *Seq, from, to int, pulled bool) bool {
	t := c.cpu
	keys := c.chunkKeys(s, from, to)
	var fresh []int
	protected := make(map[blockkey.Digest]bool, len(keys))
	for i, k := range keys {
		protected[k] = true
		if _, ok := t.chunks[k]; !ok {
			fresh = append(fresh, from+i)
		}
	}
	if len(fresh) == 0 {
		return true
	}
	if over := len(t.chunks) + len(fresh) - t.capacity; over > 0 {
		gone, ok := t.evict(over, protected)
		if !ok {
			return false
		}
		t.evicted += len(gone) * c.cfg.chunkBlocks()
		c.publishRemoved(gone)
	}
	for _, i := range fresh {
		x := c.newChunk(s, i)
		t.chunks[x.key] = x
		t.pushTail(x)
		c.publishStored(x)
	}
	if pulled {
		t.inserted += len(fresh) * c.cfg.chunkBlocks()
	} else {
		t.stored += len(fresh) * c.cfg.chunkBlocks()
	}
	t.touch(c.chunkKeys(s, 0, to))
	return true
}

// newChunk makes chunk i of s, with what its events need.
func (c *Cache) newChunk(s *Seq, i int) *chunk {
	ob, bs := c.cfg.chunkBlocks(), c.cfg.BlockSize
	x := &chunk{key: s.hashes[(i+1)*ob-1], hashes: append([]blockkey.Digest(nil), s.hashes[i*ob:(i+1)*ob]...)}
	if c.cfg.EmitEvents && c.cfg.SelfDescribing {
		if i > 0 {
			x.parent, x.hasParent = s.hashes[i*ob-1], true
		}
		x.tokens = append([]uint32(nil), s.Tokens[i*ob*bs:(i+1)*ob*bs]...)
		x.lora, x.loraID = s.LoRA, s.LoraID
	}
	return x
}

// publishStored publishes a chunk's arrival in the tier: vLLM's
// placeholder (the chunk's key, no tokens, block_size 0, group 0), or
// with SelfDescribing its GPU blocks' hashes, whole-chunk tokens, GPU
// block size, parent, LoRA, group 0 and spec kind. vLLM's self-describing
// events carry no extra_keys (deferred there), so neither do these.
func (c *Cache) publishStored(x *chunk) {
	if !c.cfg.EmitEvents {
		return
	}
	ev := kvevents.Event{Type: kvevents.TypeBlockStored, Medium: kvevents.MediumCPU, GroupIdx: kvevents.Some(0)}
	if !c.cfg.SelfDescribing {
		ev.BlockHashes = []kvevents.Hash{c.wireHash(x.key)}
		c.cpu.events = append(c.cpu.events, ev)
		return
	}
	for _, h := range x.hashes {
		ev.BlockHashes = append(ev.BlockHashes, c.wireHash(h))
	}
	if x.hasParent {
		ev.ParentBlockHash, ev.HasParent = c.wireHash(x.parent), true
	}
	ev.TokenIDs, ev.BlockSize = x.tokens, c.cfg.BlockSize
	ev.LoraName, ev.KVCacheSpecKind = x.lora, "full_attention"
	if x.loraID > 0 {
		ev.LoraID = kvevents.Some(int64(x.loraID))
	}
	c.cpu.events = append(c.cpu.events, ev)
}

// publishRemoved publishes one eviction batch as one BlockRemoved: the
// chunks' keys, or with SelfDescribing all their GPU blocks' hashes.
func (c *Cache) publishRemoved(gone []*chunk) {
	if !c.cfg.EmitEvents {
		return
	}
	ev := kvevents.Event{Type: kvevents.TypeBlockRemoved, Medium: kvevents.MediumCPU, GroupIdx: kvevents.Some(0)}
	for _, x := range gone {
		if c.cfg.SelfDescribing {
			for _, h := range x.hashes {
				ev.BlockHashes = append(ev.BlockHashes, c.wireHash(h))
			}
		} else {
			ev.BlockHashes = append(ev.BlockHashes, c.wireHash(x.key))
		}
	}
	c.cpu.events = append(c.cpu.events, ev)
}

// cpuRunAfter is the number of blocks after a GPU hit of hit blocks that
// the tier holds: from the chunk holding block hit on, the whole chunks
// present, within the len−1 cap, less the part of the first chunk the
// GPU already holds (vLLM's lookup from num_computed_tokens).
func (c *Cache) cpuRunAfter(s *Seq, hit int) int {
	if c.cpu == nil {
		return 0
	}
	ob := c.cfg.chunkBlocks()
	limit := c.capBlocks(s) / ob
	start := hit / ob
	if limit <= start {
		return 0
	}
	c.hashUpTo(s, limit*ob)
	end := start
	for end < limit {
		if _, ok := c.cpu.chunks[s.hashes[(end+1)*ob-1]]; !ok {
			break
		}
		end++
	}
	if end == start {
		return 0
	}
	return end*ob - hit
}

// Probe is the lookup at admission: the GPU prefix hit (as Admit finds
// it) and the blocks of the CPU tier right after it (whole chunks, within
// the len−1 cap), in blocks. Like vLLM's lookup it touches the sequence's
// chunks in the tier; it changes nothing else. Without a tier the second
// is 0.
func (c *Cache) Probe(s *Seq) (gpu, cpu int) {
	gpu = c.lookup(s)
	if c.cpu == nil {
		return gpu, 0
	}
	cpu = c.cpuRunAfter(s, gpu)
	full := len(s.Tokens) / c.cfg.BlockSize / c.cfg.chunkBlocks()
	c.hashUpTo(s, full*c.cfg.chunkBlocks())
	c.cpu.touch(c.chunkKeys(s, 0, full))
	return gpu, cpu
}

// LookupRange is the block range [from, to) of s worth asking a peer for
// after a local hit of hit blocks (GPU and CPU): from the chunk holding
// block hit to the last whole chunk within the len−1 cap; from ≥ to when
// there is nothing to ask for.
func (c *Cache) LookupRange(s *Seq, hit int) (from, to int) {
	ob := c.cfg.chunkBlocks()
	return hit / ob * ob, c.capBlocks(s) / ob * ob
}

// Hashes returns the digests of s's blocks [from, to), which must be full
// blocks of its tokens: what a lookup sends a peer.
func (c *Cache) Hashes(s *Seq, from, to int) []blockkey.Digest {
	if from < 0 || to > len(s.Tokens)/c.cfg.BlockSize || from >= to {
		return nil
	}
	c.hashUpTo(s, to)
	return append([]blockkey.Digest(nil), s.hashes[from:to]...)
}

// CPURun is the source side of a pull: how many leading blocks of hashes
// (GPU-block digests starting at a chunk boundary, as a lookup carries
// them) the CPU tier holds, in whole chunks. The GPU is never consulted,
// and nothing is touched. 0 without a tier.
func (c *Cache) CPURun(hashes []blockkey.Digest) int {
	if c.cpu == nil {
		return 0
	}
	ob := c.cfg.chunkBlocks()
	n := 0
	for (n+1)*ob <= len(hashes) {
		if _, ok := c.cpu.chunks[hashes[(n+1)*ob-1]]; !ok {
			break
		}
		n++
	}
	return n * ob
}

// Insert is the consumer side of a pull: it puts s's blocks [from,
// from+n) (by s's own digests; from at a chunk boundary, n rounded down to
// whole chunks, within s's full blocks) in the CPU tier, as a store does
// (evicting, publishing CPU events), after which they load like any tier
// hit. It returns the blocks the tier now holds of them (0 without a tier,
// or when they cannot fit).
func (c *Cache) Insert(s *Seq, from, n int) int {
	ob := c.cfg.chunkBlocks()
	if c.cpu == nil || from < 0 || from%ob != 0 || n < ob {
		return 0
	}
	to := min(from+n, len(s.Tokens)/c.cfg.BlockSize) / ob
	if to <= from/ob {
		return 0
	}
	c.hashUpTo(s, to*ob)
	if !c.store(s, from/ob, to, true) {
		return 0
	}
	return to*ob - from
}

// ResetCPU empties the CPU tier without events, as vLLM's
// reset_prefix_cache with reset_connector (reset_external=true) resets the
// offloading manager, which publishes nothing.
func (c *Cache) ResetCPU() {
	if c.cpu != nil {
		c.cpu.clear()
	}
}

// CPUStats are the CPU tier's figures, in GPU blocks.
type CPUStats struct {
	// Capacity and Used are the tier's size and the blocks it holds.
	Capacity, Used int
	// Stored counts the blocks copied in from the GPU (D2H), Inserted
	// those put in by pulls, Evicted those dropped for room, Loaded those
	// copied back to the GPU (H2D), since the cache was made.
	Stored, Inserted, Evicted, Loaded int
}

// CPU returns the tier's figures (all 0 without one).
func (c *Cache) CPU() CPUStats {
	if c.cpu == nil {
		return CPUStats{}
	}
	ob := c.cfg.chunkBlocks()
	t := c.cpu
	return CPUStats{Capacity: t.capacity * ob, Used: len(t.chunks) * ob, Stored: t.stored, Inserted: t.inserted, Evicted: t.evicted, Loaded: t.loaded}
}

// CPUUsage is the fraction of the tier's capacity in use (0 without one).
func (c *Cache) CPUUsage() float64 {
	if c.cpu == nil {
		return 0
	}
	return float64(len(c.cpu.chunks)) / float64(c.cpu.capacity)
}

// InCPU reports whether the CPU tier holds the chunk ending with the block
// of digest d.
func (c *Cache) InCPU(d blockkey.Digest) bool {
	if c.cpu == nil {
		return false
	}
	_, ok := c.cpu.chunks[d]
	return ok
}
