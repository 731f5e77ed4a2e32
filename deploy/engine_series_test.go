package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// engineTable is the metrics deploy/monitoring/README.md's Labels table
// lists with the engine label: the per-engine series kvroute exports by
// default (the picker's three, without --per-endpoint-metrics, and the
// sidecars'). test/e2e checks the table against a live picker and
// sidecars.
func engineTable(t *testing.T) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile("monitoring/README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Labels\n")
	if !ok {
		t.Fatal("monitoring/README.md has no Labels section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.Contains(cells[2], "`engine`") {
			for _, m := range regexp.MustCompile("`(kvroute_[a-z_]+)`").FindAllStringSubmatch(cells[1], -1) {
				out[m[1]] = true
			}
		}
	}
	return out
}

// engineReads returns the metrics expr reads by engine that perEngine
// does not list: those under an aggregation by engine or a match on
// engine, or selected with an engine matcher; all of expr's when byLabel
// (a legend or annotation names the engine). A histogram's _bucket, _sum
// and _count are its name's.
func engineReads(expr parser.Expr, byLabel bool, perEngine map[string]bool) []string {
	var out []string
	parser.Inspect(expr, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		reads := byLabel || slices.ContainsFunc(vs.LabelMatchers, func(m *labels.Matcher) bool { return m.Name == "engine" })
		for _, a := range path {
			switch a := a.(type) {
			case *parser.AggregateExpr:
				reads = reads || !a.Without && slices.Contains(a.Grouping, "engine")
			case *parser.BinaryExpr:
				if vm := a.VectorMatching; vm != nil {
					reads = reads || vm.On && slices.Contains(vm.MatchingLabels, "engine") || slices.Contains(vm.Include, "engine")
				}
			}
		}
		name := vs.Name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && perEngine[base] {
				name = base
			}
		}
		if reads && !perEngine[name] && !slices.Contains(out, name) {
			out = append(out, name)
		}
		return nil
	})
	return out
}

// TestPerEngineQueriesReadDefaultSeries: every alert and dashboard query
// that reads a metric by engine (grouped or matched by it, or naming it in
// a legend or annotation) reads one the Labels table lists as per-engine,
// so none goes empty on a picker run without --per-endpoint-metrics
// (issue 37: three series an endpoint; the others are summed over the
// engines unless the flag is given).
func TestPerEngineQueriesReadDefaultSeries(t *testing.T) {
	perEngine := engineTable(t)
	for _, m := range []string{"kvroute_picker_endpoint_requests_in_flight", "kvroute_picker_stream_aborts_total",
		"kvroute_picker_kv_sources_total", "kvroute_picker_ttft_speed_factor"} {
		if perEngine[m] {
			t.Errorf("the Labels table lists %s as per-engine: it has the engine label only with --per-endpoint-metrics", m)
		}
	}
	for _, m := range []string{"kvroute_picker_selected_total", "kvroute_picker_endpoint_state", "kvroute_picker_endpoint_staleness_seconds"} {
		if !perEngine[m] {
			t.Errorf("the Labels table does not list %s as per-engine", m)
		}
	}
	alerts, err := Alerts(rulePath)
	if err != nil {
		t.Fatal(err)
	}
	type use struct {
		expr    string
		byLabel bool
	}
	uses := map[string]use{}
	for _, a := range alerts {
		named := false
		for _, v := range a.Annotations {
			named = named || strings.Contains(v, "$labels.engine")
		}
		uses["alert "+a.Name] = use{a.Expr, named}
	}
	for i, q := range dashTargets(t) {
		uses[fmt.Sprintf("panel %q (query %d)", q.panel, i)] = use{substituteGrafanaVariables(q.expr), strings.Contains(q.legend, "{{engine}}")}
	}
	p := parser.NewParser(parser.Options{})
	reading := 0
	for where, u := range uses {
		expr, err := p.ParseExpr(u.expr)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if bad := engineReads(expr, u.byLabel, perEngine); len(bad) > 0 {
			t.Errorf("%s reads %v by engine: not per-engine by default (deploy/monitoring/README.md, Labels)", where, bad)
		}
		if len(engineReads(expr, u.byLabel, map[string]bool{})) > 0 {
			reading++
		}
	}
	if reading < 5 {
		t.Errorf("%d alerts and queries read by engine: the check found too few to be looking", reading)
	}
	// The rule bites: a sum by engine of a series summed by default is
	// caught, the load-only alert's grouping is not.
	for expr, want := range map[string]int{
		`sum by (engine) (kvroute_picker_endpoint_requests_in_flight)`:                                       1,
		`sum by (cause) (rate(kvroute_picker_stream_aborts_total{engine="x"}[5m]))`:                          1,
		`sum(kvroute_picker_kv_sources_total) / on (engine) sum by (engine) (kvroute_picker_selected_total)`: 1,
		`max by (namespace, engine) (kvroute_picker_endpoint_state{state="load_only"}) == 1`:                 0,
		`sum by (cause) (rate(kvroute_picker_stream_aborts_total[5m]))`:                                      0,
	} {
		e, err := p.ParseExpr(expr)
		if err != nil {
			t.Fatal(err)
		}
		if got := engineReads(e, false, perEngine); len(got) != want {
			t.Errorf("%s: caught %v, want %d", expr, got, want)
		}
	}
}

// dashLegendTarget is one query of the dashboard with its legend.
type dashLegendTarget struct{ panel, expr, legend string }

// dashTargets reads the committed dashboard's queries with their legends
// (rows' panels too).
func dashTargets(t *testing.T) []dashLegendTarget {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr   string `json:"expr"`
			Legend string `json:"legendFormat"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var out []dashLegendTarget
	var walk func(ps []json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, r := range ps {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatal(err)
			}
			for _, q := range p.Targets {
				if q.Expr != "" {
					out = append(out, dashLegendTarget{p.Title, q.Expr, q.Legend})
				}
			}
			walk(p.Panels)
		}
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	walk(d.Panels)
	if len(out) < 20 {
		t.Fatalf("%d queries in %s", len(out), dashboardFile)
	}
	return out
}
