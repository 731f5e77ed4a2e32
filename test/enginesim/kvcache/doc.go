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
// The package is a pure core: no I/O, clock, randomness, goroutines, locks
// or logging (test/repo's core rules); a Cache is not safe for concurrent
// use.
package kvcache
