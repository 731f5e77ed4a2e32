package monitoring

import (
	"reflect"
	"testing"
)

// TestDashboardSeries: every expr anywhere in the document (a row's nested
// panels too) gives its kvroute series by component, sorted, each once;
// label values and other metrics are not series of kvroute's.
func TestDashboardSeries(t *testing.T) {
	doc := `{"panels":[
	  {"targets":[{"expr":"sum by (pod) (rate(kvroute_picker_requests_total{job=\"kvroute-picker-admin\"}[5m]))"}]},
	  {"type":"row","panels":[{"targets":[
	    {"expr":"histogram_quantile(0.9, sum by (le) (rate(kvroute_sidecar_lag_seconds_bucket[5m]))) or up"},
	    {"expr":"kvroute_picker_requests_total + kvroute_gossip_members + kvroute_picker_a"}]}]}]}`
	got, err := DashboardSeries([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		Picker:  {"kvroute_picker_a", "kvroute_picker_requests_total"},
		Sidecar: {"kvroute_sidecar_lag_seconds_bucket"},
		Gossip:  {"kvroute_gossip_members"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for _, bad := range []string{`not json`, `{"panels":[{"targets":[{"expr":"up"}]}]}`} {
		if _, err := DashboardSeries([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	if s, err := Series(); err != nil || len(s[Picker]) == 0 || len(s[Sidecar]) == 0 {
		t.Fatalf("the dashboard built in: %v %v", s, err)
	}
}
