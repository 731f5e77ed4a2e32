// Package profile holds the simulated engine's latency profiles: the
// constants the scheduler core (package sched) prices a step with, by
// name, each calibrated from published figures
// (docs/engine-profiles.md) and citing the rows it was fitted to.
//
// Contract:
//   - A step costs StepBase (a), plus its prefill chunks, plus its
//     decodes. A chunk of n new tokens at context offset s (the tokens
//     already computed or cached before them) costs b·n + 2c·n·(s + n/2),
//     so the chunks of one request sum to b·t + c·t² over its t tokens
//     (b = 1/PrefillTokensPerSecond, c = PrefillQuadratic). The decodes
//     cost DecodePerSeq per decoding sequence plus DecodePerKVToken per
//     token of their contexts.
//   - StepCost sums a step's terms in floating point and rounds once (to
//     the nanosecond, toward zero): with c = 0 and no KV term, a step of
//     p prefill tokens and d decoding sequences lasts exactly
//     StepBase + d·DecodePerSeq + time.Duration(p/PrefillTokensPerSecond
//     seconds), the formula the engine has always used (sim-default).
//   - ColdPrefill is a lone cold request's time to its first token:
//     its chunks of MaxNumBatchedTokens, one step each.
//   - Each profile also prices moving KV: KVBytesPerToken, the
//     host-to-device bandwidth a CPU-tier hit loads back at (LoadBack:
//     tokens × bytes / bandwidth), and a pull from a peer's CPU tier
//     (PullTime: PullSetup, plus PullConnect for a pair's first pull,
//     plus tokens × bytes × share / PullBytesPerSecond when share pulls
//     divide the link; package transfer decides the share). CPUBytes is
//     the published deployment's CPU tier (0: none), CPUBlocks converts
//     bytes to blocks. sim-default's are assumptions used only when a
//     tier or pulls are turned on: its step costs are unchanged.
//   - Named returns a named profile by value (a fresh copy: changing it
//     changes nothing here); an unknown name is an error listing the
//     names. Names lists them, sim-default first.
//   - Each named profile cites its sources (Sources) and says what no
//     published figure fixes (Uncalibrated), and gives the engine sizes
//     it was measured at: the chunk budget (max_num_batched_tokens), KV
//     capacity (num_gpu_blocks at BlockSize) and max_model_len, which a
//     shell takes as defaults.
//   - Only the engine model reads a profile. No routing policy may: a
//     policy learns what it needs from what engines report and from probes
//     (engine-profiles.md §1); test/repo checks that nothing under
//     picker/, sidecar/ or internal/ imports this package.
//
// The package is pure: no I/O, clock, randomness or mutable package state.
package profile
