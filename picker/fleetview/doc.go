// Package fleetview is the picker's live view of the fleet: it follows the
// sidecars (found through gossip, or named directly), keeps one summary
// stream per sidecar, and holds, per identity group and tier, a bit-sliced
// fleet index (internal/summary.Fleet) of every endpoint's summary plus its
// last load report.
//
// Contract:
//   - An endpoint belongs to the identity group of its model, block size,
//     key format, summary parameters and tokenizer fingerprint; endpoints of
//     different groups are never compared. Endpoints whose summary
//     parameters differ from the picker's are refused and counted.
//   - A stream resumes from the positions the view holds; a delta that does
//     not follow (lost, new epoch) makes the view ask again and take a
//     snapshot. A sidecar that leaves (or is forgotten) takes its endpoints
//     out of every index at once.
//   - Match is safe to call from any goroutine while streams apply updates.
//   - Staleness per endpoint is the time since its last update of any kind.
package fleetview
