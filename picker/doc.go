// Package picker routes each request to the endpoint holding the longest
// cached prefix under a bounded-load cap, and answers the decision API with
// a prefix_hash (DESIGN.md §7).
//
// Contract: a request is scored only when its whole cache identity is known
// (model, LoRA, cache_salt, multimodal identifiers, exact tokens from the
// engine's render endpoint); anything else is rejected or routed load-only,
// by configuration, and counted by reason — never silently scored as zero.
//
// Status: contract only. The implementation lands with the picker issue.
package picker
