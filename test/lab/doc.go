// Package lab is kvroute's virtual-time lab (DESIGN.md §14): a
// scenario's requests (package test/workload, the same plans the
// real-process bench sends) through N engines and M pickers, in virtual
// time, one run in one goroutine, with no sockets.
//
// Contract:
//   - Nothing is re-implemented. Engines are the simulated engine's
//     scheduler core (test/enginesim/sched, with its paged cache) stepped
//     on the virtual clock, their bodies parsed and rendered by the
//     engine's own front end (enginesim.Front). Sidecars are the sidecar's
//     cores (sidecar/index and the counting summaries, through
//     picker/localfleet.Sidecar), one per engine, shared by the pickers.
//     Pickers are picker.Router — its Prepare, Snapshot, Decide and Book
//     steps, the fleet state, decision, scoring, peers' policies and
//     bookings — each over its own in-process fleet (picker/localfleet)
//     with its own bookings, on the virtual clock (picker.Config.Clock),
//     rendering in process (picker.Config.Renderer). test/repo fails if the
//     lab stops depending on those packages or holds a copy of one of
//     their functions.
//   - Only the shells are replaced: a clock and an event queue stand for
//     sockets, timers and goroutines, and the delays between components
//     are modelled (Delays: KV event to index, the sidecar's delta tick,
//     summary and load report transit, the load report period, render,
//     the picker-to-engine hop), each with a default measured in
//     docs/benchmarks.md.
//   - Several pickers share their bookings as kvroute picker's bookings
//     streams do (DESIGN.md §16): each router journals its booking changes
//     (picker.Router.ShareBookings); the first change after a quiet spell
//     starts a flush Delays.BookingFlush later (the shell's --bookings-flush
//     ticker, at its longest wait), whose batch reaches every other picker
//     a Delays.Hop later (Router.ApplyBookings), each batch to each picker
//     lost with Config.BookingLoss's chance. Config.Isolated turns the
//     exchange off (the ablation: each picker knows its own picks only).
//     Peer policies keep their own state per picker, as in their systems.
//   - A request goes to a picker drawn at random (as a Kubernetes Service
//     spreads connections), is decided there after the render time, is
//     booked, reaches its engine a hop later, and is answered token by
//     token at each step's end; its first chunk and first token reach the
//     picker a hop after the engine made them (FirstChunk: a Responses
//     stream's response.created at once, a chat or completions stream's
//     first token; FirstToken), and its end ends the booking (Done). Its
//     TTFT is the client's: from sending to the first output token.
//   - Each engine's load report (every Delays.LoadPeriod, at its own
//     phase) is what its /metrics would say after its last finished step:
//     waiting, running, KV usage, and its own request figures
//     (fleet.EngineStats: prompt and cached tokens, the TTFTs at each
//     first token, queue and prefill times at each request's end, as
//     vLLM observes them), cumulative on the virtual clock.
//   - Precise's TTFT model learns in the lab as in production: at each
//     pick's FirstToken, from its booking to the engine's first token and
//     the hop back (Outcome.PredictedTTFT beside Outcome.DispatchTTFT;
//     Figures.PredictionError their steady median relative error).
//     RunLearned returns what the first picker's models learned.
//   - Admission is off (policy comparisons run without it): every
//     request is decided at once.
//   - llm-d-calibrated (LLMDCalibrated) is llm-d with its load gate at the
//     peak prefill throughput llm-d's own recipe measures on the lab's
//     engines (Calibrate: probes through a picker, never the profile's
//     constants), once per sweep; llm-d-precise on a scenario sending
//     /v1/responses is labelled as given tokens.
//   - KV tiers: engines of a fleet with a CPU tier (the scenario's
//     Fleet.CPUBlocks, or Config.CPUBlocks) run vLLM's OffloadingConnector
//     at its defaults (offload block = GPU block, prompt blocks only, LRU,
//     placeholder CPU events, which the sidecar attributes through the
//     GPU stores) and its P2P tier, each advertising a KV source. A
//     picker's named source rides to the engine as remote_kv_source; the
//     engine's lookup is answered at its time from the source's CPU tier
//     as it then is, the transfer priced by transfer.Links (the profile's
//     setup and bandwidth, shared by the pulls on either end, a pair's
//     first pull paying the connection), a pull past vLLM's 30 s timeout
//     failing into a recompute. Each Outcome splits its prompt by GPU
//     hit, CPU hit, pulled and recomputed (the engine's figures), and
//     Figures.Tiers sums them with the pulls. precise-no-pull is precise
//     with its source decision off (its recompute control); the peers'
//     arms with pulls are policies (score.ArmPolicies), llm-d-calibrated+p2p
//     is llm-d+p2p with llm-d-calibrated's gate, and the …+p2p-calibrated
//     arms run at the minCachedTokenDelta llm-d's own ladder measures on
//     the sweep's profile (RunLadder, once per sweep; results.json
//     p2p_ladder).
//   - The summaries are sized by Config.Capacity (the sidecar's
//     --capacity; default 65,536 blocks) and the engines named by
//     Config.EngineURLs when set (decisions hash endpoint names).
//   - Deterministic: events at one instant run in the order they were
//     scheduled, every random draw comes from the run's seed, and
//     results.json holds no wall-clock time, so the same scenario, seeds,
//     rates and flags give the same bytes. Runs of a sweep are independent
//     and may run in parallel (Sweep.Workers) without changing them.
//   - Figures per run (Figures): the hit rate, TTFTs and completions as
//     the bench defines them; warm returns, the share of follow-ups (a
//     completed later turn whose previous turn's engine is known) that
//     landed on that engine (follow-ups on their previous turn's worker,
//     the stickiness SMG's cache-aware routing aims at); and the spread of completed requests over the
//     engines (every engine counted, idle ones as 0): load imbalance, the
//     busiest ÷ the mean, and load CV, their population standard
//     deviation ÷ their mean.
//   - The protocol (Sweep): every policy on every seed at every rate, each
//     run on a fresh fleet; per policy and rate the mean of each figure
//     and its 95% interval over the seeds (package stats); against the
//     best peer, per seed each policy's ratio to the best peer on that
//     seed, and the mean ratio with a bootstrap 95% interval; with several
//     rates, goodput. Defaults are tuned on seeds 1–10; claims use seeds
//     from ClaimSeeds (101) up, and results.json says which.
//   - By pickers (RunByPickers, kvroute lab --pickers 1,2,4,8): the sweep
//     once per number of pickers, the same scenario, policies, seeds and
//     rates; results.json is the sweep at one picker with "by_pickers":
//     per policy, count and rate the means of the hit rate, p99 TTFT,
//     load CV and warm returns, and past one picker the hit rate and p99
//     TTFT ÷ one picker's on the same seed (the same policy and rate), a
//     mean ratio with a bootstrap 95% interval (stats.PairedRatio); with
//     several rates goodput and its ratio likewise; and the sweeps at the
//     other counts whole. One count is RunSweep at that count, the same
//     bytes.
package lab
