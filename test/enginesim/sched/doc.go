// Package sched is the simulated engine's scheduler as a pure core: the
// waiting and running queues, the paged KV cache (package kvcache) and the
// latency model, advanced one engine step per call. The HTTP engine
// (package enginesim) drives it in real time (sleeping for each step's
// duration times its time scale); a lab can drive it in virtual time.
//
// Contract, with vLLM v1's shape:
//   - Add queues a request at the simulated time given; Cancel marks one
//     for abort. Config.Policy is vLLM's --scheduling-policy: fcfs (the
//     default) keeps the waiting queue in arrival order; priority keeps it
//     ordered by Request.Priority (lower first), then arrival, then the
//     order of Add (vLLM's request id), and a preempted request goes back
//     to its place in that order instead of the queue's head.
//   - Step(now) schedules one step starting at now: running requests first
//     (a decode takes one token, a chunked prefill goes on), within
//     max_num_batched_tokens; when blocks run out, running requests are
//     preempted, under fcfs from the back (newest first), under priority
//     the lowest-priority first (the greatest priority value, then the
//     latest arrival; one scheduled earlier in the same step gives its
//     tokens back and samples nothing), and go back to the waiting queue,
//     to recompute when readmitted; then, in a step that
//     preempted nothing, waiting requests are admitted in order while
//     max_num_seqs and the token budget allow, each taking its cached
//     prefix (whole blocks, at most len−1 tokens) and prefilling the rest,
//     in chunks when the budget is short. The first request short of
//     blocks waits for them; nothing overtakes it (only requests waiting
//     for KV are passed over, below).
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
//   - ServeLookup answers a peer's lookup from the CPU tier only (the GPU
//     is never consulted); it costs no step time.
//   - Every request whose prefill is complete samples one token per step;
//     the first comes with the cached tokens of its first admission (vLLM's
//     num_cached_tokens, CPU-tier and pulled tokens included) and its time to first token (step end − arrival).
//     A request finishes with "stop" at its natural length (unless
//     ignore_eos), else with "length" at max_tokens or at max_model_len;
//     its blocks are freed in that step, and its last update carries
//     vLLM's queued interval (arrival to the start of the step that first
//     admitted it; readmissions after a preemption do not count) and
//     prefill interval (from there to its first token), which add up to
//     its time to first token.
//   - The CPU offload tier (Config.Cache.CPUBlocks > 0; package kvcache
//     keeps it) and peer pulls, as vLLM's OffloadingConnector and its P2P
//     tier (kv-transfer.md §1, §2, §8). Without a tier and without
//     Request.Source, nothing below happens and every step is what it was
//     before, event for event.
//   - A waiting request reaching admission probes the cache: its GPU hit,
//     then the CPU tier's blocks right after it. If it has a Source not
//     asked yet, it first sends a Lookup (Step.Lookups) for its blocks
//     beyond those local hits (within the len−1 cap) and waits for the
//     answer, which costs one scheduler step: the answer counts from the
//     step's end, or from the step's start plus StepBase for a step that
//     computed nothing. The shell answers with Resolve (blocks held, when
//     they arrive, or failure; it prices the pull with package transfer
//     and applies transfer.PullTimeout); the pulled blocks land in the
//     CPU tier (CPU stores) in the first step starting at or after their
//     arrival, or, failed or empty, the request recomputes (counted in
//     PullFailures). A request with no Source never pulls. A rescheduled
//     (preempted) request asks again.
//   - CPU-tier blocks (its own or pulled) load back to the GPU before
//     admission: the request waits now + LoadBack(tokens) (the profile's
//     H2D bandwidth), the copy overlapping the other requests' compute;
//     at its turn after that it is re-probed, loads what the tier still
//     holds (blocks evicted meanwhile are recomputed; more found than
//     waited for is waited for) and is admitted with those blocks
//     computed, cached and published on the GPU. Offloading itself (GPU
//     to CPU as blocks complete) costs no step time. Approximation: vLLM
//     takes the GPU blocks (and pins the CPU chunks) when the load
//     starts, so its waiting requests hold them; here GPU blocks are
//     taken at admission and the re-check stands in for the pin.
//   - Requests waiting for KV (a lookup, a pull or a load) keep their
//     place in the waiting queue, count as waiting in Load, and are passed
//     over by admission until ready: others are admitted past them (the
//     first other request short of blocks still stops the pass).
//     Step.NextReady (and Scheduler.NextReady) is the earliest time one
//     becomes ready, for a shell with nothing else to run. A step that
//     schedules nothing lasts 0 but may still carry lookups, pull figures
//     and events (pulled blocks stored in the tier): a shell publishes
//     them.
//   - A cancelled request waiting for KV leaves when the admission pass
//     reaches it; Restart drops them with the rest and empties the tier;
//     ResetPrefixCache keeps the tier (vLLM resets the connector only when
//     asked: ResetConnectorCache, silent).
//   - Figures: Update.CachedTokens is vLLM's num_cached_tokens (GPU hit
//     plus loaded, pulled included), split in GPUHitTokens, CPUHitTokens
//     and PulledTokens; Step's CachedTokens stays the GPU hits
//     (prefix_cache_hits), CPUHitTokens + PulledTokens are
//     external_prefix_cache_hits; Pulls, PullFailures, PullMisses;
//     LoadedBytes and StoredBytes (kv_offload_load/store_bytes) and
//     PulledBytes, from the profile's KVBytesPerToken.
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
