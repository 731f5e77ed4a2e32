// Package workload holds the benchmark scenarios as plans that either
// clock can run: the real-process bench (test/bench, wall time over
// sockets) and the lab (test/lab, virtual time over the production cores)
// drive the same sessions and send the same bytes (DESIGN.md §9, §14).
//
// Contract:
//   - A Scenario turns a seed into a Plan: sessions, each with a start
//     offset (simulated time from the run's start) or a dependency on
//     another session's turn, and a Session that yields its requests one
//     at a time, each after the answer to the one before.
//   - A Session sees only what a client sees (Answer: the endpoint header,
//     the output text, the prompt tokens the usage reported, whether the
//     request completed). It never reads a clock: waits are returned as
//     simulated durations, and the driver (bench or lab) applies them on
//     its own clock.
//   - Plans are deterministic: the same scenario and seed give the same
//     sessions and, given the same answers, the same request bytes.
//   - Sessions are driven from one goroutine each (the bench) or all from
//     one (the lab); state shared between sessions (a branch's fork) is
//     guarded here, so either driver is safe.
//   - Rate multiplies the scenario's nominal arrival rate (a load sweep's
//     point): start offsets and open-loop arrival gaps are divided by it;
//     the think time inside a session is not.
//
// The package does no I/O but reading a trace file a scenario names.
package workload
