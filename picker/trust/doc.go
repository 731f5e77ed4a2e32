// Package trust decides which endpoints the picker takes from a sidecar:
// any gossip member, or any sidecar the picker follows, may advertise any
// engine URL, and the picker sends users' prompts there. By default a
// sidecar may advertise only endpoints on its own host — the host of the
// address the picker dials for its summary stream — which is where a
// sidecar runs, beside its engine (in Kubernetes, the same pod: both at
// the pod's IP). Networks given with --allow-remote-endpoints widen it:
// an endpoint whose address lies in one is taken from any sidecar.
//
// Contract:
//   - Hosts are compared, never ports. IP literals are compared as
//     addresses: IPv4-mapped IPv6 unmapped, zones dropped.
//   - Loopback is one host, the picker's own: a loopback endpoint
//     (127.0.0.0/8, ::1, localhost) is the sidecar's host only when the
//     picker dials the sidecar at a loopback (or unspecified) address
//     too. A sidecar elsewhere advertising http://127.0.0.1:8000 would
//     steer prompts to the picker's own host: refused.
//   - Names: two equal names (case-insensitive, a trailing dot ignored)
//     are one host. localhost and names under .localhost are loopback
//     without a lookup (RFC 6761). Any other name is resolved by the
//     caller (the picker, with a bounded timeout and a cache) and judged
//     by its addresses: every address the endpoint's name resolves to must
//     be one of the sidecar's, or allowed. A name that does not resolve is
//     refused as unresolved. Names are as trustworthy as the resolver the
//     picker uses; IP addresses, as the deploy manifests advertise, need
//     none.
//   - An endpoint URL that is not http(s) with a host, or whose host is an
//     unspecified address (0.0.0.0, ::), is malformed: refused.
//   - Refusals carry a reason (ReasonRemote, ReasonMalformed,
//     ReasonUnresolved) and one sentence of detail naming both hosts.
//   - The package is pure: no I/O, no lookups, no clock, no logging.
//     Resolving names, caching them, counting and logging refusals are the
//     picker's (picker/fleetview).
package trust
