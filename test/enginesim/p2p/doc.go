// Package p2p is the simulated engine's side channel for vLLM's P2P tier
// (TieringOffloadingSpec with a secondary tier {"type":"p2p"}): each rank
// listens on the tier's port, answers peers' lookups from its CPU tier,
// and pulls from the peer a request's remote_kv_source names.
//
// It substitutes for vLLM's ZMQ control session and NIXL/UCX data path.
// What it keeps of vLLM's behaviour (kv-transfer.md §2.3, §7):
//   - One connection per peer pair, opened by the first pull that names the
//     peer and reused both ways afterwards: either side sends lookups and
//     fetches over it and answers the other's. A second connection from a
//     peer that already has one is rejected ("duplicate connection").
//     Two nodes dialling each other at once keep the connection the lower
//     identity (compared as strings) dialled: the other side's pending
//     dial gives way to it, and its pulls go over it
//     (connections_total{outcome="crossed"}).
//   - Connections are keyed by the peer's identity, which is the address
//     it is dialled at: a peer answering a dial as another identity is
//     rejected, saying so (set the tier's host to the address peers use).
//   - A handshake first: the dialer sends connect, the listener answers
//     connect_ack, each carrying its identity (host:port, as it is dialed:
//     the tier's host verbatim and its port, base + data-parallel index)
//     and its fingerprint: the offload block size, the hash seed, the hash
//     algorithm and the model. A mismatch on either side rejects the peer
//     with a disconnect saying why; the consumer's pull fails and its
//     request recomputes. A connection not ready within the handshake
//     timeout is dead.
//   - A pull is a lookup of the request's block hashes, answered with the
//     leading count the source's CPU tier holds now and the pulls the
//     source is serving; then, when it hit, a fetch of the hits, answered
//     with transfer_done(success, blocks): the leading blocks still held
//     (one evicted since the lookup is a miss). The whole pull is bounded
//     by the pull timeout (vLLM's 30 s fetch timeout); any failure —
//     unreachable, rejected, handshake, timeout, peer down — is an error
//     whose Reason names it, and the caller recomputes (vLLM's MISS).
//   - No KV moves: the simulation has none. The transfer time is the
//     consumer's, computed from its profile with both ends' pulls under
//     way; the fetch carries it (in wall time) so the source counts the
//     pull as serving that long, and the consumer counts it as receiving.
//     Both counts are wall-clock: at a time scale of 0 pulls never
//     overlap.
//   - The first fetch over a connection, either way, reports First: it
//     pays the pair's connection setup (≈6 s on vLLM's GLM testbed).
//
// Where it differs from vLLM: lookups are not split per scheduler step
// (one lookup per pull, split only past MaxHashes hashes); an unanswered
// probe is bounded by the pull timeout (vLLM's has none); a peer's claimed
// identity is trusted, as vLLM trusts it (nothing authenticates a peer:
// see docs/security.md); a source does not pin blocks
// between lookup and fetch; the P/D roles (remote_prefiller,
// remote_decoder) are not served.
//
// Wire format: frames of a 4-byte big-endian length and one JSON object
// {"type": connect | connect_ack | disconnect | lookup | lookup_resp |
// fetch | transfer_done, …}; hashes are the 32-byte block digests
// concatenated (base64 in JSON). Everything from the network is hostile: a
// frame over MaxFrameBytes is refused before its body is read (and a body
// is held only as far as it arrived), a message over MaxHashes hashes, a
// bad field, a count past what was asked (hits, blocks) or a frame out of
// place (anything but connect opening a connection) closes the connection
// (kvroute_engine_p2p_frames_rejected_total{reason}) and fails the pulls
// on it as rejected, and the peer is logged at warn once, at debug after.
// A source's count of pulls under way is taken up to MaxActive. A peer's
// requests are answered MaxInflight at a time; the node's, across every
// connection, MaxAnswering at a time, and one past that is answered at
// once as a miss (reason "busy"). Writes are bounded by the pull timeout,
// connections by MaxSessions, inbound ones from one remote address by
// MaxSessionsPerHost (identities are self-asserted), and connections
// still in their handshake by 64 (more are closed at once).
//
// Answers come from a LookupFunc, which the engine serves on its scheduler
// goroutine: the core stays pure and single-threaded. Close ends every
// connection, telling peers, and returns once every goroutine has.
//
// Metrics (all ours, vLLM has none for its control connections):
// kvroute_engine_p2p_connections_total{direction,outcome},
// kvroute_engine_p2p_sessions, kvroute_engine_p2p_frames_rejected_total
// {reason} and kvroute_engine_p2p_served_total{op}.
package p2p
