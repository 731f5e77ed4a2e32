// Package summary is the compact, fleet-wide description of which canonical
// block keys an endpoint holds: a blocked Bloom filter whose parameters are
// shared by every sidecar and picker of an identity group.
//
// Contract:
//   - Params (m bits, k probes, probe function version) are fleet-wide:
//     summaries with different Params are never combined (Params.Compatible).
//     Each key maps to one 512-bit block (one cache line) and k distinct bit
//     positions inside it, so a lookup touches one cache line per key.
//   - Counting is the sidecar's side: a counter per bit position, so keys can
//     be removed; a counter going 0→1 or 1→0 flips the position's bit. Flips
//     accumulate until TakeDelta, which returns the positions whose bit
//     differs from the previous delta, numbered 1, 2, … within an epoch.
//     Flips that cancel out before a delta is taken are never sent.
//     A delta is coded row by row (Rice-coded row gaps, Elias-gamma counts,
//     Rice-coded offsets in the row), ≈ 7 bytes a block at capacity.
//   - A Snapshot is the whole bitmap as of a delta sequence number; applying
//     the following deltas to it gives the current bitmap.
//   - Fleet is the picker's bit-sliced index of one group's summaries. A
//     snapshot is loaded into it a part at a time (SnapshotLoad), the slot
//     absent until the last part; a LoadBatch writes any number of loads
//     of one index in one lap of its rows (64×64 bit transposes), with
//     the same result as loading them one by one: a load joins the lap
//     under way and is written one lap after it joins. Its steps are
//     prepared (reading the snapshots only) and committed (writing the
//     index) apart, so a caller locks the index for the commit alone.
//   - The wire encodings (AppendDelta/DecodeDelta, AppendSnapshot/
//     DecodeSnapshot) validate everything they read: a hostile buffer gives
//     an error, never a panic or an allocation beyond the summary's size.
//
// The package is pure: no I/O, clocks, randomness or logging.
package summary
