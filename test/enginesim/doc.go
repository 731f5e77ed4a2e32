// Package enginesim is kvroute's stand-in for `vllm serve`, exposed as
// `kvroute engine`: it speaks vLLM's wire protocols exactly, so the sidecar,
// the picker, the demo and every benchmark run without GPUs.
//
// Contract:
//   - HTTP as vLLM serves it: /v1/chat/completions, /v1/completions and
//     /v1/responses (stateless), streaming over SSE with
//     stream_options.include_usage; the render endpoints
//     (/v1/responses/render only with EnableScaleOutEndpoints, as vLLM gates
//     it behind VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1); /tokenize (completion,
//     chat and — beyond vLLM — Responses input) and /detokenize;
//     /v1/models (vLLM's ModelCards, with a ModelPermission each),
//     /health, /version, /reset_prefix_cache and /metrics with vLLM's
//     metric names. Errors use vLLM's OpenAI error body; a route vLLM
//     does not register answers FastAPI's 404 {"detail":"Not Found"}.
//   - The runner decides the routes, as in vLLM's build_app: a generative
//     engine (--runner auto or generate) serves chat, completions,
//     Responses and render, and no pooling route; a pooling engine
//     (--runner pooling, older vLLM's --task embed) serves
//     /v1/embeddings, /pooling, /classify, /score, /v1/score, /rerank,
//     /v1/rerank and /v2/rerank instead (every one of them: a real model
//     serves the subset its architecture supports). Pooling prompts
//     (input as text, token ids or lists of either; or messages) are
//     scheduled and prefilled through the paged cache like any prompt,
//     and end with their prefill (running meanwhile). The
//     simulated model is deterministic: an embedding is the normalized
//     mean of a fixed pseudo-random vector per token id (EmbeddingDim
//     values; encoding_format float or base64 of float32 in any
//     endianness), classify a fixed two-label head (LABEL_0, LABEL_1)
//     over it, score and rerank the cosine similarity of the two
//     embeddings; answers carry vLLM's ids (embd-, pool-, classify-,
//     score-), objects, fields and usage, and vLLM's refusals (the
//     context length, truncate_prompt_tokens, dimensions without
//     matryoshka support, 1:1, 1:N or N:N score inputs). Not simulated:
//     the bytes encodings, other embed dtypes, multimodal score inputs,
//     token-level pooling tasks and the Cohere /v2/embed.
//   - usage.prompt_tokens_details.cached_tokens only with
//     EnablePromptTokensDetails and a non-zero hit, as vLLM reports it.
//   - A paged KV cache with vLLM v1 prefix caching (package kvcache):
//     sha256_cbor chained hashes with the seed, cache_salt on block 0, the
//     LoRA name on every block, hits capped at len−1, LRU eviction.
//   - KV events over ZeroMQ per rank (PUB bound or connected by vLLM's
//     heuristic, rank r on port+r), one batch per scheduler step with seq
//     from 0 per process, in either event layout; a replay ROUTER over a
//     ring of recent batches answering in either reply layout.
//   - A scheduler with vLLM's shape (running first, then waiting FCFS,
//     chunked prefill under max_num_batched_tokens, preemption from the
//     back) and a latency model: prefill time grows with uncached tokens,
//     each step costs a base plus a per-sequence decode cost. The
//     scheduler is a pure core (package sched); each rank's Engine is its
//     shell: one goroutine takes requests, cancellations (a client that
//     goes away) and control calls between steps, runs a step, sleeps for
//     its simulated duration times TimeScale (0: not at all), publishes
//     the step's events and only then delivers its tokens to the
//     handlers. Simulated time is the sum of the step durations; reported
//     latencies are simulated time: vllm:time_to_first_token_seconds at a
//     request's first token, vllm:request_queue_time_seconds (arrival to
//     first scheduled) and vllm:request_prefill_time_seconds (from there
//     to the first token) when it finishes, as vLLM observes them, with
//     vLLM's buckets.
//   - The three generate endpoints share one path (prepare, start, answer
//     whole or streamed, errors, usage, cancellation); what differs is
//     the body's parsing and the answer's shape.
//   - In process: Config.EventSink receives every event batch, in order,
//     with or without ZMQ; Engine.Load returns the load figures /metrics
//     reports, without sockets.
//   - Deterministic: the same prompt always gives the same tokens and the
//     same reply (package chat's tokenizer and template).
//   - Fault switches for tests and benchmarks: drop a percentage of event
//     batches (they stay replayable), delay them, and restart (new start
//     time, seq back to 0, cache empty, requests in flight fail); also at
//     run time through POST /sim/faults and POST /sim/restart.
package enginesim
