// Package localfleet is the in-process fleet: the picker's fleet
// (picker.Fleet) fed by the sidecar's own cores, with no gRPC, gossip or
// ZeroMQ, for tests and the lab (DESIGN.md §14). Where kvroute picker
// runs picker/fleetview over the sidecars' streams, this package hands the
// same updates over as values.
//
// Contract:
//   - Nothing is re-implemented. A Sidecar is one engine's sidecar core:
//     sidecar/index (configured as the sidecar configures it: the model,
//     the block size, the fleet's summary parameters) fed the engine's KV
//     event batches (internal/kvevents), and its updates taken as the
//     sidecar's delta tick takes them — a tier's snapshot the first time
//     it goes out in an epoch, then the counting summary's numbered
//     deltas (summary.Counting.TakeDelta). A Fleet is the fleet state
//     core (picker/fleet.State) taking them as fleetview does: Register
//     per endpoint, StartSnapshot stepped to its end, ApplyDelta, ApplyLoad,
//     Failed. The keys, summaries, matches and health are therefore the
//     real fleet's on the same events; a test holds the two side by side.
//   - Topology: one in-process sidecar per endpoint, as one sidecar beside
//     each engine pod (its name, fleet.Endpoint.Sidecar, is
//     SidecarPrefix + the URL). A Fleet owns the sidecars Add makes (Apply
//     feeds them, Publish streams their updates, Update does both for one
//     endpoint); a caller running several pickers shares one Sidecar per
//     engine between their fleets instead (Register, Receive; Snapshots
//     for a fleet that starts watching late), so each engine's events are
//     indexed once.
//   - Two steps, two times: events reach a sidecar (Apply, at now) apart
//     from its updates reaching the state (Publish or Receive, at a later
//     now if the caller models the delay), as over the wire. Batches come
//     in order and complete: the live stream's gaps, duplicates, replays
//     and engine restarts seen in its seqs (sidecar/sequence) are the
//     stream's concern and not modelled; AllBlocksCleared and Restart
//     start a new epoch, as the sequencer does.
//   - Time: every update is stamped with the now its caller passes; the
//     package never reads a clock but Config.Clock, where picker.Fleet's
//     methods carry no time (ReportFailure; the reads' freshness).
//     Config.InSync (the default) makes reads see every endpoint as heard
//     from at Clock(): nothing between an in-process sidecar and the state
//     can go silent, so staleness (fleet.HealthConfig.StaleSummary,
//     DownAfter) never bites whether or not the caller sends load reports
//     — a wall-clock test need not, and the lab, passing its virtual
//     clock, gets the same. Off, an endpoint is as fresh as its last
//     update, for a caller modelling a silent sidecar. A roster (Roster)
//     is the state's, shared; in sync, its endpoints not heard from at
//     Clock() are stamped copies (and their briefs), the state's roster
//     untouched.
//   - Health otherwise is the state's (fleet.Endpoint.HealthAt): loads
//     come from SetLoad (the sidecar's load report); ReportFailure ejects
//     for Config.Health's backoff; Probe readmits, as fleetview's probe of
//     the engine does — there is no goroutine to do it unasked.
//   - Concurrency: a Fleet is safe for concurrent use (one RWMutex;
//     Match, Endpoints, GroupEndpoints and Roster under the read lock,
//     Roster also under a mutex of its own: the core keeps the rosters it
//     builds). It starts no goroutine and does no I/O. A Sidecar is not safe for concurrent use:
//     a Fleet serialises those it owns; a shared one is driven from one
//     goroutine.
//   - Config follows the one rule for defaults: DefaultConfig returns
//     them, zero values are invalid (Validate), New fills nothing in.
package localfleet
