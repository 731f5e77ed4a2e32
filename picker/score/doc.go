// Package score is the picker's decision core: given one request and the
// candidate endpoints of its identity group (what each holds of the
// request's prefix, per tier, and its load), it chooses one endpoint and
// says why.
//
// Contract:
//   - Pure: no I/O, clocks, randomness or logging. The same Request,
//     candidates and Config give the same Decision, in any process — two
//     picker replicas that see the same state agree without talking.
//   - Precise: each candidate's cached tokens are its matched tokens per
//     tier, weighted (GPU 1, CPU and storage less: they must be loaded
//     back); its estimated time to first token is the uncached prompt
//     tokens plus the work queued ahead of it, in prefill tokens. The
//     lowest estimate wins among the candidates under the bounded-load cap
//     ⌈(1+ε)·mean⌉ in-flight requests (mean over healthy candidates,
//     counting this request; never below MinCap, so that at low load a
//     conversation is not scattered); an endpoint at the cap is skipped while any
//     is under it, and skipping the best-cached one is reported as a load
//     override with the tokens it cost. For a cache hit the cap binds
//     only on a saturated engine (Config.SaturationWaiting,
//     SaturationKVUsage), and moves the request only to an endpoint whose
//     estimated cost is at most Config.OverrideCost times the warm one's.
//   - Cold prefixes (no candidate holds MinMatchTokens of the prompt) are
//     placed by rendezvous hashing with bounded loads on the request's
//     anchor, so siblings of a new prefix co-locate before any KV event
//     arrives. Requests without an anchor go to the least-loaded endpoint.
//   - Ties break by the rendezvous weight of the anchor (or of the
//     request's first key; of the request count for load-only choices, so
//     the least-loaded baseline has no accidental affinity), never by
//     input order or a random source.
//   - The baseline policies (prefix-hash, least-loaded, round-robin) use
//     the same candidates and cap rules, so the bench compares like with
//     like.
package score
