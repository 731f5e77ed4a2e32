// Package pickapi holds the wire types of the picker's decision API,
// POST /routing/v1/pick: the answer a gateway, kvroute verify, the bench
// and tests decode (DESIGN.md §7).
//
// Contract:
//   - The JSON field names are the API: endpoint, endpoint_id, model,
//     prompt_tokens, matched_tokens, matched_blocks, prefix_hash (omitted
//     when the request opted out or has no anchorable block),
//     predicted_ttft_ms (omitted when none), kv_source (the host:port to
//     pull the prefix from, "" when none) and kv_source_tokens, policy,
//     reason, and with ?explain=true candidates (each endpoint's matched
//     tokens per tier, in-flight requests, estimated cost, load cap and
//     why) and keys (the request's canonical block keys). A test pins them
//     against the picker's own answer, field by field.
//   - Types only, and pure helpers over them: no I/O. The picker's answer
//     is meant to embed Answer, so the two cannot drift.
package pickapi
