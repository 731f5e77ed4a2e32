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
//     serves the subset its architecture supports). A route of the other
//     runner answers current vLLM's 404 {"detail":"Not Found"} (not older
//     vLLM's 400 "The model does not support Embeddings API"); the log
//     warns once which --runner would serve it. Pooling prompts
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
//     back; with --scheduling-policy priority the body's priority orders
//     the waiting queue, lower first, and the lowest-priority running
//     request is preempted first, while a non-zero priority under fcfs is
//     vLLM's 400) and a latency model: prefill time grows with uncached tokens,
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
//   - vLLM's OffloadingConnector, when --kv-transfer-config names it
//     (Config.KVTransfer; none by default, and then nothing below
//     exists): kv_role, and kv_connector_extra_config's spec_name
//     (CPUOffloadingSpec, or TieringOffloadingSpec with a secondary tier
//     {"type":"p2p","host","port"}), cpu_bytes_to_use (required),
//     block_size or blocks_per_chunk (a multiple of the GPU block),
//     eviction_policy (lru; arc is refused as not modelled),
//     offload_prompt_only, self_describing_kv_events, store_threshold (0
//     or 1). vLLM's refusals are errors naming the key; what the
//     simulation does not model (other connectors, fs and obj tiers, arc)
//     is an error saying so; keys vLLM would ignore are logged at start.
//     The CPU tier itself (offload, hits loaded back, its events) is the
//     core's (package sched, kvcache); offload_core.go is the one file
//     that calls it.
//   - The P2P tier: each rank runs a side channel (package p2p) on the
//     tier's host, verbatim, and port + rank (the tier's own, else
//     VLLM_P2P_SIDE_CHANNEL_HOST, default localhost, and
//     VLLM_P2P_SIDE_CHANNEL_PORT, default 5710; Engine.P2PID), answering
//     peers' lookups from the CPU tier through the scheduler goroutine.
//     A request's kv_transfer_params (chat, completions, Responses: vLLM's
//     dict[str, Any], anything but an object or null is its 400) may name
//     remote_kv_source {kv_request_id, remote_host, remote_port}: the core
//     looks the prefix up at that peer and pulls the leading blocks it
//     still holds (off the scheduler goroutine; the transfer time is this
//     engine's profile's, with both ends' pulls under way, a transfer past
//     vLLM's 30 s load timeout failing as "timeout"); any failure
//     recomputes (kvroute_engine_p2p_pull_failures_total{reason}). The
//     side channel answers at most p2p.Config.MaxAnswering peer requests
//     at once (more are answered as misses, "busy") and at most
//     MaxSessionsPerHost connections from one address. What the connector would not use is ignored, never an
//     error, and counted (kvroute_engine_kv_transfer_params_ignored_total
//     {reason}: malformed, no_p2p_tier, not_modelled for the P/D roles
//     remote_prefiller — which hides remote_kv_source, as in vLLM — and
//     remote_decoder, legacy_key for the p2p/prefill/decode keys older
//     sidecars sent, self). The render endpoints echo kv_transfer_params.
//     /reset_prefix_cache?reset_external=true also empties the CPU tier.
//     A simulated restart keeps the side channel's connections (the CPU
//     tier is the core's, and restarts empty).
//   - The connector's metrics, only with it, as vLLM names them (labels
//     model_name, engine): vllm:kv_offload_load_bytes_total,
//     _load_time_total, _load_size, _store_bytes_total, _store_time_total,
//     _store_size, the deprecated vllm:kv_offload_total_bytes_total,
//     _total_time_total and _size {transfer_type CPU_to_GPU, GPU_to_CPU},
//     vllm:kv_offload_stores_skipped_total (CPU spec); with the P2P tier
//     vllm:kv_offload_tiering_{read_bytes,read_time,write_bytes,
//     write_time,promotion_job_failures,cascade_job_failures,block_queries,
//     block_hits}_total{tier="1:p2p"}. vllm:external_prefix_cache_queries
//     and _hits (always exported) count the connector's queries and its
//     CPU-tier and pulled tokens; vllm:prompt_tokens_cached includes them.
//     Ours, where vLLM has none: kvroute_engine_prompt_tokens_by_tier_total
//     {tier cpu, p2p}, kvroute_engine_kv_offload_tiering_promotion_jobs_total
//     (pulls), kvroute_engine_p2p_pull_failures_total{reason} and the side
//     channel's kvroute_engine_p2p_* series.
//   - Fault switches for tests and benchmarks: drop a percentage of event
//     batches (they stay replayable), delay them, and restart (new start
//     time, seq back to 0, cache empty, requests in flight fail); also at
//     run time through POST /sim/faults and POST /sim/restart.
package enginesim
