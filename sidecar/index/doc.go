// Package index is the sidecar's exact local index of one endpoint: which
// blocks the engine holds, under both identities (DESIGN.md §4–§5), and the
// counting summary built from them. It is an I/O-free core: events in,
// state and counters out.
//
// Contract:
//   - BlockStored runs are keyed with canonical keys (internal/blockkey)
//     recomputed from their token ids: the parent is resolved through the
//     engine-hash map (nil parent: the root of the model and the event's
//     LoRA name); the cache_salt is the string in extra_keys[0] of a run
//     starting at token 0, after the LoRA name; multimodal (identifier,
//     offset) tuples and prompt-embeds digests become typed extras.
//   - Engine hash → canonical key is reference counted: the same content
//     in several physical blocks is stored and removed once per copy, and
//     the key leaves the summary only when the last copy goes.
//   - Tiers (internal/tier: GPU, CPU, STORAGE; vLLM ≤ 0.26's FS/OBJ count
//     as STORAGE) are kept apart, each with its own map and summary. Only
//     full-attention groups are indexed; other groups and runs with a
//     different block size are counted and skipped. An event naming its
//     spec kind is judged by it; one without (removals, placeholders) by
//     the kind learned for its group from earlier runs (group 0 when
//     nothing was learned; an absent group is group 0). Learned kinds, like
//     a learned block size, survive Clear.
//   - Connector placeholders (CPU or STORAGE BlockStored with hashes only:
//     vLLM's OffloadingConnector without self_describing_kv_events, and
//     promotions in either mode) are attributed, not recomputed: each hash
//     on its own (a canonical key already encodes its prefix) takes the key
//     the engine-hash map gives it — the placeholder's tier's own map first
//     (another copy), then the other tiers' in tier order (the GPU block
//     the offload copied; for STORAGE, the CPU block). The copy is then
//     counted in its tier's map and summary like any other, so its removal
//     and later placeholders still resolve after the GPU copy is evicted.
//     A hash no tier maps (a placeholder before, or without, the GPU store
//     of its block) is counted (PlaceholdersUnresolved) and dropped, never
//     guessed; a GPU placeholder has no source and is dropped the same
//     way. Placeholders counts placeholder runs seen. This is exact only
//     when the offload block equals the GPU block, which a placeholder
//     cannot show (block_size 0): in chunk mode (blocks_per_chunk > 1) a
//     placeholder carries the chunk's last hash, so one block of each chunk
//     is attributed and the tier reads as holding almost nothing
//     (under-estimated, safe). Chunk mode needs self-describing events.
//   - A run whose parent is unknown cannot be keyed: Apply returns
//     ErrUnresolvedParent and the run is dropped (routing then
//     under-estimates, which is safe). A removal of an unknown hash is
//     counted and ignored.
//   - Clear (AllBlocksCleared, engine restart) empties every tier, the CPU
//     and STORAGE tiers included. vLLM sends AllBlocksCleared when the GPU
//     prefix cache is reset, and the event cannot say whether the
//     connector was reset too (reset_connector: on when generation is
//     paused with clear_cache, off by default). A connector reset empties the
//     CPU tier without sending a removal, so entries kept across the event
//     could never be removed; dropping them only under-estimates until the
//     surviving copies are evicted (their removals are then unknown,
//     ignored).
//   - Config: start from DefaultConfig and set Model; New rejects zero or
//     invalid values and fills nothing in (an unknown block size is
//     learned only when LearnBlockSize says so).
package index
