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
//     full-attention groups are indexed; other groups, connector
//     placeholders and runs with a different block size are counted and
//     skipped.
//   - A run whose parent is unknown cannot be keyed: Apply returns
//     ErrUnresolvedParent and the run is dropped (routing then
//     under-estimates, which is safe). A removal of an unknown hash is
//     counted and ignored.
//   - Clear (AllBlocksCleared, engine restart) empties every tier.
//   - Config: start from DefaultConfig and set Model; New rejects zero or
//     invalid values and fills nothing in (an unknown block size is
//     learned only when LearnBlockSize says so).
package index
