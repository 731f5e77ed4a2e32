package picker

import (
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/fleetview"
)

// Fleet is what the router reads of the fleet: the endpoints (all of
// them, or one identity group's), what each holds of a chain of block
// keys per tier, and where to report an engine it could not reach. The
// router judges health itself, from the endpoints' values and its
// Config.Health, at the now it decides at.
//
// Two implementations: picker/fleetview.View, the live view following
// the sidecars' streams (kvroute picker), and picker/localfleet, the same
// fleet state fed in-process by the sidecar's own cores, without sockets
// (tests, and the lab). Each is safe for concurrent use, and each also
// publishes rosters (see rosters), which is how the router reads a
// request's group.
type Fleet interface {
	// Endpoints lists every endpoint known, sorted by URL.
	Endpoints() []fleet.Endpoint
	// GroupEndpoints lists one identity group's endpoints, sorted by URL,
	// at a cost bounded by the group.
	GroupEndpoints(group string) []fleet.Endpoint
	// Match returns, for each endpoint of the group holding a prefix of
	// chain in tier t, its matched length in blocks (fleet.State.Match).
	Match(group string, t tier.Tier, chain []blockkey.Key) map[string]int
	// ReportFailure says the picker could not reach the engine at url
	// (passive outlier detection).
	ReportFailure(url, reason string)
	// Models are the models this picker follows (none: every model).
	Models() []string
}

// rosters is a Fleet that publishes each identity group's endpoints as a
// shared, immutable roster (fleet.Roster, rebuilt after a change): a
// request reads its group without copying it, and never modifies it. A
// Fleet without rosters is read through GroupEndpoints, copied per
// request.
type rosters interface {
	Roster(group string) *fleet.Roster
}

// fleetDiagnostics is what /debug/endpoints shows beyond the endpoints,
// when the fleet knows it: the endpoints offered but refused, and the
// sidecars whose stream fails (a fleetview.View does; an in-process fleet
// has no streams to fail).
type fleetDiagnostics interface {
	Refused() []fleetview.Refused
	Failing() []fleetview.SidecarFailure
	Untrusted(r fleetview.Refused) (since time.Time, detail string, ok bool)
}

// fleetSync is what /debug/sync shows, when the fleet knows it: how far
// its summaries are loaded (a fleetview.View does; an in-process fleet
// loads each snapshot as it is applied).
type fleetSync interface {
	Sync() fleetview.Sync
}

// health judges e at now, as the decision does (Config.Health).
func (r *Router) health(e *fleet.Endpoint) fleet.Health { return e.HealthAt(r.now(), r.cfg.Health) }
