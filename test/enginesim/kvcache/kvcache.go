package kvcache

import (
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
)

// Config sizes a cache.
type Config struct {
	// NumBlocks is vLLM's num_gpu_blocks. Block 0 is the null block, never
	// handed out, so NumBlocks-1 blocks hold KV.
	NumBlocks int
	// BlockSize is tokens per block.
	BlockSize int
	// Seed is the NONE_HASH seed (PYTHONHASHSEED, or blockkey.DefaultSeed).
	Seed string
	// RawHashes publishes raw 32-byte digests instead of the 64-bit form
	// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
	RawHashes bool
	// EmitEvents turns KV events on (enable_kv_cache_events).
	EmitEvents bool

	// CPUBlocks is the CPU offload tier's capacity in GPU-block units
	// (vLLM's OffloadingConnector with CPUOffloadingSpec: cpu_bytes_to_use
	// over the bytes of a block); 0 is no tier, and the cache then
	// behaves exactly as it did before the tier existed. It holds
	// CPUBlocks / OffloadBlocks chunks.
	CPUBlocks int
	// OffloadBlocks is the offload block (vLLM's block_size there, a
	// multiple of the GPU block) in GPU blocks: the tier stores, evicts
	// and loads whole chunks of OffloadBlocks consecutive GPU blocks,
	// aligned from block 0. 0 means 1 (vLLM's default: the GPU block).
	OffloadBlocks int
	// OffloadPromptOnly offloads only chunks wholly inside the prompt
	// (vLLM's offload_prompt_only, default true there; the zero value
	// here is false, so a shell sets it).
	OffloadPromptOnly bool
	// SelfDescribing publishes the tier's events with their tokens
	// (vLLM's self_describing_kv_events) instead of placeholders.
	SelfDescribing bool
}

// chunkBlocks is the offload chunk in GPU blocks.
func (c Config) chunkBlocks() int { return max(c.OffloadBlocks, 1) }

// Validate checks c.
func (c Config) Validate() error {
	if c.NumBlocks < 2 {
		return fmt.Errorf("kvcache: num_gpu_blocks %d: need at least 2 (one is the null block)", c.NumBlocks)
	}
	if c.BlockSize <= 0 {
		return fmt.Errorf("kvcache: block size %d must be positive", c.BlockSize)
	}
	if c.OffloadBlocks < 0 {
		return fmt.Errorf("kvcache: offload block of %d GPU blocks must not be negative (0 means 1)", c.OffloadBlocks)
	}
	if c.CPUBlocks < 0 || c.CPUBlocks > 0 && c.CPUBlocks < c.chunkBlocks() {
		return fmt.Errorf("kvcache: CPU tier of %d blocks: want 0 (none) or at least one offload block of %d", c.CPUBlocks, c.chunkBlocks())
	}
	return nil
}

// block is one physical KV block.
type block struct {
	ref        int32
	prev, next int32 // free-queue links; -1 when not queued
	queued     bool
	hashed     bool
	hash       blockkey.Digest
}

// Cache is a paged KV cache with vLLM v1's prefix caching. It is not safe
// for concurrent use; the engine's scheduler owns it.
type Cache struct {
	cfg    Config
	hasher *blockkey.SHA256CBOR
	blocks []block
	// free queue: blocks with ref 0, least recently freed at the head.
	head, tail int32
	numFree    int
	// cached maps a full block's digest to a block holding it; further
	// copies of the same content (computed concurrently) sit in dups.
	cached map[blockkey.Digest]int32
	dups   map[blockkey.Digest][]int32
	events []kvevents.Event
	// cpu is the offload tier (nil without one); its events follow the
	// GPU's in every batch, as vLLM appends the connector's.
	cpu *cpuTier
}

// New returns an empty cache.
func New(cfg Config) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cache{
		cfg:    cfg,
		hasher: blockkey.NewSHA256CBOR(cfg.Seed),
		blocks: make([]block, cfg.NumBlocks),
		cached: make(map[blockkey.Digest]int32),
		dups:   make(map[blockkey.Digest][]int32),
	}
	if cfg.CPUBlocks > 0 {
		c.cpu = newCPUTier(cfg.CPUBlocks / cfg.chunkBlocks())
	}
	c.rebuild()
	return c, nil
}

