package picker

import (
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
)

// sidecarsFailing lists, for /debug/endpoints, the sidecars followed
// whose stream is failing (one that never streamed has no endpoint to
// show it by): a TLS handshake (reason tls), not reached (unavailable), or
// ended otherwise (stream); the last error, and for how long.
func sidecarsFailing(v fleetDiagnostics) []debugapi.SidecarFailing {
	out := []debugapi.SidecarFailing{}
	for _, f := range v.Failing() {
		out = append(out, debugapi.SidecarFailing{Sidecar: f.Sidecar, Reason: f.Reason, Error: f.Error, SecondsFailing: time.Since(f.Since).Seconds()})
	}
	return out
}
