// Package sidecar runs beside one vLLM pod and turns the engine's KV-cache
// events into a live, exact local index and a compact summary for pickers
// (DESIGN.md §5–§6).
//
// Contract:
//   - One SUB socket per data-parallel rank (rank r on port base+r), in
//     connect or bind mode. The live seq and the applied seq are tracked
//     apart: batches seen both in a replay and live are applied once; the
//     live seq going backwards, or a new engine start time, is a restart.
//   - Gaps are filled from the engine's replay ROUTER; what replay cannot
//     recover marks the endpoint partial (routing then under-estimates,
//     which is safe). A late start and the idle tail check catch up from
//     the ring.
//   - Restarts and AllBlocksCleared clear the endpoint and bump its epoch;
//     epochs start from the clock per sidecar process, so positions never
//     carry across sidecar restarts.
//   - Engine hashes map to canonical keys (package sidecar/index) with copy
//     counts; counting summaries (internal/summary) per tier are batched
//     into numbered deltas every DeltaInterval and streamed over gRPC
//     (kvroute.v1.Sidecar) with snapshots and load reports; the sidecar
//     gossips its gRPC address, identity group and positions.
//   - Malformed payloads are counted and skipped, never fatal; debug HTTP
//     shows hashes and counts, never token ids or text.
package sidecar
