// Package verify is the pure core of `kvroute verify`: from the facts
// gathered of a fleet — what a picker reports of its endpoints, what their
// sidecars and engines answer, what the token-parity probes observe — it
// derives checks that pass or fail, each naming the endpoint, the field
// and the likely cause, and assembles them into the Report the command
// prints.
//
// Contract:
//   - No I/O, clocks or randomness: cmd/kvroute/collect gathers the
//     facts (Facts), this package judges them (Judge), so every rule is
//     tested on tables. Judge's checks come in a fixed order: identity and
//     freshness by endpoint, the picker's own, refused endpoints, the
//     models' admission, then their KV sources, each endpoint's sidecar,
//     its stream and its cached-token details, then each probe's checks
//     and its per-endpoint token checks, then the lag probes, then the
//     admin ports' /metrics. The Report's JSON is kvroute verify --json's,
//     pinned by a golden file.
//   - What the picker reports of its fleet is read as its
//     /debug/endpoints document (internal/debugapi, the type the picker
//     writes): Facts.Fleet and Facts.Refused are its entries, as they
//     are. The Report's endpoints (Endpoint) are verify's own output, the
//     fields it judged under the picker's names, and do not grow with
//     the picker's document.
//   - Endpoints serving one model must agree on everything keys, summaries
//     and tokens depend on: block size, hash algorithm, key format, summary
//     parameters and tokenizer fingerprint. The reference for each field is
//     the model's majority value; an endpoint differing from it fails, on
//     that field. With no majority (a tie), every endpoint of the tie fails.
//   - An endpoint whose sidecar is stale, partial or has never sent an
//     update fails its freshness check: routing to it works, but on old or
//     incomplete knowledge. An endpoint the picker refused fails as not
//     routable, with the picker's reason (and, for the trust check's
//     refusals — an endpoint not on its sidecar's host, malformed or
//     unresolved — the picker's sentence, since when, and the remedy).
//   - An endpoint's sidecar passes when its debug URL is known, answers,
//     and follows that endpoint (not another sidecar reached through a
//     loopback address). An engine passes the cached-token check when a
//     repeated prompt comes back with prompt_tokens_details.
//   - A token-parity probe passes when its repeat lands where it first
//     went, on an endpoint of the probe's model the picker lists, the
//     picker's predicted cached tokens equal the engine's at block
//     granularity (below the prompt's last token, which vLLM never
//     reports cached), the picker's keys are all on that endpoint's sidecar,
//     and another salt shares nothing.
//   - Each endpoint of a model passes the probe's token check when the
//     block keys of its own rendering (at the model's block size: a block
//     size that differs is the identity check's) are the picker's, all of
//     them and at least one.
//   - An endpoint's sidecar stream passes when the sidecar judges that
//     rank's live KV event stream "live". "silent", "replay_only" and
//     "partial" fail with the sidecar's reason (its likely fix, such as
//     --kv-events-mode bind) as the cause; "unknown" (no evidence) fails
//     once the engine has served verify's requests; a sidecar that reports
//     no stream state (an older version) or its engine down fails.
//   - KV sources are informational: per model, how many endpoints
//     advertise one (debugapi kv_source: their sidecar's --p2p-port), a
//     check that always passes, its Figure "n/m".
//   - A lag probe passes when the picker predicts the prompt's full blocks
//     below its last token (FullBlockTokens) on the endpoint that cached
//     it within Limits.MaxLag of the engine's answer; a prompt never
//     predicted fails, with the picker's state of the endpoint when it
//     has one. The check's Figure is the measured lag.
//   - A picker serving an endpoint picker (its /debug/endpoints names its
//     --ext-proc-listen) passes "endpoint picker health" when its
//     grpc.health.v1 answers SERVING for ExtProcService; NOT_SERVING or no
//     answer fails, naming the address. One requiring a client
//     certificate is not probed (verify has none), which the check says.
//   - A picker with --engine-priority (its /debug/endpoints has
//     engine_priority) passes "engine priority" while no engine has
//     refused the priority it sets; an engine that did (it runs
//     --scheduling-policy fcfs) fails it, named.
//   - Metrics served: the picker's admin port and each sidecar's pass
//     when their /metrics answers with every series Limits.Series lists
//     for the component (the dashboard's, computed by deploy/monitoring
//     from the dashboard built into the binary), and gossip's series too
//     from a process that serves any of them (one that gossips); a port
//     that does not serve /metrics, or lacks a series, fails naming the
//     series missing.
package verify
