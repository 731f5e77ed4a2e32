// Package inflight is the picker's bookings of its own picks: the ledger
// of the picks no engine load report covers yet (what the picker sent each
// endpoint since the endpoint's last report, so that a burst of picks
// between two reports is not all sent to the same idle-looking engine),
// and the prefill work of the picks it carries to an engine until their
// first byte (admission's prefill in flight). Bookings holds both; the
// router's shell holds it under its one lock (picker/bookings.go).
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
package inflight
