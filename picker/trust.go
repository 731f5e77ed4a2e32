package picker

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
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

// refusal is rf on /debug/endpoints: the endpoint offered, its sidecar,
// why it was refused (summary_params, group_full, other_owner,
// model_not_followed: another picker shard's, or the trust check's
// remote_endpoint, malformed_endpoint and unresolved_endpoint) and, for
// the trust check's, since when (RFC 3339, UTC) and why.
func refusal(v fleetDiagnostics, rf fleetview.Refused) debugapi.Refusal {
	d := debugapi.Refusal{Endpoint: rf.Info.Endpoint, Sidecar: rf.Sidecar, Reason: rf.Reason, Model: rf.Info.Model,
		BlockSize: rf.Info.BlockSize, SummaryParams: rf.Info.SummaryParams, TokenizerFingerprint: rf.Info.TokenizerFingerprint}
	if since, detail, ok := v.Untrusted(rf); ok {
		d.Since, d.Detail = since.UTC().Format(time.RFC3339Nano), detail
	}
	return d
}
