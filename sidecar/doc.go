// Package sidecar runs beside one vLLM pod and turns the engine's KV-cache
// events into a live, exact local index and a compact summary for pickers
// (DESIGN.md §5).
//
// Contract: one SUB socket per data-parallel rank (rank r on port base+r),
// seq tracked per rank, gaps replayed through a DEALER, engine restarts and
// AllBlocksCleared clear the endpoint and bump its epoch; engine hashes map
// to canonical keys (internal/blockkey) with reference counts; malformed
// payloads are counted and skipped, never fatal.
//
// Status: contract only. The implementation lands with the sidecar issue.
package sidecar
