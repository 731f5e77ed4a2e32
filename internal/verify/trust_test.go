package verify

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/debugapi"
)

// TestTrustRefusals: an endpoint the picker's trust check refused fails
// as not routable, with the picker's sentence, since when, and the remedy.
func TestTrustRefusals(t *testing.T) {
	for reason, remedy := range map[string]string{
		"remote_endpoint":     "--allow-remote-endpoints",
		"malformed_endpoint":  "--engine-url",
		"unresolved_endpoint": "resolve",
	} {
		rf := debugapi.Refusal{Endpoint: "http://203.0.113.7:8000", Sidecar: "127.0.0.1:9090", Reason: reason, Model: "m",
			Detail: "the endpoint's host 203.0.113.7 is not its sidecar's host 127.0.0.1", Since: "2025-01-02T03:04:05Z"}
		r := Judge(Facts{Refused: []debugapi.Refusal{rf}}, DefaultLimits())
		i := slices.IndexFunc(r.Checks, func(c Check) bool { return c.Endpoint == rf.Endpoint })
		if r.OK || i < 0 {
			t.Fatalf("%s: %+v", reason, r)
		}
		c := r.Checks[i]
		if c.OK || c.Name != "routable" || c.Endpoint != rf.Endpoint || !strings.Contains(c.Detail, reason) ||
			!strings.Contains(c.Detail, rf.Detail) || !strings.Contains(c.Detail, rf.Since) || !strings.Contains(c.Cause, remedy) {
			t.Errorf("%s: %+v", reason, c)
		}
	}
	// Another refusal reads as before: no sentence, no since.
	c := refusedCheck(debugapi.Refusal{Endpoint: "http://e", Reason: "group_full"})
	if c.Detail != "the picker refused the endpoint: group_full" {
		t.Fatalf("%q", c.Detail)
	}
}
