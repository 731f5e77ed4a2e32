// Package kvevents is the wire codec for vLLM's KV-cache events: the msgpack
// payload of each published batch and the ZeroMQ frames around it.
//
// Contract:
//
//   - Decode accepts a batch [ts, events, data_parallel_rank] whose events are
//     either maps tagged by "type" (vLLM since the map encoding landed) or
//     tagged arrays (older vLLM). Fields are read by key (maps) or by declared
//     position (arrays); unknown keys and extra trailing array elements are
//     ignored. Block hashes may be integers (the engine's 64-bit form) or raw
//     digest bytes.
//   - Bad input yields an error and nothing else: no panic, no partial batch.
//     No allocation is sized by a length read from the wire before that
//     length has been checked against the bytes actually present, so memory
//     is bounded by the payload size, which is itself capped (MaxPayload).
//     Nesting of extra keys is capped (MaxDepth).
//   - Encode writes a batch in either layout following msgspec's rules
//     (shortest integer forms, float64 timestamps, omit_defaults), so the
//     simulated engine emits the same bytes vLLM would.
//   - The framing helpers build and parse the live PUB message
//     [topic, seq, payload], the replay request [b"", start_seq] and both
//     replay reply layouts, including the end marker.
//
// The package is pure: no I/O, clocks, randomness or logging.
package kvevents
