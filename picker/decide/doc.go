// Package decide is the picker's routing decision over a snapshot: given a
// prepared request (its block keys already looked up), the endpoints of
// its identity group as the fleet state holds them (its roster,
// fleet.Roster), what each holds of the request's prefix per tier, the
// picker's own picks in flight, and `now`, it returns the chosen
// endpoint, the reason, and the explanation.
//
// Contract:
//   - Pure: no I/O, no clock reads, no randomness, no logging, no locks.
//     The same inputs give the same Decision in any process, so two picker
//     replicas that see the same state agree without talking, and every
//     rule is tested on tables.
//   - Health comes from the fleet state (fleet.Endpoint.HealthAt's
//     judgement, read from the roster's briefs: fleet.Brief.StateAt, once
//     per endpoint and decision, at its now): only routable endpoints
//     (cached or load-only; never draining or down) are candidates;
//     endpoints the caller excludes (already tried for this request) are
//     not either.
//   - The snapshot's roster is shared with every other decision over the
//     same group and is never modified. A decision costs what its group
//     holds: one pass over the roster's briefs (side by side in memory),
//     a candidate per endpoint for picker/score, and the chosen one priced
//     again for its plan and features rather than every candidate's kept;
//     the learned factors come index for index (Snapshot.Factors), not by
//     URL. A snapshot built by hand (Snapshot.Endpoints) is decided the
//     same, over a roster made of it. The per-endpoint working set lives
//     in Snapshot.Scratch when the caller gives one (the shell pools
//     them): the same decision as in fresh memory, and nothing returned
//     points into it.
//   - Scoring is picker/score's: matched blocks become tokens at the
//     group's block size; the load is the engine's last report plus this
//     picker's picks the report does not cover yet (picker/inflight).
//     Each candidate's predicted TTFT is priced here, by the snapshot's
//     fit of picker/predict (Snapshot.Model, Learned; the prior when none
//     is given): the tail past the longest match, the work ahead (this
//     picker's carried prefill, the engine's other waiting requests at the
//     learned mean uncached prompt), the running decodes. The Decision
//     carries the chosen one's prediction and the features it came from,
//     for the shell to learn from when the first token comes.
//   - Where the KV comes from (Config.Pulls, precise only): each
//     candidate is priced served from its own caches — its GPU prefix
//     free, what its CPU tier holds beyond it loaded back — and, when it
//     runs vLLM's P2P tier, pulling from each other endpoint whose CPU
//     tier holds more of the prefix (Snapshot.Sources; the source's CPU
//     tier only, as vLLM serves, its own health and load aside), the
//     pull's tokens weighted by the pulls this picker has in flight from
//     that source (inflight.Pending.PullsOut), so that a popular prefix
//     does not herd every consumer onto one link. The fastest of these is
//     the candidate's prediction; the chosen candidate's becomes
//     Decision.Plan and, when pulled, Decision.Source. A source is never
//     the computing endpoint, and is of the request's own identity group
//     (the snapshot's endpoints) and salt (the keys it matched on).
//   - The Decision carries everything the shell needs afterwards — the
//     figures for the answer, for the metrics (recorded by the shell in one
//     place) and for the in-flight record — so the shell never re-derives
//     any of it.
//   - RenderOrder chooses which engines of the group render a request's
//     tokens: routable ones, least loaded first, ties by URL.
package decide
