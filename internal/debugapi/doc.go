// Package debugapi holds the wire type of the picker's admin page
// GET /debug/endpoints (Path): the Document the picker writes and
// kvroute verify reads, one type for both so the two cannot drift.
//
// Contract:
//   - The JSON names are the API, pinned by a golden file. The Document's
//     keys are endpoints, picker, refused and sidecars_failing, in that
//     order; a list with nothing in it is [], never null (the picker
//     writes it so).
//   - An endpoint (Endpoint) is the engine's URL and ID, its sidecar's
//     gRPC and debug addresses, its identity group, the identity its
//     sidecar reported (model, rank, block size, GPU blocks, hash
//     algorithm, key format, summary parameters, tokenizer fingerprint,
//     epoch, partial), where peers pull its CPU-tier KV from (kv_source,
//     host:port, omitted when it advertises none), its last load (waiting, running, KV cache usage),
//     seconds since its last update (or never_updated), the picker's
//     health state (cached, load_only, draining, down) and why, the
//     sidecar's verdict on its event stream, whether the sidecar reaches
//     the engine, and the median of its recent event-to-routable lags.
//     never_updated, state_reason, stream_state, stream_reason,
//     engine_down, engine_error and lag_seconds are omitted when empty:
//     lag_seconds is absent (nil) while no lag was measured.
//   - A refusal (Refusal) is an endpoint offered but not taken, never
//     routed to: reason summary_params, group_full, other_owner,
//     model_not_followed, or the trust check's remote_endpoint,
//     malformed_endpoint and unresolved_endpoint, which alone carry
//     since (RFC 3339, UTC) and detail, omitted otherwise.
//   - picker is what the picker says of itself (gossip_insecure);
//     sidecars_failing the sidecars followed whose summary stream fails
//     (reason tls, unavailable or stream), with the last error and for
//     how many seconds.
//   - kvroute verify relies on, per endpoint: endpoint, model, rank,
//     group, sidecar_debug, the identity fields (block_size, hash_algo,
//     key_format, summary_params, tokenizer_fingerprint), partial,
//     seconds_since_update, never_updated, state and state_reason, and
//     reports sidecar, num_gpu_blocks, stream_state, stream_reason,
//     lag_seconds and kv_source as read (and counts kv_source per model); per refusal: endpoint, reason, model,
//     summary_params, since and detail; and picker's gossip_insecure. A
//     field missing from an older picker reads as its zero value, which
//     verify treats as "not reported".
//   - Types only: no I/O, no clock. Writers fill the values (the picker
//     measures the seconds at its own now).
package debugapi
