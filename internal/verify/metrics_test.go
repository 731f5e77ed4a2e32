package verify

import (
	"strings"
	"testing"
)

// TestJudgeMetrics: a port passes with every series of its component (and
// gossip's, when it gossips), and fails naming what it lacks, or saying
// /metrics is not served.
func TestJudgeMetrics(t *testing.T) {
	want := map[string][]string{
		ComponentPicker:  {"kvroute_picker_a_total", "kvroute_picker_b_bucket"},
		ComponentSidecar: {"kvroute_sidecar_c"},
		ComponentGossip:  {"kvroute_gossip_members"},
	}
	for _, tc := range []struct {
		name   string
		facts  MetricsFacts
		ok     bool
		detail []string
	}{
		{"every series", MetricsFacts{Component: ComponentPicker, URL: "http://p", Names: []string{"go_goroutines", "kvroute_picker_a_total", "kvroute_picker_b_bucket"}},
			true, []string{"the 2 series"}},
		{"one missing", MetricsFacts{Component: ComponentPicker, URL: "http://p", Names: []string{"kvroute_picker_a_total"}},
			false, []string{"lacks 1 of the 2", "kvroute_picker_b_bucket"}},
		{"another component's", MetricsFacts{Component: ComponentSidecar, URL: "http://s", Names: []string{"kvroute_picker_a_total", "kvroute_picker_b_bucket"}},
			false, []string{"sidecar's /metrics lacks 1 of the 1", "kvroute_sidecar_c"}},
		{"no gossip: gossip's not required", MetricsFacts{Component: ComponentSidecar, URL: "http://s", Names: []string{"kvroute_sidecar_c"}},
			true, nil},
		{"gossiping: gossip's required", MetricsFacts{Component: ComponentSidecar, URL: "http://s", Names: []string{"kvroute_gossip_insecure", "kvroute_sidecar_c"}},
			false, []string{"kvroute_gossip_members"}},
		{"not served", MetricsFacts{Component: ComponentSidecar, URL: "http://s", Err: "http://s/metrics: status 404"},
			false, []string{"does not serve /metrics", "status 404"}},
	} {
		cs := JudgeMetrics([]MetricsFacts{tc.facts}, want)
		if len(cs) != 1 {
			t.Fatalf("%s: %d checks", tc.name, len(cs))
		}
		c := cs[0]
		if c.Name != "metrics served" || c.Endpoint != tc.facts.URL || c.OK != tc.ok || (!c.OK && c.Cause == "") {
			t.Errorf("%s: %+v", tc.name, c)
		}
		for _, d := range tc.detail {
			if !strings.Contains(c.Detail, d) {
				t.Errorf("%s: detail %q lacks %q", tc.name, c.Detail, d)
			}
		}
	}
	// Judge appends them last.
	r := Judge(Facts{Metrics: []MetricsFacts{{Component: ComponentPicker, URL: "http://p", Err: "refused"}}}, Limits{Series: want})
	if r.OK || len(r.Checks) == 0 || r.Checks[len(r.Checks)-1].Name != "metrics served" {
		t.Errorf("Judge: %+v", r.Checks)
	}
}
