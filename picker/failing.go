package picker

import (
	"time"
)

// debugFailing is a sidecar on /debug/endpoints whose summary stream is
// failing: a TLS handshake (reason tls), not reached (unavailable), or
// ended otherwise (stream); error is the last one, since when it began.
type debugFailing struct {
	Sidecar      string  `json:"sidecar"`
	Reason       string  `json:"reason"`
	Error        string  `json:"error"`
	SinceSeconds float64 `json:"seconds_failing"`
}

// sidecarsFailing lists the sidecars followed whose stream is failing:
// one that never streamed has no endpoint to show it by.
func sidecarsFailing(v fleetDiagnostics) []debugFailing {
	out := []debugFailing{}
	for _, f := range v.Failing() {
		out = append(out, debugFailing{Sidecar: f.Sidecar, Reason: f.Reason, Error: f.Error, SinceSeconds: time.Since(f.Since).Seconds()})
	}
	return out
}
