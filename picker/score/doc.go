// Package score is the picker's decision core: given one request and the
// candidate endpoints of its identity group (what each holds of the
// request's prefix, per tier, and its load), it chooses one endpoint and
// says why.
//
// Contract:
//   - Pure: no I/O, clocks, randomness or logging. The same Request,
//     candidates and Config give the same Decision, in any process — two
//     picker replicas that see the same state agree without talking.
//     DecideWith decides the same in a caller's Scratch, reused between
//     decisions (one at a time); nothing a Decision holds points into it.
//   - Precise: each candidate carries the request's predicted time to
//     first token there (Candidate.Predicted: picker/predict's model,
//     priced by picker/decide), in which its cached prefix, its queue and
//     its running decodes already weigh. The fastest wins among the
//     candidates under the bounded-load cap ⌈(1+ε)·mean⌉ in-flight
//     requests (mean over healthy candidates, counting this request;
//     never below MinCap), a safety net the predictions seldom reach;
//     candidates predicted within Config.TieRatio of the fastest are tied,
//     and the rendezvous weight on the request's anchor breaks the tie, so
//     that a new prefix's siblings co-locate before any KV event arrives
//     and replicas with slightly different bookings agree. With an SLO
//     (Request.SLO), the candidate holding most of the prefix among those
//     predicted within it wins; when none is, the fastest. Choosing
//     another than the best-cached candidate is reported as a load
//     override with the tokens it cost.
//   - Weighted cached tokens (GPU 1, CPU and storage less) are what the
//     decision reports and books; they do not choose.
//   - Ties break by the rendezvous weight of the anchor (or of the
//     request's first key; of the request count for load-only choices, so
//     the least-loaded baseline has no accidental affinity), never by
//     input order or a random source.
//   - The baseline policies (prefix-hash, least-loaded, round-robin) use
//     the same candidates and cap rules, so the bench compares like with
//     like.
//   - Every candidate is explained (Decision.Explain: its figures and why
//     it won or lost) unless the request is Terse, which changes nothing
//     else: the router asks for the explanation only when its caller does
//     (explain=true).
package score
