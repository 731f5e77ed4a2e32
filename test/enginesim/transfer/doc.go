// Package transfer is the simulated fleet's link model for peer-to-peer
// KV pulls (kv-transfer.md §2, §6–§8): how long a pull of a prefix from a
// peer's CPU tier takes when other pulls share the nodes' links.
//
// Contract:
//   - A pull of n tokens from src to dst started at now lasts
//     profile.PullTime(n, share, first): the profile's setup, plus its
//     connection cost when first, plus the bytes at the link's bandwidth
//     divided by share = 1 + max(pulls active on src, pulls active on dst)
//     at now. Active means started at or before now and ending after now,
//     with src or dst as either end. The source's GPU is not involved: a
//     pull costs the source's CPU memory and NIC only (kv-transfer.md
//     §1.3), so nothing here touches an engine.
//   - first is true for the first pull between an unordered pair of nodes
//     (vLLM opens one bidirectional connection per peer pair, §2.3); every
//     later pull between them, in either direction, is warmed.
//   - Approximations, stated: the share is fixed when a pull starts (it is
//     not re-divided as other pulls start or end, so a pull that started
//     alone keeps its full bandwidth); a pull that starts on a pair while
//     the pair's first pull is still connecting does not wait for the
//     connection; and links have no topology beyond their two ends.
//   - Duration is the same arithmetic from counts, for the real-process
//     engine, where each engine knows only its own pulls and learns the
//     other end's count over its side channel; Active is what a node
//     reports of itself there.
//   - PullTimeout is vLLM's _LOAD_TIMEOUT_S (30 s, §7): a pull that would
//     take longer fails at its start + PullTimeout and the request
//     recomputes. The shell applies it (the scheduler core only takes the
//     outcome).
//   - Simulated time only goes forward: Links forgets pulls that ended
//     before the latest now it was given, so a later call with an earlier
//     now may count fewer active pulls than there were.
//
// The package is pure: no I/O, clock, randomness, goroutines, locks or
// logging; Links is not safe for concurrent use (its shell serialises
// calls). Times are simulated durations since the shell's epoch.
package transfer
