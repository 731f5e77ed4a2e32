// Package admit is the picker's admission core (DESIGN.md §13): when a
// model group is saturated, and a bounded queue of the requests waiting
// for it, released by priority band and, within a band, by fair queuing
// over a fairness key weighted by prompt tokens.
//
// Contract:
//   - Pure: no I/O, no goroutines, no clock; now comes in as an argument.
//     Not safe for concurrent use (the picker's shell holds a lock).
//   - Config.Saturated: a group is saturated when every routable endpoint
//     is (Config.EndpointSaturated: requests queued at or above
//     MaxWaiting, or KV cache usage at or above MaxKVUsage, or this
//     picker's prefill tokens in flight to it at or above
//     MaxPrefillTokens; a zero limit is not checked). A group without a
//     routable endpoint is not saturated: that is no endpoint (503), not
//     overload (429), and the two are never confused.
//   - Queue holds at most its size. Pop returns a waiter of the highest
//     priority band first; within a band, of the key whose head has the
//     least start tag, start-time fair queuing: a waiter's start tag is
//     the larger of the band's virtual time and its key's previous finish
//     tag, its finish tag the start plus its cost (prompt tokens, at least
//     1). Keys that send more wait longer; a key that was idle gets no
//     credit for it. Ties go to the earlier arrival.
//   - Within a key, waiters go oldest first, until the oldest has waited
//     the queue's LIFO threshold: the queue stands (load above capacity,
//     not a burst), and the key's newest goes first, so that those
//     released wait little and those that cannot be served expire
//     (adaptive LIFO).
//   - ExpireArrived takes out the waiters that arrived by a cutoff, of
//     keys ahead of their share (more than one waiter's cost past the
//     virtual time): the shell sheds with it, once the queue has stood for
//     Config.StandingTimeout, those that waited longer — under sustained
//     overload no released request of a key over its share has waited
//     more, and a key within its share waits for its turn.
//   - Push into a full queue makes room with a waiter of the lowest band
//     not above the newcomer's: the oldest of the key with the largest
//     finish tag (the one furthest ahead of its share). When every waiter
//     is of a higher band, the newcomer is refused.
//   - Remove takes out a waiter that left (its client went away);
//     Expire takes out those whose deadline passed. Memory is bounded by
//     the waiters held and the keys seen since the band was last empty.
//   - RetryAfter is the wait a refused client is told: the queue's length
//     over its recent release rate, within [1 s, 60 s].
package admit
