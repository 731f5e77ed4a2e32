// Package inflight is the picker's bookings of its own picks: the ledger
// of the picks no engine load report covers yet (what the picker sent each
// endpoint since the endpoint's last report, so that a burst of picks
// between two reports is not all sent to the same idle-looking engine),
// the prefill work of the picks it carries to an engine until their first
// byte (admission's prefill in flight), and the carried picks until their
// first output token (the queue the TTFT model prices, and the block keys
// of their prompts, about to be cached there). Bookings holds them all;
// the router's shell holds it under its one lock (picker/bookings.go).
//
// Contract:
//   - Pure: it takes `now` as an argument, reads no clock, does no I/O
//     and holds no lock (the caller serialises access).
//   - A pick counts until the endpoint's next load report arrives after
//     it was made (the report then counts it), until it is Done, or until
//     Config.Forget has passed, whichever comes first.
//   - A pick's queued prefill work shrinks at Config.PrefillTokensPerSecond
//     from the moment it was made, never below zero.
//   - At most Config.PerEndpoint picks are kept per endpoint; past that
//     the oldest is dropped.
//   - A carried booking's prefill counts from Book until FirstByte or
//     Done, once; a decision-API pick (not carried) counts none. Move
//     (a fallback served the request) takes the prefill along only before
//     the first byte.
//   - A carried booking awaits its first output token from Book until
//     FirstToken or Done, once (AwaitCount, AwaitTokens in Pending); its
//     prompt's block keys (Hold) are held on its endpoint as long, and
//     HeldPrefix answers how many leading keys of a chain are held there.
//     Move takes both along while the pick awaits.
//   - Shared with the other pickers (DESIGN.md §16, peers.go): with
//     Journal on, every change to this picker's own bookings is kept as
//     an Op (add, pull, first byte, first token, done) for TakeJournal,
//     at most JournalLimit between takes (past it the journal says it
//     overflowed), and Live lists the ones that count now. Apply counts
//     another picker's Ops as this picker's own picks are counted (the
//     ledger, the wait for a first token, pulls, prefill), idempotently:
//     an add held already, or a change to a booking not held, is ignored.
//     A peer's booking counts until released or until PeerLifetime after
//     its pick (Expire), so a lost release never leaves a phantom; a lost
//     add hides the pick only until a load report covers it. Peers'
//     bookings are never journalled, and their prompts' keys are not
//     shared (HeldPrefix is this picker's own).
package inflight
