// Package fleet is the picker's fleet state: every endpoint the sidecars
// offer, its identity group, its last load report and, per identity group
// and tier, the bit-sliced index (internal/summary.Fleet) of every
// endpoint's summary. State is the core; picker/fleetview is the shell
// that follows the sidecars' streams and feeds it.
//
// Contract:
//   - Values here are kvroute's own (Identity, Load, Endpoint, Position),
//     never protobuf messages: the stream shell converts.
//   - An endpoint belongs to the identity group of its model, block size,
//     key format, summary parameters and tokenizer fingerprint; endpoints
//     of different groups are never compared, and Match reports only the
//     endpoints of the group asked for that hold some of the prefix.
//     Identity.KVSource (where peers pull the endpoint's CPU-tier KV from,
//     as the shell took it) is not part of the group: it is replaced with
//     the rest of the identity at each Register.
//   - State decides: which endpoints are taken and which refused, and why
//     (summary_params, group_full, other_owner — Register returns each
//     call's refusals for the shell to count and log); who owns an
//     endpoint (the first sidecar, while its stream is live); when an
//     endpoint starts over (new owner, new identity group); where a stream
//     resumes (the positions Register returns); what an update does — a
//     delta that does not follow asks for a resync, a bad one is
//     malformed, and either drops the endpoint's summary in that tier; a
//     snapshot is absent until its last step; and Match's verification of
//     the leaders' chains, since the index's search assumes prefix-closed
//     caches.
//   - The core does no I/O, starts no goroutine, never logs and never
//     reads the clock: every time it records (LastUpdate, LoadAt) is the
//     caller's now. test/repo's dependency test holds it to that.
//   - State holds no lock and is not safe for concurrent use: its caller
//     serialises access (fleetview with an RWMutex). Match, Endpoints,
//     GroupEndpoints, Roster, Refused and Positions only read, so they
//     may run concurrently with one another under a read lock, never
//     with anything else; Roster may run with them, not with itself (it
//     keeps the rosters it builds: the caller serialises Roster calls
//     under its read lock, fleetview and localfleet with a mutex of their
//     own); a snapshot load (StartSnapshot) is stepped under the
//     caller's write lock, which it may release between steps, alone or
//     batched with other loads of the same index (summary.LoadBatch).
//   - A group's index grows with its endpoints by half again at least
//     (up to Config.Slots), so that endpoints arriving one by one copy it
//     O(log n) times.
//   - A decision reads its group through Roster: the group's endpoints
//     as of the last change, with a Brief of each (URL, load report, the
//     health verdict as far as it does not depend on the time, when the
//     endpoint was last heard from: 80 bytes side by side, where the
//     endpoints' copies are apart), immutable, built on the first read
//     after a change and shared by every read until the next (as grpc-go
//     builds a picker on each state change). Every write to an endpoint
//     marks it changed; the next roster copies the last one's two slices
//     and patches in only the endpoints marked (a change of membership
//     rebuilds it whole), the others' copies are shared, so load reports
//     arriving several times a second per endpoint cost a read a few
//     copies, not the group. Nothing modifies a roster once built,
//     neither the state nor its readers; a reader keeps it as long as it
//     likes. GroupEndpoints returns copies instead, safe to change.
//   - A request's reads are bounded by its identity group: Match,
//     Roster and GroupEndpoints cost what the group holds (at most
//     Config.Slots endpoints), never what the fleet holds; only
//     Endpoints and Refused walk the whole fleet, for listings and
//     scrapes.
//   - Endpoint health is judged in one place, Endpoint.HealthAt
//     (health.go): cached, load-only, draining or down, each with its
//     reason (DESIGN.md §11), from the signals State holds beside the
//     endpoint — the sidecar's verdicts (engine down; stream silent,
//     replay-only, partial; a drain it announced), staleness, a lost
//     sidecar and the picker's probe of its engine, and the passive outlier
//     ejections (Failed, ProbeDue, Probed, with a doubling backoff; a
//     snapshot of a new engine epoch, a restarted engine, starts the
//     backoff over and makes an ejected endpoint's probe due at once). Only
//     cached and load-only endpoints are routable. The judgement is a
//     verdict that does not depend on the time and the time's part
//     (staleness, from when the endpoint was last heard from): StateAt,
//     and a Brief's StateAt from the verdict it keeps, judge the same
//     state at any now without wording the reason. Judge reports the
//     transitions since its last call and drops endpoints whose sidecar's
//     grace has ended, or whose sidecar left after announcing a drain.
//   - Config follows the one rule for defaults: DefaultConfig returns
//     them, zero values are invalid (Validate), New fills nothing in.
package fleet
