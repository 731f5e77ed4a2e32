// Package sidecar runs beside one vLLM pod and turns the engine's KV-cache
// events into a live, exact local index and a compact summary for pickers
// (DESIGN.md §5–§6).
//
// Contract:
//   - One SUB socket per data-parallel rank (rank r on port base+r), in
//     connect or bind mode.
//   - The sequencer core (package sidecar/sequence, one per rank) decides
//     the ordering: duplicates are ignored, so batches seen both in a
//     replay and live are applied once; the live seq going backwards, or a
//     new engine start time, is a restart; a gap is filled from the
//     engine's replay ROUTER, and what replay cannot recover marks the
//     endpoint partial (routing then under-estimates, which is safe); a
//     late start, a restart and the idle tail check catch up from the ring.
//   - The intake loop is the shell: it owns the SUB and DEALER sockets,
//     tells the sequencer what it receives and executes its actions
//     (apply, replay, restart, mark partial), with the counters, metrics
//     and logs.
//   - Each rank's endpoint (its intake loop and scraper) is given what it
//     needs by the sidecar that owns it, at construction: the config
//     values it reads, the logger, the metrics, the hub its snapshots,
//     deltas and load reports go to, and callbacks (the drain announced,
//     the starting surface's progress). Nothing in it leads back to the
//     Sidecar.
//   - Restarts and AllBlocksCleared clear the endpoint and bump its epoch;
//     epochs start from the clock per sidecar process, so positions never
//     carry across sidecar restarts.
//   - Engine hashes map to canonical keys (package sidecar/index) with copy
//     counts; counting summaries (internal/summary) per tier are batched
//     into numbered deltas every DeltaInterval and streamed over gRPC
//     (kvroute.v1.Sidecar) with snapshots and load reports; the sidecar
//     gossips its gRPC address, identity group, the models its endpoints
//     serve (all or none, gossip.AdvertisedModels: a picker sharded by
//     model dials only the sidecars of its models) and positions; what
//     does not fit in the metadata is left out, the endpoint digests
//     first, then the models (pickers then dial and ask). Close ends
//     every summary stream at once (Unavailable, "shutting down"): a
//     watching picker is not left waiting for the graceful stop's deadline.
//   - Stream health: the stream judge core (package sidecar/streamhealth,
//     one per rank) weighs the scraped engine counters against the live
//     and replayed batches the intake reports, and says whether the live
//     stream works: unknown, live, replay_only, silent or partial, with a
//     reason naming the likely fix (--kv-events-mode, the right way round
//     for the sidecar's own mode). The scraper judges after every scrape;
//     the state is in /debug/state (stream_state, stream_reason), the
//     kvroute_sidecar_stream_state gauge (1 for the current state), one
//     log line per transition (warn into silent, replay_only or partial;
//     info back to live), Info and every load report.
//   - Engine health: every scrape, failed ones included, sends a load
//     report; a failed one carries engine_down and engine_error (and the
//     last good load), the next good one engine_down=false.
//   - Engine figures: every load report also forwards, cumulative as
//     scraped, the engine's own request figures (EngineStats): the sums
//     and counts of vllm:request_queue_time_seconds,
//     vllm:request_prefill_time_seconds and
//     vllm:time_to_first_token_seconds, vllm:prompt_tokens_total and
//     vllm:prefix_cache_hits_total (vllm:gpu_prefix_cache_hits_total on
//     older vLLM), each summed over its series; have=false, and no error,
//     from an engine that does not export the TTFT histogram.
//   - Startup: the admin listener opens first (after the config and the
//     TLS files), before any engine is identified, and serves while Start
//     waits for the engines (a vLLM loading its model, up to
//     StartupTimeout): /healthz answers 200 (the process is alive),
//     /metrics the registry, with every engine's series and
//     kvroute_sidecar_engine_down{engine} 1 until that rank's engine
//     answers; Go's profiles (/debug/pprof/) as ever; /readyz fails
//     (503) with a problem per rank naming its engine URL and the last
//     error; /debug/state and the other admin paths answer 503 with JSON
//     saying the sidecar is starting and what it waits for. The gRPC listener, the event intake and gossip start
//     only once every engine answered; then the full surface takes over
//     on the same listener, atomically. A failed start closes the admin
//     listener before Start returns.
//   - /readyz says the sidecar can serve: every rank's engine answered its
//     last scrape and its event intake is open. It does not wait for
//     events, and a silent or replay-only stream is not "not ready": the
//     sidecar still serves load reports, and pickers route that endpoint
//     by load only; /readyz lists each rank's stream state beside.
//   - KV source: with Config.P2PPort (--p2p-port; vLLM's P2P tier, where
//     peers pull KV out of the engine's CPU tier), rank r advertises
//     host:port+r, the host its engine URL's, in Info (EndpointInfo
//     kv_source) and /debug/state (kv_source); without it nothing, and no
//     picker names the engine as a source.
//   - Malformed payloads are counted and skipped, never fatal; the admin
//     listener (AdminListen: /healthz, /readyz, /metrics, /debug/*) shows
//     hashes and counts, never token ids or text.
//   - Fault injection (Config.FaultInjection; the hidden flag
//     --fault-injection of kvroute sidecar), off by default, for fault
//     benchmarks and tests, never a deployment: gossip then runs over a
//     transport that can be cut off (gossip.Partitionable, on the exact
//     --gossip-bind port), and the admin listener serves POST
//     /debug/fault/gossip with the body {"partitioned": true} (every
//     gossip packet in and out dropped, every gossip stream refused: a
//     network partition of this sidecar's gossip only; its gRPC summary
//     streams and event intake are untouched) or {"partitioned": false}
//     (healed). Any other body is a 400 (unknown fields, a missing or
//     non-boolean "partitioned", more than one object), over 1 KiB a 413;
//     without fault injection the path does not exist (404/405).
//   - TLS: with GRPCTLSCert and GRPCTLSKey the summary stream is served
//     over TLS; with GRPCClientCA it requires client certificates chaining
//     to that bundle (mutual TLS) and refuses the rest at the handshake,
//     counted (kvroute_sidecar_tls_handshake_failures_total) and logged,
//     a line per 10 s at most. The files are read before the engine is
//     waited for (a bad one fails Start at once, naming the flag) and
//     re-read when they change (gossip/secretfile): new connections take
//     the new material, open streams are never dropped for it; a file
//     that does not parse keeps the material in use, logged once and
//     counted (kvroute_sidecar_secret_reloads_total). The gossip keyring's
//     reloads are counted there too (secret="gossip_key").
//   - Config: start from DefaultConfig; Validate rejects zero and invalid
//     values and fills nothing in.
package sidecar
