package picker

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/picker/trust"
)

// Trusted endpoints only (package picker/trust): the picker's settings
// for it and what /debug/endpoints shows of its refusals.

// allowRemote parses ServerConfig.AllowRemoteEndpoints, its error naming
// the flag and every bad entry.
func (c *ServerConfig) allowRemote() ([]netip.Prefix, error) {
	p, err := trust.ParseAllow(c.AllowRemoteEndpoints)
	if err != nil {
		return nil, fmt.Errorf("--allow-remote-endpoints: %w", err)
	}
	return p, nil
}

// trustNote is what /debug/endpoints adds to an endpoint the trust check
// refused: since when (RFC 3339, UTC) and why.
type trustNote struct {
	Since  string `json:"since,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// trustNoteOf is rf's note; empty for another refusal.
func trustNoteOf(v fleetDiagnostics, rf fleetview.Refused) trustNote {
	since, detail, ok := v.Untrusted(rf)
	if !ok {
		return trustNote{}
	}
	return trustNote{Since: since.UTC().Format(time.RFC3339Nano), Detail: detail}
}
