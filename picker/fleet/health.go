package fleet

import "time"

// Health is how routing may use an endpoint, judged from what the state
// knows of it. This is the one place endpoint health is decided (DESIGN.md
// §11): the routing decision asks Health and never judges staleness
// itself, so states such as load-only (cache unknown), draining and down
// for their own reasons are added here and reach every caller at once.
type Health uint8

// The health states.
const (
	// Routable: the endpoint may be picked, with cache credit.
	Routable Health = iota
	// StaleLoad: its last load report is older than the limit; nothing
	// is sent to it.
	StaleLoad
)

func (h Health) String() string {
	switch h {
	case Routable:
		return "routable"
	case StaleLoad:
		return "stale_load"
	}
	return "unknown"
}

// HealthAt judges e at now. An endpoint whose sidecar has sent no load
// report yet is routable (it is new, not stale); one whose last report
// arrived more than staleLoad before now is not.
func (e *Endpoint) HealthAt(now time.Time, staleLoad time.Duration) Health {
	if e.HasLoad() && now.Sub(e.LoadAt) > staleLoad {
		return StaleLoad
	}
	return Routable
}
