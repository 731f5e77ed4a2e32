// Package fleetview is the picker's live view of the fleet: the shell
// around the fleet state core (picker/fleet.State). It follows the
// sidecars (found through gossip, or named directly), keeps one summary
// stream per sidecar, decodes what arrives into kvroute's own values, and
// feeds the core, which holds, per identity group and tier, the bit-sliced
// fleet index (internal/summary.Fleet) of every endpoint's summary plus its
// last load report. A View is the picker's Fleet (picker.Fleet) in
// kvroute picker; picker/localfleet is the same state fed in-process.
//
// Contract:
//   - What is taken, refused, dropped, resynchronised or matched is the
//     core's decision (see picker/fleet): endpoints of different identity
//     groups are never compared; an endpoint whose summary parameters
//     differ from the picker's, whose group is full, or that another live
//     stream already owns is refused, counted and listed (Refused).
//   - The shell does the rest: dialling (TLS or plaintext), one follow
//     goroutine per sidecar with a retry wait, reconciling with gossip
//     (which never forgets a sidecar named with WatchStatic),
//     decoding protobuf and summary payloads (outside the lock: snapshots
//     are large), parsing the wire tier (an unknown or missing one is a
//     malformed update), the clock (every time the core records is read
//     here), stepping snapshot loads, and the metrics and log lines.
//   - A stream resumes from the positions the core holds; a delta that
//     does not follow (lost, new epoch) ends the stream, counted as a
//     resync, and the next one takes a snapshot; a malformed update ends it
//     likewise, counted as malformed. A sidecar that gossip forgets, or
//     whose stream cannot be re-established (gRPC Unavailable), is lost:
//     its endpoints stay, routed by load only while their engines answer
//     the view's own /health probe, for the sidecar grace period; a stream
//     that comes back takes them back.
//   - Health: every HealthConfig-judged transition (cached, load_only,
//     down, with its reason) is logged once, when the view judges (every
//     HealthEvery, and at once after an ejection), and counted; the states
//     are a gauge at scrape time. ReportFailure is the passive outlier
//     detection the router feeds (proxy and render failures); an ejected
//     engine is probed when its backoff ends and readmitted on success.
//   - Logs, once per transition: a sidecar joining (a stream started), a
//     sidecar leaving, a summary stream failing (again when the reason
//     changes), and recovering.
//   - A failing stream is classified (tls: a TLS handshake failed or was
//     refused; unavailable: not reached; stream: ended otherwise), listed
//     with its last error and start by Failing until the stream is up or
//     the sidecar forgotten, and counted by reason in
//     kvroute_picker_sidecar_streams_failing; its log line names the
//     sidecar and the reason, with a hint for tls and unavailable.
//   - Config.TLS dials the sidecars (nil: plaintext); credentials that
//     build their configuration per handshake (gossip/secretfile) make a
//     rotation apply to new streams only.
//   - Concurrency: one RWMutex serialises every access to the core —
//     Match, Endpoints, GroupEndpoints, Roster (and a mutex of its own:
//     the core keeps the rosters it builds) and Refused under the read
//     lock, everything else under the write lock — and a stream checks
//     its context under that lock before touching the core, so Forget is
//     exact. Snapshots are written by one loader goroutine, all the loads
//     of one index together in one lap of its rows (summary.LoadBatch): a
//     load joins the lap under way when it arrives and is written one lap
//     later, a part at a time, each part prepared without the lock and
//     written under it; an endpoint reads as absent in its tier until its
//     last part, and its stream waits for the load before applying
//     anything after it. Match is safe to call from any goroutine while
//     streams apply updates.
//   - A summary stream's flow-control window holds a whole snapshot (at
//     most 16 MiB) and is static: a sidecar sends a snapshot without
//     waiting on window updates, and the picker writes nothing back per
//     update (no bandwidth-probe ping); what a stream may hold unread is
//     bounded by the window.
//   - Per request, only the request's identity group is read (Match,
//     Roster: bounded by the group, not the fleet; the roster is the
//     core's, shared by every request until the group changes, never
//     copied per request); Endpoints and
//     Refused walk the whole fleet and are for listings and scrapes.
//   - Config.Models, when set, bounds what is followed. A sidecar whose
//     gossip metadata advertises its models (gossip.Meta.Models), none of
//     them followed, is never dialled: counted while gossip lists it
//     (kvroute_picker_sidecars_skipped_for_model) and logged at debug; if
//     its metadata comes to advertise a model followed it is followed
//     then, and a sidecar followed whose metadata comes to advertise none
//     (its engine redeployed with another model) is dropped, its stream
//     ended and its endpoints removed at once (not kept by load only, as
//     a lost sidecar's are). A sidecar that advertises no models (an
//     older one, or names that did not fit: unknown), or one named with
//     WatchStatic, is dialled: its endpoints of other models are never
//     handed to the core but listed by Refused (model_not_followed) and
//     counted; one serving none of them is asked what it serves (Info) and
//     never streamed, and asked again every 30 s.
//   - Trusted endpoints only: before the core sees a sidecar's endpoints,
//     each is judged by package picker/trust against the host of the
//     address the view dials for that sidecar (Watch's address: gossip's
//     gRPC address or --sidecars). By default only endpoints on the
//     sidecar's own host are taken; Config.AllowRemote widens it. The
//     shell resolves the names the policy meets (Config.Lookup, bounded
//     by LookupTimeout, answers kept 30 s, failures 5 s) outside the lock.
//     A refused endpoint never reaches the core (never routed, never
//     probed); it is listed by Refused with its reason (Untrusted adds
//     since when and why), counted (kvroute_picker_endpoints_untrusted
//     now, kvroute_picker_trust_refusals_total and
//     kvroute_picker_endpoints_refused_total each time one is refused)
//     and logged once per transition, not per stream. A sidecar none of
//     whose endpoints is trusted is not streamed, and asked again every
//     30 s, as one serving no model followed.
//   - An endpoint's KV source (EndpointInfo kv_source: its engine's P2P
//     side channel, where peers pull its CPU-tier KV from) is taken into
//     fleet.Identity.KVSource only as host:port on the endpoint URL's own
//     host (KVSourceOf), the host the trust check judged: a sidecar can
//     name a port of its engine's host, never send engines to pull from
//     elsewhere. Anything else is dropped (the endpoint is taken without
//     a source: never named as one) and logged at warn, once per stream.
//   - Staleness per endpoint is the time since its last update of any kind.
//   - Series per endpoint (label engine): two by default, its staleness
//     and its current health state (kvroute_picker_endpoint_state at 1);
//     Config.PerEndpointMetrics adds the other states at 0 (five in all).
//     Everything else the view exports is fleet-wide or by a label of a
//     few values (reason, state, kind, result), whatever the fleet's size.
//   - Sync counts the endpoints held, those whose sidecar's first state is
//     applied (a load report, which a sidecar sends after an endpoint's
//     snapshots and the view applies after writing them) and those with a
//     summary loaded, and the snapshots received and waiting: synced once
//     every endpoint held has reported with nothing waiting.
//   - Config follows the one rule for defaults: DefaultConfig returns
//     them, zero values are invalid (Validate), New fills nothing in.
package fleetview
