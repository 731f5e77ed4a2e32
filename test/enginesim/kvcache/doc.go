// Package kvcache is the simulated engine's paged KV cache with vLLM v1's
// prefix caching, as an I/O-free core the scheduler drives.
//
// Contract, as vLLM v1 behaves:
//   - Blocks are BlockSize tokens; block 0 is the null block. Only full
//     blocks are cached, under vLLM's chained sha256_cbor digests (seeded
//     NONE_HASH; the LoRA name on every block; cache_salt on block 0).
//   - A new sequence takes the longest cached prefix, capped so that at least
//     its last token is recomputed (hit ≤ len−1 tokens, whole blocks).
//   - Freed blocks join the tail of an LRU free queue, a request's last block
//     first; allocation takes the head, evicting cached content, which
//     publishes BlockRemoved (one hash per event).
//   - Blocks that become full and computed are cached and published as one
//     BlockStored run per sequence per step, with parent_block_hash,
//     token_ids, block_size, lora_id/lora_name, medium "GPU", extra_keys,
//     group_idx 0 and kv_cache_spec_kind "full_attention".
//   - The same content computed concurrently may sit in several blocks; each
//     copy is published when stored and when evicted.
//   - Reset drops all cached blocks (AllBlocksCleared) and, like vLLM,
//     refuses while requests hold blocks; Wipe is a silent process restart.
//
// The CPU offload tier (Config.CPUBlocks > 0), as vLLM's OffloadingConnector
// with CPUOffloadingSpec and the LRU policy (kv-transfer.md §1). Without it
// (CPUBlocks 0) nothing below happens and the cache is what it was before
// the tier existed, event for event.
//   - The tier holds whole chunks of OffloadBlocks GPU blocks, aligned from
//     block 0, keyed by the digest of their last block (vLLM's OffloadKey).
//     When Commit makes blocks full and computed, the chunks they complete
//     (only those wholly inside the prompt with OffloadPromptOnly; Seq
//     .PromptLen says where it ends) are copied in, once each: a chunk
//     already there stays; the others evict least recently used chunks
//     not in the batch and are added; then all the sequence's chunks are
//     touched, its first the most recent (so its tail goes first). A batch
//     that cannot fit is skipped and offered again at the next Commit. The
//     copy is DMA overlapping compute: it costs no step time.
//   - Its events have medium "CPU" and follow the GPU's events in each
//     batch (TakeEvents). Default (vLLM's placeholders): a BlockStored per
//     chunk with its key's hash only, token_ids empty, block_size 0, no
//     parent and group_idx 0; one BlockRemoved per eviction batch with the
//     evicted keys. SelfDescribing: a BlockStored per chunk with its GPU
//     blocks' hashes, its tokens, the GPU block size, parent, LoRA, group 0
//     and kind full_attention (no extra_keys: vLLM defers them), and
//     removals listing the chunks' GPU blocks' hashes. Hashes are the GPU
//     blocks' (same wire form as the GPU events), so a consumer can map a
//     placeholder through the GPU store of the same block.
//   - Probe is the lookup at admission: the GPU prefix hit, then the run of
//     tier blocks right after it (whole chunks from the chunk holding the
//     hit's end, within the len−1 cap); it touches the sequence's chunks,
//     as vLLM's lookup does. AdmitLoad admits loading up to that many tier
//     blocks, re-checked (blocks evicted meanwhile are computed instead):
//     they take fresh GPU blocks, count as computed at no compute cost, and
//     are cached on the GPU and published as a GPU BlockStored run. The H2D
//     copy's time is the caller's to charge (vLLM pins loading chunks; the
//     re-check stands in for the pin).
//   - Peers: CPURun answers a lookup from the tier only (the GPU is never
//     consulted, nothing is touched); Hashes and LookupRange give what a
//     consumer asks for; Insert puts pulled blocks in the tier (evicting,
//     publishing CPU stores), after which they load like any tier hit.
//   - CachedTokens counts the GPU hit and the blocks loaded at the first
//     admission (vLLM's num_cached_tokens counts the connector's tokens);
//     GPUHitTokens and LoadedTokens split it.
//   - Reset keeps the tier (vLLM resets the connector only when asked,
//     reset_external=true); ResetCPU empties it without events, as vLLM's
//     offloading manager does; Wipe empties both without events.
//   - Figures (CPU): capacity, blocks held, and blocks stored from the GPU,
//     inserted by pulls, evicted and loaded back since the cache was made.
//
// The package is a pure core: no I/O, clock, randomness, goroutines, locks
// or logging (test/repo's core rules); a Cache is not safe for concurrent
// use.
package kvcache
