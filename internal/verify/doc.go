// Package verify is the pure core of `kvroute verify`: from what a picker
// reports of its endpoints (and, later, what probes observe) it derives
// checks that pass or fail, each naming the endpoint, the field and the
// likely cause.
//
// Contract:
//   - No I/O, clocks or randomness: the command gathers the facts, this
//     package judges them, so every rule is tested on tables.
//   - Endpoints serving one model must agree on everything keys, summaries
//     and tokens depend on: block size, hash algorithm, key format, summary
//     parameters and tokenizer fingerprint. The reference for each field is
//     the model's majority value; an endpoint differing from it fails, on
//     that field. With no majority (a tie), every endpoint of the tie fails.
//   - An endpoint whose sidecar is stale or partial fails its freshness
//     check: routing to it works, but on old or incomplete knowledge.
//   - A token-parity probe passes when its repeat lands where it first
//     went, the picker's predicted cached tokens equal the engine's at
//     block granularity (below the prompt's last token, which vLLM never
//     reports cached), the picker's keys are all on that endpoint's sidecar,
//     and another salt shares nothing.
package verify
