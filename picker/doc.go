// Package picker routes each request to the endpoint where it is predicted
// to get its first token soonest (its cached prefix, the queue and the
// decodes there weighed by a model learned online), under a bounded-load
// cap, and answers the decision API with a prefix_hash and the prediction
// (DESIGN.md §7).
//
// Contract:
//   - A request is scored only when its whole cache identity is known
//     (model or LoRA adapter, cache_salt, multimodal identifiers from the
//     engine's render features, exact tokens from the engine's render
//     endpoint); anything else is rejected or routed load-only, by
//     configuration (Config.Unresolved), and counted by reason — never
//     silently scored as zero. previous_response_id is always refused.
//   - Router.Route places a request in five steps, each callable on its
//     own (route.go): Prepare (parse, resolve, render and key the tokens:
//     I/O, bounded by the render timeout), Admit (wait while the model
//     group is saturated), Snapshot (the fleet's per-tier matches and
//     loads, the picker's own picks not yet covered by an engine load
//     report, aged at the engine's prefill rate, and those it carries
//     before their first output token, whose prompts' blocks count as held
//     on their endpoint for precise, and the group's TTFT model: its fit
//     and each endpoint's factors), Decide (the pure decision,
//     picker/decide over picker/score) and Book. Prepare and
//     Admit block; Snapshot, Decide and Book never wait on I/O. It never
//     sends anything to an engine except render and model-list calls.
//   - The router reads the fleet through the Fleet interface: a
//     fleetview.View in kvroute picker, an in-process picker/localfleet in
//     tests and the lab. A request's group is the fleet's roster
//     (fleet.Roster, which both publish): shared, immutable, rebuilt only
//     after a change, never copied per request; Prepare, Admit, Snapshot
//     and Decide read it and never modify it (PickOptions.Only makes a new
//     one of its part). A Fleet without rosters is copied per request. Its picks in flight are picker/inflight.Bookings,
//     under the router's one lock, taken only in bookings.go.
//   - With a peer's policy (Config.Score.Policy llm-d, llm-d-precise,
//     dynamo or sglang, or an arm with KV pulls: llm-d-precise+p2p,
//     llm-d+p2p, llm-d-load, llm-d-load+p2p, dynamo+hint: comparison
//     baselines, picker/peers), the same
//     candidates go to that policy instead of picker/score; it books each
//     pick at dispatch, at the first streamed chunk (Router.FirstChunk),
//     at the first output token (Router.FirstToken: on /v1/responses
//     streams the first event after the opening ones) and at the end (the
//     decision API's picks end at once), under the router's lock, its
//     tie-breaks drawn from a source seeded by Config.PolicySeed. The
//     prediction the outcome metrics judge stays the fleet index's.
//   - Server-side tenant salts (tenant.go, the core in picker/tenant):
//     with Config.TenantHeader, a request naming its tenant has its
//     cache_salt replaced by the tenant's keyed salt before anything reads
//     the body (chat, completions, responses and the decision API, HTTP
//     or gRPC metadata), so keys, prefix_hash and the body forwarded to the
//     engine agree; Config.RequireTenant refuses one without it (401
//     tenant_required). The endpoint picker does the same from the tenant
//     header in the ext_proc request headers, rewriting the body the
//     gateway sends on (eppExchange.bodyMembers: one rewrite of every
//     member it sets, the content-length set to match).
//   - Secrets held from files (the salt key, the decision token, the
//     engines' API key; secrets.go) and TLS files (tls.go: the client
//     certificate and CA bundle the sidecars are dialled with, the
//     certificates and client CA bundles of the gRPC decision API and the
//     endpoint picker) are re-read when the file changes
//     (gossip/secretfile); a broken file keeps the material before,
//     logged once and counted (the gossip keyring's reloads too, under
//     secret="gossip_key"). New TLS connections take new material,
//     open ones keep theirs. No secret is logged, exported or put in an
//     answer. A bad combination of TLS settings is a Validate error
//     naming the flags; an unusable file fails Start, naming the flag.
//   - The TTFT model (learn.go over picker/predict), one per identity
//     group under its own lock: the engines' counters in the load reports
//     are taken at snapshot time (those of the endpoints whose copy in the
//     roster changed since the group's last snapshot: the others' are in
//     already; the factors given the decision are kept with the roster
//     and made again for those, or all after a first token was learned);
//     a pick precise predicted teaches it at
//     its first output token (Router.FirstToken; the proxy and the
//     endpoint picker call it on streamed answers only, a whole answer's
//     first byte being its end), once. Its state is on /debug/endpoints
//     and in kvroute_picker_ttft_*; the prediction rides on the answer
//     (predicted_ttft_ms, x-kvroute-predicted-ttft-ms) and in the access
//     log. x-kvroute-slo-ttft-ms (slo.go) sets PickOptions.SLO.
//   - /debug/endpoints lists the sidecars followed whose summary stream is
//     failing (sidecars_failing: reason tls, unavailable or stream, the
//     error, for how long), which a sidecar never streamed from has no
//     endpoint to show by.
//   - KV sources (kvsource.go): a decision's Source is carried to the
//     wire only as the advertised address (fleet.Identity.KVSource,
//     host:port) of another endpoint of the request's identity group as
//     the decision saw it — never the chosen endpoint, never one without
//     an address; anything else is dropped, counted by reason
//     (kvroute_picker_kv_sources_dropped_total) and logged at debug. The
//     proxy removes every top-level kv_transfer_params a client sent
//     (counted in kvroute_picker_client_kv_params_dropped_total, logged
//     at debug) and a client's x-kv-cache-source-host-port, and, when a
//     source is named, sets kv_transfer_params.remote_kv_source
//     {kv_request_id (a fresh UUID per attempt), remote_host,
//     remote_port} on the body it forwards (chat, completions,
//     Responses) and answers x-kvroute-kv-source (--response-headers
//     all). The decision API answers kv_source and kv_source_tokens
//     (HTTP and gRPC); the endpoint picker sets
//     x-kv-cache-source-host-port (llm-d's routing sidecar header),
//     replacing the client's, or removes the client's when none is named.
//     Named sources are counted (kvroute_picker_kv_sources_total, per
//     source with Config.PerEndpointMetrics;
//     kvroute_picker_kv_pull_tokens_total), every decision's
//     Plan by place (kvroute_picker_planned_prompt_tokens_total), and the
//     access log carries kv_source.
//   - The proxy forwards the body as received (the tenant salt and the KV
//     source aside) and streams the answer back
//     byte for byte; it offers a request to another endpoint only when the
//     chosen one could not be reached or answered 502/503/504, before any
//     byte went to the client. It reads the engine's reported cached
//     tokens and counts wrong-pod outcomes.
//   - The picker never presents a truncated answer as complete. An answer
//     is whole when read to its end by its framing and, for SSE, when its
//     final event came (data: [DONE] for chat and completions;
//     response.completed, or a terminal response.failed,
//     response.incomplete or error event, for Responses). One cut short
//     after its first byte went out — the engine's answer failed to read
//     or ended early, or the client left — is aborted with
//     panic(http.ErrAbortHandler) after flushing what was written: the
//     HTTP/1.1 connection closes without the last chunk (or short of the
//     Content-Length), the HTTP/2 stream is reset, so the client sees an
//     error. Counted in kvroute_picker_stream_aborts_total{cause} (and
//     engine, with Config.PerEndpointMetrics);
//     an engine's read error is also reported to passive ejection. A
//     handler wrapping the proxy must let that panic through.
//   - A client's leaving cancels its request to the engine, which aborts it.
//   - Admission (admission.go, the core in picker/admit): a proxied
//     request, once prepared, passes admission on its first attempt. While
//     every routable endpoint of its model group is saturated (Config.
//     Admission), it waits in the group's bounded queue under its
//     fairness key (Config.FairnessHeader, else its cache_salt, else one
//     shared key) and PriorityHeader, released one at a time as the group
//     gets room (the next once the last one's pick is recorded), or is
//     refused: 429 rate_limit_exceeded with Retry-After (queue_full,
//     queue_displaced, queue_timeout), 503 only for no endpoint. A waiter
//     whose client left leaves the queue; at shutdown the waiters get 503.
//     The endpoint picker passes admission the same way (its request
//     headers give the fairness key and priority; a refusal is an
//     immediate response with Retry-After); the decision API answers at
//     once: a decision, or, with Config.AdmitDecisions, while the group is
//     saturated or has waiters, 429 model_saturated with Retry-After
//     (gRPC: RESOURCE_EXHAUSTED with RetryInfo and a retry-after trailer),
//     counted as decision_shed. Router.AdmitAll turns the saturation check off (comparison
//     runs that measure routing alone).
//   - Every refusal is an OpenAI error body ({"error": {message, type,
//     param, code}}): unrouted paths 404, wrong methods 405 with Allow,
//     bodies over MaxBodyBytes 413 after a bounded drain of the rest.
//   - Two HTTP surfaces: Handler is the public API (the OpenAI endpoints,
//     passed-through routes and the decision API, nothing else; an admin
//     path there answers 404 naming --admin-listen), AdminHandler the
//     admin surface (/healthz, /readyz, /metrics, /debug/endpoints,
//     /debug/admission, /debug/sync, Go's profiles under /debug/pprof/),
//     which Server serves on AdminListen, apart.
//   - Every request on the public API carries an x-request-id (the client's when it is 1..128
//     visible ASCII characters, else a new one), forwarded and returned;
//     is counted by route, model and status with its duration and time to
//     first byte; and gets one access-log line at info (the share
//     Config.AccessLog, evenly spread) that never carries prompt text.
//     So does every endpoint picker request (Router.record: route
//     ext_proc, via ext_proc, its code the answer's status the gateway
//     sent back or the refusal's, else unreported; its x-request-id set
//     on the request sent on).
//     Config.ResponseHeaders chooses the x-kvroute-* headers on proxied
//     answers.
//   - The rest of vLLM's OpenAI server passes through (passthrough.go):
//     GET /v1/models is the union of every routable engine's list (asked
//     with the client's headers, a card per model id: larger groups
//     first, then by URL), GET /v1/models/{id} one card or a 404; the
//     pooling endpoints (/v1/embeddings, /pooling, /classify, /score,
//     /v1/score, /rerank, /v1/rerank, /v2/rerank) go to the routable
//     endpoint of the body's model's group with the least load (the
//     load-only decision, the pick booked in flight), /tokenize and
//     /detokenize to the engine that would render for the group
//     (decide.RenderOrder), /version to any routable engine. Bodies are
//     bounded by MaxBodyBytes and forwarded as received, answers copied
//     back with their status, with the proxy's one retry rule (relay); no
//     usage is accounted for them.
//   - With ServerConfig.ExtProcListen the picker is also a Gateway API
//     Inference Extension endpoint picker (extproc.go, the message flow in
//     picker/extproc, docs/gateway-epp.md): Envoy's ext_proc service, each
//     request routed by Router.Route on its body (the subset hint as
//     PickOptions.Only, fallbacks ranked by the same decision, shedding by
//     PickOptions.ShedWaiting, off by default), refusals as immediate
//     responses in OpenAI's error format, the served endpoint and the
//     answer's usage read back into the outcome accounting, the pick's
//     in-flight record ended with the stream; with gRPC health.
//   - Metric series per endpoint (metrics.go; label engine, its URL):
//     three by default, so a scrape grows by three series an endpoint —
//     kvroute_picker_selected_total here, and the fleet view's current
//     health state (kvroute_picker_endpoint_state at 1) and staleness.
//     In-flight requests, stream aborts and KV sources are summed over
//     the endpoints, under the same names without the engine label, and
//     the TTFT speed factors are left out (/debug/endpoints has them).
//     Config.PerEndpointMetrics (--per-endpoint-metrics) puts the engine
//     label back on those, exports the speed factors and every health
//     state at 0 or 1: twelve series an endpoint that served, pulled
//     from and learned. A query summing the engine label away reads the
//     same either way.
//   - Server owns the sockets and goroutines: gossip membership, the fleet
//     view, the HTTP API, the gRPC kvroute.v1.Picker service and the
//     endpoint picker.
package picker
