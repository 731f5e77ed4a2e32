package verify

import (
	"fmt"
	"slices"
	"strings"
)

// Components whose admin ports serve /metrics (deploy/monitoring's names).
const (
	ComponentPicker  = "picker"
	ComponentSidecar = "sidecar"
	ComponentGossip  = "gossip"
)

// MetricsFacts is what one component's admin port served at /metrics.
type MetricsFacts struct {
	// Component is ComponentPicker or ComponentSidecar.
	Component string
	// URL is the admin base URL asked (/metrics under it).
	URL string
	// Names are the series it served: each sample's metric name (a
	// histogram's …_bucket, …_sum, …_count), sorted, each once.
	Names []string
	// Err says why /metrics was not served: the request's error, or the
	// status; "" when it was.
	Err string
}

// JudgeMetrics gives one "metrics served" check per admin port: it passes
// when /metrics answers with every series want lists for the port's
// component and, from a port that serves any of gossip's series (the
// process gossips), every series want lists for gossip. It fails naming
// the series missing, or saying why /metrics was not served. want is by
// component: the series the dashboard reads (deploy/monitoring).
func JudgeMetrics(ms []MetricsFacts, want map[string][]string) []Check {
	var out []Check
	for _, m := range ms {
		c := Check{Name: "metrics served", Endpoint: m.URL}
		if m.Err != "" {
			c.Detail = fmt.Sprintf("the %s's admin port does not serve /metrics: %s", m.Component, m.Err)
			c.Cause = "the address is not the " + m.Component + "'s admin port (--admin-listen), or something in front of it answers; " +
				"Prometheus cannot scrape it either, so the dashboard and the alerts see nothing of this " + m.Component
			out = append(out, c)
			continue
		}
		required := slices.Clone(want[m.Component])
		if slices.ContainsFunc(m.Names, func(n string) bool { return strings.HasPrefix(n, "kvroute_"+ComponentGossip+"_") }) {
			required = append(required, want[ComponentGossip]...)
		}
		var missing []string
		for _, s := range required {
			if _, found := slices.BinarySearch(m.Names, s); !found {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 {
			c.OK = true
			c.Detail = fmt.Sprintf("the %s's /metrics has the %d series the dashboard reads", m.Component, len(required))
			out = append(out, c)
			continue
		}
		c.Detail = fmt.Sprintf("the %s's /metrics lacks %d of the %d series the dashboard reads: %s", m.Component, len(missing), len(required),
			strings.Join(missing, ", "))
		c.Cause = "a " + m.Component + " of another kvroute version than the dashboard (deploy both from one release), " +
			"or a series that appears only once something happens: the dashboard's panels reading it stay empty"
		out = append(out, c)
	}
	return out
}
