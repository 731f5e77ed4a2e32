// Package tier names where a cached KV block sits: GPU memory, CPU memory
// or external storage, as vLLM's KV events name the medium.
//
// Contract:
//   - One type for every component: the sidecar's index and summaries, the
//     summary stream (its wire name, Tier.String), the picker's fleet state
//     and its scoring weights (an array indexed by Tier, of length Count).
//   - Pure and tiny: no I/O, no allocation.
//   - FromMedium maps an event's medium to its tier ("" is GPU, vLLM's
//     default; FS and OBJ connectors are storage); Parse reads a wire name
//     back. Unknown names are reported, never guessed.
package tier
