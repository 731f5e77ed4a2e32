// Package sched is the simulated engine's scheduler as a pure core: the
// waiting and running queues, the paged KV cache (package kvcache) and the
// latency model, advanced one engine step per call. The HTTP engine
// (package enginesim) drives it in real time (sleeping for each step's
// duration times its time scale); a lab can drive it in virtual time.
//
// Contract, with vLLM v1's shape:
//   - Add queues a request (first come, first served) at the simulated time
//     given; Cancel marks one for abort.
//   - Step(now) schedules one step starting at now: running requests first
//     (a decode takes one token, a chunked prefill goes on), within
//     max_num_batched_tokens; when blocks run out, running requests are
//     preempted from the back (newest first) and go back to the head of the
//     waiting queue, to recompute when readmitted; then, in a step that
//     preempted nothing, waiting requests are admitted in order while
//     max_num_seqs and the token budget allow, each taking its cached
//     prefix (whole blocks, at most len−1 tokens) and prefilling the rest,
//     in chunks when the budget is short. The head of the queue waits for
//     blocks; nothing overtakes it.
//   - A cancelled request leaves when the step reaches it (a running one
//     during the running pass, its blocks freed; a waiting one when it is
//     at the head of the queue), reported in Step.Dropped, with no update.
//   - The step's duration is the latency profile's (package profile): a
//     base, plus each prefill chunk's cost at its context offset (b·n +
//     2c·n·(s + n/2) for n new tokens after s computed or cached ones),
//     plus a cost per decoding sequence and per token of their contexts.
//     With sim-default it is the engine's historical model, exactly: 25 ms,
//     0.1 ms per decoding sequence, the uncached prompt tokens at
//     10,000 tok/s. A step that schedules nothing lasts 0.
//   - Every request whose prefill is complete samples one token per step;
//     the first comes with the cached tokens of its first admission (vLLM's
//     num_cached_tokens) and its time to first token (step end − arrival).
//     A request finishes with "stop" at its natural length (unless
//     ignore_eos), else with "length" at max_tokens or at max_model_len;
//     its blocks are freed in that step, and its last update carries
//     vLLM's queued interval (arrival to the start of the step that first
//     admitted it; readmissions after a preemption do not count) and
//     prefill interval (from there to its first token), which add up to
//     its time to first token.
//   - Output is deterministic: the tokens and natural length are a pure
//     function of the prompt and cache salt (no randomness, no seed).
//   - Each step returns its KV events (kvevents values, in the order the
//     cache made them) and the load figures vLLM's /metrics reports after
//     it (num_requests_waiting, num_requests_running, kv_cache_usage_perc).
//
// The package is pure: no I/O, clock, goroutines, channels, locks or
// logging; a Scheduler is not safe for concurrent use (its shell
// serialises calls). Time is simulated time, given by the caller.
package sched
