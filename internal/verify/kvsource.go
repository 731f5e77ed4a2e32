package verify

import (
	"fmt"
	"maps"
	"slices"

	"github.com/kvroute/kvroute/internal/debugapi"
)

// JudgeKVSources reports, per model (sorted), how many of its endpoints
// advertise a KV source: the P2P side channel peers pull their CPU-tier
// KV from (the sidecar's --p2p-port). It is informational and always
// passes: a fleet without vLLM's P2P tier is a valid fleet, it just never
// pulls a prefix from a peer. The check's Figure is "n/m".
func JudgeKVSources(eps []debugapi.Endpoint) []Check {
	total, with := map[string]int{}, map[string]int{}
	for _, e := range eps {
		total[e.Model]++
		if e.KVSource != "" {
			with[e.Model]++
		}
	}
	var out []Check
	for _, model := range slices.Sorted(maps.Keys(total)) {
		n, m := with[model], total[model]
		c := Check{Name: "kv sources", Endpoint: model, OK: true, Figure: fmt.Sprintf("%d/%d", n, m)}
		switch {
		case n == 0:
			c.Detail = fmt.Sprintf("none of the %d endpoints advertises a KV source: no prefix is pulled between engines "+
				"(engines running vLLM's P2P tier need --p2p-port on their sidecars)", m)
		case n == m:
			c.Detail = fmt.Sprintf("all %d endpoints advertise a KV source: any of them can serve a prefix out of its CPU tier", m)
		default:
			c.Detail = fmt.Sprintf("%d of the %d endpoints advertise a KV source; the others are never named as one", n, m)
		}
		out = append(out, c)
	}
	return out
}
