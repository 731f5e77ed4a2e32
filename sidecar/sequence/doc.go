// Package sequence is the sidecar's event sequencer: the ordering rules of
// one data-parallel rank's KV event stream (DESIGN.md §5, docs/vllm-wire.md
// §1.2–1.3), as a core that the intake shell drives.
//
// Contract:
//   - One Sequencer per rank. The shell reports what it observes, in the
//     order it observes it: the intake opened (Start), a message arrived on
//     the live socket (Heard) and, when it parses, its seq (Live); each
//     batch of a replay exchange and the exchange's end (Replayed,
//     ReplayEnd); the engine start time the scraper read (EngineStart); a
//     wake-up with nothing received (Idle); an AllBlocksCleared event being
//     applied (Cleared). Each call returns the Actions to carry out, in
//     order; a Replay action's exchange is reported back before the next
//     observation.
//   - The rules. A live seq at or below the last one seen live is a new
//     engine process: restart (clear, new epoch), and the start of its
//     stream is replayed. A live seq already applied (through a replay) is
//     a duplicate: ignored, so a batch seen both replayed and live is
//     applied once. A live seq past the next one is a gap: replayed, and
//     the live batch applied after the replay. A replay that does not
//     return every missing batch, or fails, or cannot run (no replay
//     socket), marks the state partial. A changed engine start time is a
//     new engine process too (restart, catch up from the ring, drop the
//     live batch in hand: it is the old process's), unless the seq already
//     said so, in which case the next reading is adopted. The intake
//     opening, such a restart and a quiet spell of Config.IdleCheck catch
//     up from the replay ring: they take what it holds, and an empty ring
//     or no replay socket is no evidence of loss, but a ring that no longer
//     holds the start of what was asked is. AllBlocksCleared starts a new
//     epoch and the state is exact again (not partial).
//   - Invariants: batches are applied in strictly increasing seq order
//     between restarts; a replayed batch is applied only inside the range
//     asked for; at most one replay is in flight; MarkPartial is returned
//     once per partial spell; every live seq reported ends applied or
//     already covered. An observation that arrives while a replay is in
//     flight (other than Replayed, ReplayEnd, Heard and Cleared) first
//     ends that replay as failed.
//   - A core: no I/O, no goroutines, no logging, no clock (time comes in as
//     now). Not safe for concurrent use: the rank's intake goroutine owns
//     it. Each call returns a fresh slice.
package sequence
