// Package bench runs kvroute's routing benchmarks: a fleet of simulated
// vLLM engines (`kvroute engine`), a sidecar each and a picker (or
// several), all over real sockets on 127.0.0.1 in this process, driven by
// a scenario once per routing policy — a fresh fleet for each, so no
// policy inherits another's cache — and summarised in results.json and a
// table (DESIGN.md §9).
//
// Contract:
//   - Every request goes through the picker's OpenAI endpoints, exactly as
//     a client (agentic-api) sends it; outcomes are what the engines
//     report (usage cached tokens) and what the client sees (time to the
//     first streamed byte, the x-kvroute-endpoint header).
//   - The pooled bound is computed offline: one LRU cache of the fleet's
//     total size replaying the same requests in the same order, keyed by
//     the engine-exact tokens (rendered by an engine).
//   - A run fails (an error) when a component fails or a request errors
//     unexpectedly; the figures of a failed run are not reported as if it
//     had succeeded.
//   - Policies are handled by name: kvroute's own (score.Policies) and the
//     peers' re-implemented as baselines (score.PeerPolicies: llm-d,
//     llm-d-precise, dynamo, sglang) run alike; a peer is only special in
//     that, when one ran, every policy is set against the best peer.
//     LLMDCalibrated is the bench's own name: the picker's llm-d, its load
//     gate set from llm-d's calibration recipe run through the picker on
//     the policy's fresh fleet before its scenario (calibrateLLMD; the
//     arithmetic is picker/peers.CalibratedPeak), where llm-d keeps the
//     guide's values.
//   - Options.Pickers (--pickers N, default 1) runs N pickers over each
//     fleet (DESIGN.md §16), each with its own HTTP, admin, gRPC and
//     bookings (picker.ServerConfig.PeerListen) listeners, metrics
//     registry and state (a peer policy keeps one per replica, as in its
//     own system), each told every picker's bookings address
//     (PeerPickers) to exchange bookings with. The client sends each
//     request, a conversation's turns each on its own, to a picker drawn
//     at random from the run's seed (NewSpreadClient), as a Kubernetes
//     Service spreads them; the pickers' decisions, outcomes and overhead
//     histograms are summed (Fleet.PickerStats). One picker runs without
//     gRPC, as it always has.
//   - Admission control is off unless Options.Admission: every request is
//     admitted at once (picker Router.AdmitAll), so a comparison measures
//     routing alone; with it, each policy's 429s are counted
//     ("shed_429") and shown beside its figures.
//   - Tables and charts name policies by Results.Label: on a scenario that
//     sent /v1/responses, "llm-d-precise (given tokens)" (upstream llm-d
//     cannot tokenize Responses; the picker hands the arm exact tokens),
//     and "llm-d (default)" beside llm-d-calibrated. results.json keys
//     stay the names; "policy_labels" lists the labels that differ.
//
// results.json, besides each policy's figures (PolicyResult):
//   - "vs_best_peer" (PeerComparison), present when a peer policy ran:
//     "best_peer" names, per figure, the best peer — the highest
//     "hit_rate", the lowest "ttft_mean", the lowest "ttft_p99" — "best"
//     holds those values (TTFTs in ms), and "ratios" maps every policy of
//     the run to its figure ÷ the best peer's ({"hit_rate", "ttft_mean",
//     "ttft_p99"}; null where undefined). llm-d is one peer there: with
//     both its runs, the stronger on "primary_figure" (the mean TTFT),
//     named in "llm_d". summary.txt and report.html show the same as a
//     block and a table.
//   - "admission" (whether admission control ran), "sends_responses",
//     "policy_labels"; per policy "shed_429" (with admission) and, for
//     llm-d-calibrated, "llm_d_calibration" (LLMDCalibration: the probes'
//     TTFTs, the measured peak and τ), also in summary.txt.
//   - fleet "pickers"; per policy "load_imbalance" (the busiest engine's
//     answered requests ÷ the mean), "load_cv" (their population standard
//     deviation ÷ their mean) and, with several pickers,
//     "picker_requests" (the requests sent to each).
//   - "warm_return_chance": 1 ÷ the engines, the warm-return share of
//     routing at random, against which each policy's "warm_return_rate"
//     (warm returns ÷ continuations) is judged ("vs chance" in the table).
//   - per policy "hit_rate_over_time" ({"t_s", "hit_rate", "requests"}):
//     the hit rate of the requests starting in each of 20 equal windows of
//     the run's simulated time (fewer for a short run, so that a window
//     holds 12 requests on average; empty windows left out), drawn as one
//     line per policy in the report.
//   - per policy "pick_overhead_us": the picker's arrival-to-dispatch time
//     from its histogram, as the bench sees no raw samples: "mean" is
//     exact (the samples' sum ÷ count), "p50_bucket_bound" and
//     "p99_bucket_bound" are the upper bounds of the buckets holding the
//     quantiles ("p99_beyond_last_bucket": past the last finite bound), so
//     summary.txt and the report print them as "≤ 250 µs".
//
// The faults scenario (RunFaults, FaultsOptions) is the exception to the
// in-process fleet: SIGKILL and SIGSTOP need processes, so it execs the
// kvroute binary as engine, sidecar and picker processes on 127.0.0.1
// (ports picked free, kept across restarts; every process dies with the
// bench, Pdeathsig, and is stopped at the end). Its results.json has
// "faults" (FaultsResult): "router_failed" and "unavoidable_failed" in
// total, before any fault ("baseline") and per fault, split by Classify
// under ClassificationRule (faultrules.go, pure, table-tested): a failure
// is unavoidable only when it was in flight on the engine SIGKILLed or
// SIGSTOPped, or through the picker SIGKILLed, between the signal and the
// process seen dead; every other failure is the router's. Per fault, hit
// rates before and after, the recovery time (recoveryTime), the pickers'
// outcome counters after recovery (accumulated across restarts), and a
// timeline. Its code splits by concern: faults.go runs it (the fleet, the
// load, the fault matrix's schedule), faultinject.go does and undoes each
// fault, faultfigures.go measures and reports, and faultrules.go holds
// the pure rules the figures apply.
//
// With Options.Duration (--duration) a scenario repeats until that much
// wall time has passed; per policy "resources" (ResourceReport) holds
// memory and goroutine samples and their growth — the bench process's own
// for in-process fleets, each picker's and sidecar's for the process
// fleet.
//
// Scenarios written as workload plans (test/workload: agentic-pressure,
// agentic-chat, the demo) run through the plan driver (plan.go), so the
// bench and the lab (virtual time) send the same requests for a seed:
// Plan(s, seed, rate) is a Scenario whose Run draws s's plan
// (workload.Options: the seed, the rate, the fleet's context length) and
// RunPlan drives it on the real clock — a goroutine per session, a root
// at its Start, a branch once its parent has been handed the answer to its
// turn or has ended, each wait (simulated time) through Client.Wait, each
// request through Client.Send (the Responses, chat and completions
// streams), its answer handed back to the session. An outcome's
// PrevEndpoint is the request's Prev or, when that is empty on a later
// turn, the endpoint of the conversation's latest answered turn at send
// time. A --duration repeat plans a seed drawn from its own stream.
//
// The client keeps connections idle for less than the picker does
// (IdleConnTimeout), and resends once, on a new connection, a request
// whose kept-alive connection broke before any byte of an answer — the
// picker closing it idle as the client reused it — counting it
// (PolicyResult.ReuseRetries) rather than failing the run.
package bench
