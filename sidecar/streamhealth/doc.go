// Package streamhealth judges whether one data-parallel rank's live KV
// event stream works (issue 15, DESIGN.md §5 and §11). vLLM's publisher
// sends no heartbeats, so a SUB socket that hears nothing cannot tell an
// idle engine from a dead or one-sided stream; the judge weighs evidence
// instead: the engine's own counters, scraped from its /metrics, against
// the batches that actually arrive.
//
// Contract:
//   - One Judge per rank. The shell reports what it observes: each
//     successful scrape's counters (Scraped), each batch received on the
//     live socket (LiveBatch), each batch applied through a replay exchange
//     (ReplayedBatch), and the sequencer's partial flag (SetPartial); it
//     asks for the verdict with Judge(now), typically once a scrape.
//   - States: "unknown" (no evidence yet), "live", "replay_only", "silent",
//     "partial" (State.String gives these wire names).
//   - The rules, in order:
//     1. Partial: while the sequencer's partial flag is set the state is
//     partial; the reason is the sequencer's, followed by the live
//     stream's own verdict when that is silent or replay-only.
//     2. Live: a live batch makes the stream live at once; it stays live
//     until a window of new-block evidence passes without one.
//     3. New-block evidence: over the counters since a baseline,
//     (Δ vllm:prefix_cache_queries − Δ vllm:prefix_cache_hits) −
//     block_size × (Δ finished requests + requests in flight now) tokens,
//     at least MinNewBlocks blocks' worth. Queries − hits are the tokens
//     the engine computed; an admitted request may recompute up to one
//     block's worth without storing a new block (the last prompt token is
//     always recomputed, and the tail is partial: a fully cached repeat
//     prompt stores nothing), and every request admitted since the
//     baseline has either finished since or is in flight now, so what is
//     left filled new blocks, which vLLM must have published as
//     BlockStored. Without a request counter the raw difference is used.
//     Prompt and generation tokens are shown in reasons only: they move
//     for fully cached prompts and decode alone. The baseline follows the
//     counters while they stand still, restarts after each live batch and
//     each verdict, after a counter reset (an engine restart), and when a
//     spell of growth has not proven new blocks within a Window.
//     4. Window: evidence found by a scrape covers the engine's activity
//     since the scrape before it (t0). A live batch from t0 − Slack on
//     answers it (rule 2). Otherwise, at t0 + Window the stream is
//     replay_only when a batch was applied through replay since t0 − Slack,
//     and silent when none arrived at all.
//     5. Unknown until a live batch arrives or a window is judged.
//   - The reasons of silent and replay_only carry the hint for the common
//     cause, the right way round for the sidecar's own mode
//     (Config.Bind): vLLM binds its PUB when the --kv-events-config
//     endpoint has a wildcard host and connects when it names a concrete
//     host, so a connecting sidecar needs a wildcard engine endpoint (or
//     --kv-events-mode bind), and a binding sidecar needs the engine to
//     name the sidecar's host (or --kv-events-mode connect).
//   - Timing: with the defaults (Window 2.5 s) and a scrape every ~200 ms,
//     a one-sided stream is reported about 2.5–3 s after the engine's
//     first request computes new blocks (target ≤ 5 s).
//   - A core: no I/O, no clock (time comes in as now), no goroutines,
//     locks or logging. Not safe for concurrent use: the shell serialises
//     the calls.
package streamhealth
