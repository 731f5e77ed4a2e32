// Package peers re-implements the routing policies of kvroute's peers —
// llm-d's scheduler (two profiles), NVIDIA Dynamo's KV router and SGLang's
// model gateway (SMG) — from their published algorithms and default
// parameters (shared/docs/peer-policies.md, which cites the source of each
// rule), so they run in the same picker, on the same fleet and requests,
// as comparison baselines for `kvroute bench`. They are not kvroute's
// routing; picker/score is.
//
// It also builds the peers' arms with KV pulls (peer-policies.md §4,
// ArmNames): a peer's placement, unchanged, plus a source decision
// (Choice.Source) — llm-d's p2p-source-producer (P2PSample and
// P2PSourceConfig.Name, reusable on their own) or Dynamo's KV hint — and
// llm-d's load-balanced profile (llm-d-load), the recompute control of
// llm-d-load+p2p.
//
// Contract:
//   - Pure: no I/O, no clock reads, no randomness of its own, no logging,
//     no locks. Every call takes now; Pick takes a random value, from which
//     a policy derives its random tie-breaks (Rand), so a seeded caller
//     gets reproducible runs. test/repo's dependency test holds it to that.
//   - A Policy holds its own state — the cache model a peer builds from
//     its own routing decisions, its load bookings — and is not safe for
//     concurrent use: the caller serialises Pick, Dispatched, FirstChunk,
//     FirstToken, Done and Forget (the picker under its router lock).
//   - The lifecycle is the peers': Pick chooses, Dispatched books the
//     request on the chosen endpoint (llm-d's PreRequest, Dynamo's
//     add_request, SMG's insert), FirstChunk marks the first chunk of a
//     streamed answer reaching the client, whatever it carries, FirstToken
//     the engine's first output token (prefill done), Done its end —
//     answered, failed or abandoned — which also ends what neither marked.
//     The two differ on /v1/responses streams, whose first events
//     (response.created, response.in_progress) come before prefill; each
//     policy listens to the signal its peer uses: llm-d's inflight-load
//     producer releases its tokens at FirstChunk, Dynamo's A_w ends at
//     FirstToken, SMG, llm-d-precise and llm-d-load use neither (an arm
//     listens as its base). Forget drops an endpoint that left the pool.
//   - Calibration helpers for llm-d's load gate (CalibratedPeak and the
//     recipe's constants) and for the p2p-source-producer's threshold
//     (CalibratedMinCachedTokenDelta and its ladder's constants) are pure
//     too: the caller sends the probes and hands over their timings.
//   - An arm's placement is its base policy's, state and lifecycle
//     included: on the same calls it picks the same Index. Its source, when
//     named, is a healthy candidate other than the chosen one; an arm's
//     runtime threshold (SourceThreshold) is set like llm-d's load gate.
//   - What kvroute's fleet can give a policy is in Request and Candidate;
//     where a policy needs an input that differs from the peer's own, the
//     substitution is written in that policy's doc comment (and in
//     docs/benchmarks.md).
//   - Each policy's defaults are the peer's, in its Default*Config, and
//     its Config has a Validate; New* refuses an invalid one.
package peers