// rebuild puts every block but the null block in the free queue, in order.
func (c *Cache) rebuild() {
	c.head, c.tail, c.numFree = -1, -1, 0
	for i := range c.blocks {
		c.blocks[i] = block{prev: -1, next: -1}
	}
	for i := 1; i < len(c.blocks); i++ {
		c.pushTail(int32(i))
	}
}

func (c *Cache) pushTail(id int32) {
	b := &c.blocks[id]
	b.prev, b.next, b.queued = c.tail, -1, true
	if c.tail >= 0 {
		c.blocks[c.tail].next = id
	} else {
		c.head = id
	}
	c.tail = id
	c.numFree++
}

func (c *Cache) unlink(id int32) {
	b := &c.blocks[id]
	if b.prev >= 0 {
		c.blocks[b.prev].next = b.next
	} else {
		c.head = b.next
	}
	if b.next >= 0 {
		c.blocks[b.next].prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next, b.queued = -1, -1, false
	c.numFree--
}

// BlockSize returns tokens per block.
func (c *Cache) BlockSize() int { return c.cfg.BlockSize }

// NumBlocks returns num_gpu_blocks.
func (c *Cache) NumBlocks() int { return c.cfg.NumBlocks }

// NumFree returns the blocks not held by any request (cached or not).
func (c *Cache) NumFree() int { return c.numFree }

// NumCached returns the blocks holding a cached (hashed) full block.
func (c *Cache) NumCached() int {
	n := len(c.cached)
	for _, d := range c.dups {
		n += len(d)
	}
	return n
}

// Usage is vllm:kv_cache_usage_perc: the fraction of usable blocks held by
// live requests; cached-but-free blocks count as free.
func (c *Cache) Usage() float64 {
	return 1 - float64(c.numFree)/float64(c.cfg.NumBlocks-1)
}

// Seq is one request's KV state.
type Seq struct {
	Tokens []uint32 // prompt, then generated tokens
	LoRA   string   // adapter name, "" for none
	LoraID int      // adapter id for the deprecated lora_id field; 0 for none
	Salt   string   // cache_salt, "" for none
	// PromptLen is the prompt's length within Tokens (what
	// OffloadPromptOnly offloads); 0 takes the tokens the sequence holds
	// at its first admission.
	PromptLen int

	computed  int     // tokens whose KV is computed
	blocks    []int32 // physical blocks, in order
	numCached int     // leading blocks registered in the cache
	hashes    []blockkey.Digest
	admitted  bool
	hitTokens int // GPU prefix hit at the first admission
	loaded    int // tokens loaded from the CPU tier at the first admission
	nextChunk int // chunks offered to the CPU tier (vLLM's _next_stored_block_idx)
}

// Computed returns the tokens whose KV is computed.
func (s *Seq) Computed() int { return s.computed }

// CachedTokens returns the tokens not computed at the sequence's first
// admission, in tokens: its GPU prefix hit and what it loaded from the
// CPU tier (vLLM's num_cached_tokens, which counts the connector's tokens
// too); -1 before admission.
func (s *Seq) CachedTokens() int {
	if !s.admitted {
		return -1
	}
	return s.hitTokens + s.loaded
}

// GPUHitTokens returns the GPU prefix-cache hit at the first admission
// (vllm:prefix_cache_hits' part), -1 before admission.
func (s *Seq) GPUHitTokens() int {
	if !s.admitted {
		return -1
	}
	return s.hitTokens
}

// LoadedTokens returns the tokens loaded from the CPU tier at the first
// admission (the connector's part: vllm:external_prefix_cache_hits), -1
// before admission.
func (s *Seq) LoadedTokens() int {
	if !s.admitted {
		return -1
	}
	return s.loaded
}

// promptLen is the prompt's length: PromptLen, else the tokens held.
func (s *Seq) promptLen() int {
	if s.PromptLen > 0 {
		return min(s.PromptLen, len(s.Tokens))
	}
	return len(s.Tokens)
}

// NumBlocks returns the physical blocks the sequence holds.
func (s *Seq) NumBlocks() int { return len(s.blocks) }

// extraKeys returns vLLM's extra keys of block i: the LoRA name on every
// block, the cache salt on block 0 (no multimodal input here).
func (s *Seq) extraKeys(i int) []any {
	var keys []any
	if s.LoRA != "" {
		keys = append(keys, s.LoRA)
	}
	if i == 0 && s.Salt != "" {
		keys = append(keys, s.Salt)
	}
	return keys
}

// hashUpTo makes sure the digests of the first n full blocks are known.
func (c *Cache) hashUpTo(s *Seq, n int) {
	bs := c.cfg.BlockSize
	for i := len(s.hashes); i < n; i++ {
		parent := c.hasher.NoneHash()
		if i > 0 {
			parent = s.hashes[i-1]
		}
		d, err := c.hasher.Block(parent, s.Tokens[i*bs:(i+1)*bs], s.extraKeys(i))
		if err != nil { // extra keys are strings only: cannot happen
			panic(fmt.Sprintf("kvcache: hashing block %d: %v", i, err))
		}
		s.hashes = append(s.hashes, d)
	}
}

// lookup returns the number of leading blocks of s found in the cache,
// capped so that at least one token is computed (vLLM recomputes the last
// prompt token even when everything is cached).
func (c *Cache) lookup(s *Seq) int {
	max := c.capBlocks(s)
	if max <= 0 {
		return 0
	}
	c.hashUpTo(s, max)
	n := 0
	for n < max {
		if _, ok := c.cached[s.hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// capBlocks is the most blocks a hit may cover: at least the last token
// is computed.
func (c *Cache) capBlocks(s *Seq) int { return (len(s.Tokens) - 1) / c.cfg.BlockSize }

// ErrNoSpace is returned by Schedule when the free blocks cannot hold the
// tokens asked for; nothing changed.
var ErrNoSpace = errors.New("kvcache: not enough free blocks")

// ErrAdmitted is returned by Admit for a sequence that already holds blocks.
var ErrAdmitted = errors.New("kvcache: sequence already holds blocks")

// Admit starts (or, after preemption, restarts) s: it looks up the prefix
// cache, takes the hit blocks, and reserves room for up to budget of the
// remaining prompt tokens. It returns how many tokens to compute now, and
// ErrNoSpace, with nothing changed, when the free blocks cannot hold them.
// It loads nothing from the CPU tier: AdmitLoad(s, budget, 0).
func (c *Cache) Admit(s *Seq, budget int) (int, error) {
	return c.AdmitLoad(s, budget, 0)
}

// AdmitLoad is Admit that also loads up to load blocks from the CPU tier:
// the run of tier blocks right after the GPU hit found now (whole chunks,
// within the len−1 cap), re-checked here, so that blocks evicted from the
// tier since a Probe are computed instead. The loaded blocks take fresh
// GPU blocks, count as computed without being computed, and are cached on
// the GPU and published as a GPU BlockStored run (vLLM caches loaded
// blocks in its prefix cache). The H2D copy's time is the caller's to
// charge. It returns the tokens to compute now.
func (c *Cache) AdmitLoad(s *Seq, budget, load int) (int, error) {
	if len(s.blocks) != 0 {
		return 0, ErrAdmitted
	}
	if !s.admitted && s.PromptLen <= 0 {
		s.PromptLen = len(s.Tokens)
	}
	s.computed, s.numCached = 0, 0
	hit := c.lookup(s)
	loaded := 0
	if load > 0 {
		loaded = min(load, c.cpuRunAfter(s, hit))
	}
	bs := c.cfg.BlockSize
	numNew := min(len(s.Tokens)-(hit+loaded)*bs, budget)
	if err := c.reserve(s, hit, loaded, numNew); err != nil {
		return 0, err
	}
	s.computed, s.numCached = hit*bs, hit
	if loaded > 0 {
		s.computed += loaded * bs
		c.cacheFull(s, hit+loaded)
		c.cpu.loaded += loaded
		s.nextChunk = (hit + loaded) / c.cfg.chunkBlocks()
	}
	if !s.admitted {
		s.admitted, s.hitTokens, s.loaded = true, hit*bs, loaded*bs
	}
	return numNew, nil
}

// Schedule reserves room for numNew more tokens of an admitted sequence,
// returning ErrNoSpace, with nothing changed, when the blocks are not there.
func (c *Cache) Schedule(s *Seq, numNew int) error {
	return c.reserve(s, 0, 0, numNew)
}

// reserve takes hit cached blocks (s holding none) and enough free blocks
// for loaded blocks and numNew tokens past them, or changes nothing.
func (c *Cache) reserve(s *Seq, hit, loaded, numNew int) error {
	bs := c.cfg.BlockSize
	computed := s.computed + (hit+loaded)*bs
	need := (computed+numNew+bs-1)/bs - len(s.blocks) - hit
	// Hit blocks sitting in the free queue stop being free when taken.
	free := c.numFree
	for i := 0; i < hit; i++ {
		if c.blocks[c.cached[s.hashes[i]]].ref == 0 {
			free--
		}
	}
	if need > free {
		return ErrNoSpace
	}
	for i := 0; i < hit; i++ {
		id := c.cached[s.hashes[i]]
		c.touch(id)
		s.blocks = append(s.blocks, id)
	}
	for i := 0; i < need; i++ {
		s.blocks = append(s.blocks, c.pop())
	}
	return nil
}

func (c *Cache) touch(id int32) {
	b := &c.blocks[id]
	if b.ref == 0 && b.queued {
		c.unlink(id)
	}
	b.ref++
}

// pop takes the least recently freed block, evicting its cached content.
func (c *Cache) pop() int32 {
	id := c.head
	c.unlink(id)
	b := &c.blocks[id]
	if b.hashed {
		c.uncache(id)
	}
	b.ref = 1
	return id
}

// uncache removes block id's content from the cache and publishes the
// removal, as vLLM does for every evicted copy.
func (c *Cache) uncache(id int32) {
	b := &c.blocks[id]
	d := b.hash
	if c.cached[d] == id {
		if rest := c.dups[d]; len(rest) > 0 {
			c.cached[d] = rest[0]
			if len(rest) == 1 {
				delete(c.dups, d)
			} else {
				c.dups[d] = rest[1:]
			}
		} else {
			delete(c.cached, d)
		}
	} else if rest := c.dups[d]; len(rest) > 0 {
		for i, x := range rest {
			if x == id {
				rest = append(rest[:i:i], rest[i+1:]...)
				break
			}
		}
		if len(rest) == 0 {
			delete(c.dups, d)
		} else {
			c.dups[d] = rest
		}
	}
	b.hashed, b.hash = false, blockkey.Digest{}
	if c.cfg.EmitEvents {
		c.events = append(c.events, kvevents.Event{
			Type:        kvevents.TypeBlockRemoved,
			BlockHashes: []kvevents.Hash{c.wireHash(d)},
			Medium:      kvevents.MediumGPU,
			GroupIdx:    kvevents.Some(0),
		})
	}
}

func (c *Cache) wireHash(d blockkey.Digest) kvevents.Hash {
	if c.cfg.RawHashes {
		return kvevents.RawHash(d[:])
	}
	return kvevents.IntHash(blockkey.EventHash(d))
}

// Commit records that the KV of numNew more tokens of s is computed, and
// caches the blocks that became full, publishing them as one BlockStored
// run; with a CPU tier, it then offloads the chunks completed (storeFrom).
func (c *Cache) Commit(s *Seq, numNew int) {
	bs := c.cfg.BlockSize
	s.computed += numNew
	if s.computed > len(s.Tokens) {
		s.computed = len(s.Tokens)
	}
	full := s.computed / bs
	if full > len(s.blocks) {
		full = len(s.blocks)
	}
	c.cacheFull(s, full)
	c.storeFrom(s, full)
}

// cacheFull caches s's blocks from its numCached up to full, publishing
// them as one GPU BlockStored run.
func (c *Cache) cacheFull(s *Seq, full int) {
	bs := c.cfg.BlockSize
	if full <= s.numCached {
		return
	}
	c.hashUpTo(s, full)
	first := s.numCached
	for i := first; i < full; i++ {
		id := s.blocks[i]
		b := &c.blocks[id]
		if b.hashed {
			continue
		}
		d := s.hashes[i]
		b.hashed, b.hash = true, d
		if _, ok := c.cached[d]; ok {
			c.dups[d] = append(c.dups[d], id)
		} else {
			c.cached[d] = id
		}
	}
	s.numCached = full
	if !c.cfg.EmitEvents {
		return
	}
	ev := kvevents.Event{
		Type:            kvevents.TypeBlockStored,
		TokenIDs:        append([]uint32(nil), s.Tokens[first*bs:full*bs]...),
		BlockSize:       bs,
		Medium:          kvevents.MediumGPU,
		LoraName:        s.LoRA,
		GroupIdx:        kvevents.Some(0),
		KVCacheSpecKind: "full_attention",
	}
	if s.LoraID > 0 {
		ev.LoraID = kvevents.Some(int64(s.LoraID))
	}
	if first > 0 {
		ev.ParentBlockHash, ev.HasParent = c.wireHash(s.hashes[first-1]), true
	}
	for i := first; i < full; i++ {
		ev.BlockHashes = append(ev.BlockHashes, c.wireHash(s.hashes[i]))
		if keys := s.extraKeys(i); len(keys) > 0 {
			ev.ExtraKeys = append(ev.ExtraKeys, keys)
		} else {
			ev.ExtraKeys = append(ev.ExtraKeys, nil)
		}
	}
	c.events = append(c.events, ev)
}

// Free releases s's blocks, last block first, so that a request's tail is
// evicted before its head (vLLM frees in reverse order).
func (c *Cache) Free(s *Seq) {
	for i := len(s.blocks) - 1; i >= 0; i-- {
		id := s.blocks[i]
		b := &c.blocks[id]
		b.ref--
		if b.ref == 0 {
			c.pushTail(id)
		}
	}
	s.blocks = s.blocks[:0]
	s.computed, s.numCached = 0, 0
}

// ErrBlocksInUse is returned by Reset while requests hold blocks.
var ErrBlocksInUse = errors.New("kvcache: blocks are in use")

// Reset drops every cached block, as /reset_prefix_cache does, publishing
// AllBlocksCleared. Like vLLM it refuses while requests hold blocks. The
// CPU tier is kept (vLLM resets the connector only when asked,
// reset_external=true: ResetCPU).
func (c *Cache) Reset() error {
	if used := c.cfg.NumBlocks - 1 - c.numFree; used > 0 {
		return fmt.Errorf("%w: %d blocks not freed yet", ErrBlocksInUse, used)
	}
	c.rebuild()
	clear(c.cached)
	clear(c.dups)
	if c.cfg.EmitEvents {
		c.events = append(c.events, kvevents.Event{Type: kvevents.TypeAllBlocksCleared})
	}
	return nil
}

// Wipe empties the cache without publishing anything: a process restart.
// Sequences holding blocks must be dropped by the caller.
func (c *Cache) Wipe() {
	c.rebuild()
	clear(c.cached)
	clear(c.dups)
	c.events = c.events[:0]
	if c.cpu != nil {
		c.cpu.clear()
	}
}

// TakeEvents returns the events since the last call and forgets them: the
// GPU's, then the CPU tier's (vLLM publishes the KV cache manager's
// events, then the connector's, in one batch a step).
func (c *Cache) TakeEvents() []kvevents.Event {
	if c.cpu != nil && len(c.cpu.events) > 0 {
		c.events = append(c.events, c.cpu.events...)
		c.cpu.events = nil
	}
	if len(c.events) == 0 {
		return nil
	}
	ev := c.events
	c.events = nil
	return ev
}

// Contains reports whether a block with this digest is cached.
func (c *Cache) Contains(d blockkey.Digest) bool {
	_, ok := c.cached[d]
	return ok
}
