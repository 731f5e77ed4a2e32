// Package standing is the picker's account of each fairness key's recent
// use of a model group against its fair share: the core behind
// --engine-priority, which tells the engines (vLLM's request priority)
// to run the requests of a key within its share before those of a key
// beyond it.
//
// Contract:
//   - Pure: no I/O, no goroutines, no clock, no logging; now comes in as
//     an argument. A Ledger is not safe for concurrent use (its shell
//     holds a lock).
//   - Use is prompt tokens (the admission queue's cost), decayed
//     exponentially with Config.HalfLife: a key's use is the sum of its
//     requests' costs, each weighed 2^(−age/HalfLife).
//   - The active keys are those with a request within Config.Window. The
//     fair share is the active keys' total use over their number (equal
//     weights). A key is beyond its share when its use exceeds the share
//     by more than Config.Slack (a fraction of it): a key alone is never
//     beyond, and two keys sending alike are both within.
//   - A key is ahead (well within its share) when other keys are active
//     and its use is below Config.Ahead (a fraction, default ½) of the
//     share: never alone, never when all send alike.
//   - Charge judges a request's key as it was before the request (a key's
//     first request is within its share) and then adds the request's
//     cost.
//   - Memory is bounded: keys idle for longer than Window are forgotten
//     (oldest first, as requests arrive), and at most Config.MaxKeys are
//     kept (past it, the least recently seen goes).
//   - Priority maps a request's admission band (higher first, as
//     x-kvroute-priority) and its key's standing to vLLM's priority
//     (lower first): −2·band, plus 1 when beyond its share. The band
//     always outranks the standing.
package standing
