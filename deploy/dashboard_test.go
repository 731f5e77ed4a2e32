package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
	"github.com/grafana/grafana-foundation-sdk/go/units"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"

	"github.com/kvroute/kvroute/deploy/monitoring"
)

// The Grafana dashboard's generator and its tests. The generator builds the
// dashboard with the Grafana Foundation SDK's builders;
// deploy/monitoring/grafana-dashboard.json is its output (TestDashboardGolden;
// go test ./deploy -run TestDashboardGolden -update rewrites the file). Every
// selector has namespace=~"$namespace", and every panel and query uses the
// $datasource variable (TestDashboardStructure checks both). The helpers'
// names start with dash, to stay clear of the package's other tests.

const (
	dashboardUID     = "kvroute"
	dashboardFile    = "monitoring/grafana-dashboard.json"
	dashNSMatcher    = `namespace=~"$namespace"`
	dashTokensPerSec = "tokens/s"
)

// dashDatasource is every panel's and target's datasource: the dashboard's
// datasource variable.
func dashDatasource() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
}

// dashSel selects metric in the chosen namespaces, with more matchers.
func dashSel(metric string, matchers ...string) string {
	return metric + "{" + strings.Join(append([]string{dashNSMatcher}, matchers...), ", ") + "}"
}

// dashRate is the per-second rate of a counter over Grafana's rate interval.
func dashRate(metric string, matchers ...string) string {
	return "rate(" + dashSel(metric, matchers...) + "[$__rate_interval])"
}

// dashIncrease is a counter's increase over Grafana's rate interval.
func dashIncrease(metric string, matchers ...string) string {
	return "increase(" + dashSel(metric, matchers...) + "[$__rate_interval])"
}

// dashSum sums expr by labels ("" for no labels).
func dashSum(labels, expr string) string {
	if labels == "" {
		return "sum(" + expr + ")"
	}
	return "sum by (" + labels + ") (" + expr + ")"
}

// dashQuantile is a histogram's q-quantile over the rate interval, by labels
// beside le.
func dashQuantile(q float64, histogram, labels string) string {
	by := "le"
	if labels != "" {
		by += ", " + labels
	}
	return fmt.Sprintf("histogram_quantile(%g, %s)", q, dashSum(by, dashRate(histogram+"_bucket")))
}

// dashTarget is one query of a panel.
type dashTarget struct{ expr, legend string }

func dq(expr, legend string) dashTarget { return dashTarget{expr, legend} }

// dashQuantiles are quantiles of a histogram by labels (p50 and p99 unless
// qs says which), legends prefixed with the percentile.
func dashQuantiles(histogram, labels, legend string, qs ...float64) []dashTarget {
	if len(qs) == 0 {
		qs = []float64{0.5, 0.99}
	}
	sp := ""
	if legend != "" {
		sp = " " + legend
	}
	var out []dashTarget
	for _, q := range qs {
		out = append(out, dq(dashQuantile(q, histogram, labels), fmt.Sprintf("p%g%s", q*100, sp)))
	}
	return out
}

func dashQueries(ts []dashTarget) []cog.Builder[variants.Dataquery] {
	var out []cog.Builder[variants.Dataquery]
	for i, q := range ts {
		out = append(out, prometheus.NewDataqueryBuilder().
			Datasource(dashDatasource()).
			RefId(string(rune('A'+i))).
			Expr(q.expr).
			LegendFormat(q.legend).
			Range())
	}
	return out
}

// dashboardGen builds the dashboard: rows of panels laid out by the SDK
// (each line of a row fills 24 columns), ids in order.
type dashboardGen struct {
	b  *dashboard.DashboardBuilder
	id uint32
}

func (g *dashboardGen) next() uint32 { g.id++; return g.id }

func (g *dashboardGen) row(title string) {
	g.b.WithRow(dashboard.NewRowBuilder(title).Id(g.next()))
}

// dashPanel is what every panel kind takes.
type dashPanel struct {
	title, desc, unit string
	w, h              uint32
	min, max          *float64
	stack             bool
	decimals          *float64
}

func dashLegend() *common.VizLegendOptionsBuilder {
	return common.NewVizLegendOptionsBuilder().
		ShowLegend(true).
		DisplayMode(common.LegendDisplayModeTable).
		Placement(common.LegendPlacementBottom).
		Calcs([]string{"mean", "max", "lastNotNull"})
}

func dashTooltip() *common.VizTooltipOptionsBuilder {
	return common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)
}

// timeseries adds a time series panel.
func (g *dashboardGen) timeseries(o dashPanel, ts ...dashTarget) {
	if o.h == 0 {
		o.h = 8
	}
	p := timeseries.NewPanelBuilder().
		Id(g.next()).
		Title(o.title).
		Description(o.desc).
		Datasource(dashDatasource()).
		Span(o.w).Height(o.h).
		Unit(o.unit).
		Targets(dashQueries(ts)).
		Legend(dashLegend()).
		Tooltip(dashTooltip()).
		LineWidth(1).
		FillOpacity(10).
		ShowPoints(common.VisibilityModeNever).
		SpanNulls(common.BoolOrFloat64{Bool: cog.ToPtr(false)})
	if o.min != nil {
		p.Min(*o.min)
	}
	if o.max != nil {
		p.Max(*o.max)
	}
	if o.decimals != nil {
		p.Decimals(*o.decimals)
	}
	if o.stack {
		p.Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal).Group("A")).FillOpacity(40)
	}
	g.b.WithPanel(p)
}

// dashState is one value of a state timeline: the number the query gives it,
// its name and colour.
type dashState struct {
	value       int
	name, color string
}

// stateTimeline adds a state timeline of one series per legend, each
// value mapped to a state.
func (g *dashboardGen) stateTimeline(o dashPanel, states []dashState, ts ...dashTarget) {
	if o.h == 0 {
		o.h = 8
	}
	opts := map[string]dashboard.ValueMappingResult{}
	for i, s := range states {
		opts[fmt.Sprint(s.value)] = dashboard.ValueMappingResult{Text: cog.ToPtr(s.name), Color: cog.ToPtr(s.color), Index: cog.ToPtr(int32(i))}
	}
	p := statetimeline.NewPanelBuilder().
		Id(g.next()).
		Title(o.title).
		Description(o.desc).
		Datasource(dashDatasource()).
		Span(o.w).Height(o.h).
		Targets(dashQueries(ts)).
		Mappings([]dashboard.ValueMapping{{ValueMap: &dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: opts}}}).
		ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdThresholds)).
		Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).
			Steps([]dashboard.Threshold{{Value: nil, Color: "text"}})).
		ShowValue(common.VisibilityModeNever).
		MergeValues(true).
		RowHeight(0.9).
		FillOpacity(80).
		LineWidth(0).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom)).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeSingle).Sort(common.SortOrderNone))
	g.b.WithPanel(p)
}

// stat adds a single-value panel of the last value, with thresholds.
func (g *dashboardGen) stat(o dashPanel, steps []dashboard.Threshold, ts ...dashTarget) {
	if o.h == 0 {
		o.h = 8
	}
	p := stat.NewPanelBuilder().
		Id(g.next()).
		Title(o.title).
		Description(o.desc).
		Datasource(dashDatasource()).
		Span(o.w).Height(o.h).
		Unit(o.unit).
		Targets(dashQueries(ts)).
		ColorScheme(dashboard.NewFieldColorBuilder().Mode(dashboard.FieldColorModeIdThresholds)).
		Thresholds(dashboard.NewThresholdsConfigBuilder().Mode(dashboard.ThresholdsModeAbsolute).Steps(steps)).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"}).Values(false)).
		GraphMode(common.BigValueGraphModeArea).
		ColorMode(common.BigValueColorModeValue).
		TextMode(common.BigValueTextModeAuto).
		JustifyMode(common.BigValueJustifyModeAuto).
		Orientation(common.VizOrientationAuto)
	if o.min != nil {
		p.Min(*o.min)
	}
	if o.max != nil {
		p.Max(*o.max)
	}
	if o.decimals != nil {
		p.Decimals(*o.decimals)
	}
	g.b.WithPanel(p)
}

func dashNum(v float64) *float64 { return &v }

// dashAgreement is the share of proxied requests with a prediction whose
// engine-reported cached tokens agreed with it at block granularity:
// as_predicted over every outcome that had a prediction to judge
// (load_only and no_usage had none).
func dashAgreement() string {
	judged := `outcome=~"as_predicted|fewer_cached_than_predicted|another_endpoint_held_more|more_cached_than_predicted|no_cached_details"`
	return dashSum("", dashRate("kvroute_picker_outcomes_total", `outcome="as_predicted"`)) +
		" / " + dashSum("", dashRate("kvroute_picker_outcomes_total", judged))
}

// dashStateValue is the number of the state an endpoint is in: gauge is 1 for
// the current state and 0 for the others, so the sum of gauge × number
// over the states is the current one's number; across pickers (or sidecar
// copies) the highest, the worst, wins.
func dashStateValue(gauge string, by string, states []dashState) string {
	var parts []string
	for _, s := range states {
		parts = append(parts, fmt.Sprintf("%s * %d", dashSel(gauge, `state="`+s.name+`"`), s.value))
	}
	return "max by (" + by + ") (" + strings.Join(parts, " or ") + ")"
}

// dashEndpointStates are kvroute_picker_endpoint_state's states, best first.
var dashEndpointStates = []dashState{
	{1, "cached", "green"},
	{2, "load_only", "yellow"},
	{3, "draining", "blue"},
	{4, "down", "red"},
}

// dashStreamStates are kvroute_sidecar_stream_state's states, best first.
var dashStreamStates = []dashState{
	{1, "live", "green"},
	{2, "unknown", "text"},
	{3, "replay_only", "yellow"},
	{4, "partial", "orange"},
	{5, "silent", "red"},
}

// buildDashboard builds the kvroute dashboard.
func buildDashboard() (dashboard.Dashboard, error) {
	g := &dashboardGen{b: dashboard.NewDashboardBuilder("kvroute").
		Uid(dashboardUID).
		Description("KV-cache-aware routing for vLLM fleets: the pickers' decisions and predictions, endpoint health, the sidecars' KV event streams, requests and admission. Generated by deploy/dashboard_test.go (go test ./deploy -run TestDashboardGolden -update); edit the generator, not the JSON.").
		Tags([]string{"kvroute", "vllm"}).
		Editable().
		Refresh("30s").
		Time("now-3h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").
			Label("Data source").
			Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("namespace").
			Label("Namespace").
			Description("The namespaces of the kvroute pickers and sidecars (the namespace label Kubernetes scraping adds).").
			Datasource(dashDatasource()).
			Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(kvroute_picker_outcomes_total, namespace)")}).
			Definition("label_values(kvroute_picker_outcomes_total, namespace)").
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).
			IncludeAll(true).
			AllValue(".*").
			Current(dashboard.VariableOption{Selected: cog.ToPtr(true), Text: dashboard.StringOrArrayOfString{String: cog.ToPtr("All")}, Value: dashboard.StringOrArrayOfString{String: cog.ToPtr("$__all")}}))}

	g.row("Overview")
	// The non-2xx series exist only after the first error: each error
	// query falls back to 0 (the request rate times 0) so a healthy fleet
	// reads 0, not "No data".
	allRequests := func(by string) string { return dashSum(by, dashRate("kvroute_picker_requests_total")) }
	errorRequests := func(by string) string {
		return dashSum(by, dashRate("kvroute_picker_requests_total", `code!~"2.."`))
	}
	errorRatio := errorRequests("") + " / " + allRequests("") + " or " + allRequests("") + " * 0"
	cachedShare := dashSum("", dashRate("kvroute_picker_reported_cached_tokens_total")) + " / " + dashSum("", dashRate("kvroute_picker_prompt_tokens_total"))
	g.stat(dashPanel{title: "Requests", unit: units.RequestsPerSecond, w: 4, h: 4,
		desc: "Requests answered per second, every route and picker."},
		[]dashboard.Threshold{{Color: "text"}},
		dq(dashSum("", dashRate("kvroute_picker_requests_total")), "requests"))
	g.stat(dashPanel{title: "Non-2xx share", unit: units.PercentUnit, w: 4, h: 4, min: dashNum(0), max: dashNum(1),
		desc: "Share of requests answered with a status other than 2xx."},
		[]dashboard.Threshold{{Color: "green"}, {Value: dashNum(0.01), Color: "yellow"}, {Value: dashNum(0.05), Color: "red"}},
		dq(errorRatio, "non-2xx"))
	g.stat(dashPanel{title: "Agreement", unit: units.PercentUnit, w: 4, h: 4, min: dashNum(0), max: dashNum(1),
		desc: "Share of judged requests whose engine-reported cached tokens were as predicted (see Prediction agreement)."},
		[]dashboard.Threshold{{Color: "red"}, {Value: dashNum(0.8), Color: "yellow"}, {Value: dashNum(0.95), Color: "green"}},
		dq(dashAgreement(), "agreement"))
	g.stat(dashPanel{title: "Cached share of prompt tokens", unit: units.PercentUnit, w: 4, h: 4, min: dashNum(0), max: dashNum(1),
		desc: "Share of prompt tokens the engines reported served from their KV cache."},
		[]dashboard.Threshold{{Color: "text"}},
		dq(cachedShare, "cached"))
	g.stat(dashPanel{title: "Endpoints down", unit: units.Short, w: 4, h: 4, min: dashNum(0), decimals: dashNum(0),
		desc: "Endpoints in health state down, the most any picker reports."},
		[]dashboard.Threshold{{Color: "green"}, {Value: dashNum(1), Color: "red"}},
		dq("max("+dashSel("kvroute_picker_endpoint_states", `state="down"`)+")", "down"))
	g.stat(dashPanel{title: "KV event streams not live", unit: units.Short, w: 4, h: 4, min: dashNum(0), decimals: dashNum(0),
		desc: "Endpoints whose KV event stream is silent, replay_only or partial: routed by load only until it is live again."},
		[]dashboard.Threshold{{Color: "green"}, {Value: dashNum(1), Color: "orange"}},
		dq(dashSum("", dashSel("kvroute_sidecar_stream_state", `state=~"silent|replay_only|partial"`)), "not live"))

	g.row("Routing decisions")
	g.timeseries(dashPanel{title: "Decisions by policy and reason", unit: units.OpsPerSecond, w: 8, stack: true,
		desc: "Routing decisions per second, by policy and reason: cache_hit (a candidate holds a useful prefix), cold_anchor and cold_no_anchor (nobody does), load_only (the request's identity is unresolved), none_healthy, and the baselines' own."},
		dq(dashSum("policy, reason", dashRate("kvroute_picker_decisions_total")), "{{policy}} / {{reason}}"))
	g.timeseries(dashPanel{title: "Fallbacks, refusals and unresolved identities", unit: units.OpsPerSecond, w: 8,
		desc: "Decisions that fell back from precise routing, requests refused before a decision, and requests whose cache identity could not be resolved exactly, by reason."},
		dq(dashSum("reason", dashRate("kvroute_picker_fallbacks_total")), "fallback: {{reason}}"),
		dq(dashSum("reason", dashRate("kvroute_picker_refused_total")), "refused: {{reason}}"),
		dq(dashSum("reason", dashRate("kvroute_picker_unresolved_total")), "unresolved: {{reason}}"))
	g.timeseries(dashPanel{title: "Decisions by chosen endpoint", unit: units.OpsPerSecond, w: 8, stack: true,
		desc: "Decisions per second by the endpoint chosen, all pickers together."},
		dq(dashSum("engine", dashRate("kvroute_picker_selected_total")), "{{engine}}"))

	g.row("Cache prediction")
	g.timeseries(dashPanel{title: "Cached tokens: matched vs engine-reported", unit: units.Short, w: 8, min: dashNum(0),
		desc: "Prompt tokens per second of proxied requests, the cached ones the picker predicted (its prefix match on the chosen endpoint) and the cached ones the engines reported (usage.prompt_tokens_details.cached_tokens). Reported well below predicted: summaries are stale or wrong; above: routing misses cache it could use."},
		dq(dashSum("", dashRate("kvroute_picker_prompt_tokens_total")), "prompt "+dashTokensPerSec),
		dq(dashSum("", dashRate("kvroute_picker_predicted_cached_tokens_total")), "predicted cached "+dashTokensPerSec),
		dq(dashSum("", dashRate("kvroute_picker_reported_cached_tokens_total")), "engine-reported cached "+dashTokensPerSec))
	g.timeseries(dashPanel{title: "Prediction outcomes", unit: units.OpsPerSecond, w: 8, stack: true,
		desc: "Proxied requests by outcome, engine-reported cached tokens against the prediction at block granularity: as_predicted; fewer_cached_than_predicted and another_endpoint_held_more (wrong-pod outcomes); more_cached_than_predicted (a stale summary); load_only (nothing predicted); no_usage (the engine reported none); no_cached_details (a hit predicted, no details)."},
		dq(dashSum("outcome", dashRate("kvroute_picker_outcomes_total")), "{{outcome}}"))
	g.timeseries(dashPanel{title: "Prediction agreement", unit: units.PercentUnit, w: 8, min: dashNum(0), max: dashNum(1),
		desc: "Share of judged requests as_predicted: as_predicted / (as_predicted + fewer_cached_than_predicted + another_endpoint_held_more + more_cached_than_predicted + no_cached_details). Beside it, the share of prompt tokens the engines reported cached and the share the picker predicted."},
		dq(dashAgreement(), "agreement"),
		dq(cachedShare, "engine-reported cached share of prompt tokens"),
		dq(dashSum("", dashRate("kvroute_picker_predicted_cached_tokens_total"))+" / "+dashSum("", dashRate("kvroute_picker_prompt_tokens_total")), "predicted cached share of prompt tokens"))

	g.timeseries(dashPanel{title: "Outcome shares", unit: units.PercentUnit, w: 12, min: dashNum(0), max: dashNum(1), stack: true,
		desc: "Each outcome's share of proxied requests."},
		dq(dashSum("outcome", dashRate("kvroute_picker_outcomes_total"))+" / ignoring (outcome) group_left () "+dashSum("", dashRate("kvroute_picker_outcomes_total")), "{{outcome}}"))
	g.timeseries(dashPanel{title: "Matched blocks", unit: units.Short, w: 12, min: dashNum(0),
		desc: "GPU blocks of the request's prefix the chosen endpoint held, per decision."},
		dashQuantiles("kvroute_picker_matched_blocks", "", "", 0.5, 0.9, 0.99)...)

	g.row("Load overrides")
	g.timeseries(dashPanel{title: "Load overrides", unit: units.OpsPerSecond, w: 6, min: dashNum(0),
		desc: "Decisions that skipped the best-cached endpoint because it was at the load cap."},
		dq(dashSum("", dashRate("kvroute_picker_load_overrides_total")), "overrides"))
	g.timeseries(dashPanel{title: "Cached tokens lost to load overrides", unit: units.Short, w: 6, min: dashNum(0),
		desc: "Cached prompt tokens per second given up by load overrides: what the best-cached endpoint held beyond the one chosen."},
		dq(dashSum("", dashRate("kvroute_picker_load_override_tokens_total")), "lost "+dashTokensPerSec))
	g.timeseries(dashPanel{title: "Overridden share of decisions", unit: units.PercentUnit, w: 6, min: dashNum(0),
		desc: "Load overrides over all decisions: high means the fleet is too small for where its cache is."},
		dq(dashSum("", dashRate("kvroute_picker_load_overrides_total"))+" / "+dashSum("", dashRate("kvroute_picker_decisions_total")), "overridden"))
	g.timeseries(dashPanel{title: "Requests in flight by picker", unit: units.Short, w: 6, min: dashNum(0), stack: true,
		desc: "Proxied requests sent to engines and not yet answered in full, by picker (stacked: all of them). Per engine, run the pickers with --per-endpoint-metrics and group kvroute_picker_endpoint_requests_in_flight by engine."},
		dq(dashSum("pod", dashSel("kvroute_picker_endpoint_requests_in_flight")), "{{pod}}"))

	g.row("Endpoint health")
	g.stateTimeline(dashPanel{title: "Endpoint health state", w: 24, h: 9,
		desc: "Each endpoint's health state as the pickers see it (the worst any picker reports): cached (routable, its cache known); load_only (routable by load only: its cache is unknown, as when the event stream is silent, one-sided or lost events, the summary is stale or the sidecar is lost); draining (the engine is going away: no new requests); down (nothing is sent to it)."},
		dashEndpointStates,
		dq(dashStateValue("kvroute_picker_endpoint_state", "engine", dashEndpointStates), "{{engine}}"))
	g.timeseries(dashPanel{title: "Endpoints by state", unit: units.Short, w: 8, min: dashNum(0),
		desc: "Endpoints in each health state (the most any picker reports) and endpoints known by identity group."},
		dq("max by (state) ("+dashSel("kvroute_picker_endpoint_states")+")", "{{state}}"),
		dq("max by (group) ("+dashSel("kvroute_picker_endpoints")+")", "known: group {{group}}"))
	g.timeseries(dashPanel{title: "Summary staleness by endpoint", unit: units.Seconds, w: 8, min: dashNum(0),
		desc: "Time since the last update (delta, snapshot or load report) from each endpoint's sidecar, the most any picker reports."},
		dq("max by (engine) ("+dashSel("kvroute_picker_endpoint_staleness_seconds")+")", "{{engine}}"))
	g.timeseries(dashPanel{title: "Event to routable lag", unit: units.Seconds, w: 8, min: dashNum(0),
		desc: "From the engine stamping a KV event batch to its blocks being routable in a picker (engine and picker clocks), all pickers."},
		dashQuantiles("kvroute_picker_event_to_routable_seconds", "", "", 0.5, 0.9, 0.99)...)
	g.timeseries(dashPanel{title: "Health transitions, ejections and probes", unit: units.OpsPerSecond, w: 12,
		desc: "Endpoint health transitions by the state entered, passive outlier ejections (a failure reaching the engine) and the pickers' own engine probes by result."},
		dq(dashSum("state", dashRate("kvroute_picker_endpoint_transitions_total")), "into {{state}}"),
		dq(dashSum("", dashRate("kvroute_picker_ejections_total")), "ejections"),
		dq(dashSum("result", dashRate("kvroute_picker_engine_probes_total")), "probe: {{result}}"))
	g.timeseries(dashPanel{title: "Summary stream at the pickers", unit: units.OpsPerSecond, w: 12,
		desc: "Summary updates applied by kind, resyncs (a delta that did not follow), malformed updates, endpoints refused (other summary parameters, no free slot) and endpoint conflicts (a second sidecar claiming one)."},
		dq(dashSum("kind", dashRate("kvroute_picker_summary_updates_total")), "applied: {{kind}}"),
		dq(dashSum("", dashRate("kvroute_picker_summary_resyncs_total")), "resyncs"),
		dq(dashSum("", dashRate("kvroute_picker_summary_malformed_total")), "malformed"),
		dq(dashSum("", dashRate("kvroute_picker_endpoints_refused_total")), "endpoints refused"),
		dq(dashSum("", dashRate("kvroute_picker_endpoint_conflicts_total")), "endpoint conflicts"))

	g.row("Sidecars and KV event streams")
	g.stateTimeline(dashPanel{title: "KV event stream state", w: 24, h: 9,
		desc: "Each endpoint's live KV event stream as its sidecar judges it: live; unknown (not judged yet); replay_only (its batches come only through replay: check --kv-events-mode); partial (lost events that replay could not recover); silent (the engine's counters show new blocks and no live batch arrives). The pickers route an endpoint whose stream is not live by load only."},
		dashStreamStates,
		dq(dashStateValue("kvroute_sidecar_stream_state", "engine", dashStreamStates), "{{engine}}"))
	g.timeseries(dashPanel{title: "KV events by type", unit: units.OpsPerSecond, w: 8, stack: true,
		desc: "KV events applied by the sidecars, by type."},
		dq(dashSum("type", dashRate("kvroute_sidecar_events_total")), "{{type}}"))
	g.timeseries(dashPanel{title: "Sequence gaps and engine restarts", unit: units.Short, w: 8, min: dashNum(0),
		desc: "Gaps in the event sequence numbers and engine restarts detected, per engine, over the rate interval."},
		dq(dashSum("engine", dashIncrease("kvroute_sidecar_seq_gaps_total")), "gaps: {{engine}}"),
		dq(dashSum("engine", dashIncrease("kvroute_sidecar_engine_restarts_total")), "restarts: {{engine}}"))
	g.timeseries(dashPanel{title: "Replays by outcome", unit: units.Short, w: 8, min: dashNum(0),
		desc: "Replay exchanges over the rate interval, by outcome: ok, incomplete, failed."},
		dq(dashSum("outcome", dashIncrease("kvroute_sidecar_replays_total")), "{{outcome}}"))
	g.timeseries(dashPanel{title: "Event errors and engine scrapes", unit: units.Short, w: 8, min: dashNum(0),
		desc: "Over the rate interval: malformed payloads (skipped), BlockStored runs dropped for an unknown parent or that could not be keyed, failed reads of the engine's /metrics; and engines whose last scrape failed."},
		dq(dashSum("", dashIncrease("kvroute_sidecar_malformed_payloads_total")), "malformed payloads"),
		dq(dashSum("", dashIncrease("kvroute_sidecar_unresolved_parents_total")), "unresolved parents"),
		dq(dashSum("", dashIncrease("kvroute_sidecar_invalid_runs_total")), "invalid runs"),
		dq(dashSum("", dashIncrease("kvroute_sidecar_scrape_errors_total")), "scrape errors"),
		dq(dashSum("", dashSel("kvroute_sidecar_engine_down")), "engines down"))
	g.timeseries(dashPanel{title: "Event to summary lag", unit: units.Seconds, w: 8, min: dashNum(0),
		desc: "From the engine stamping a batch to its blocks being in the sidecar's summary."},
		dashQuantiles("kvroute_sidecar_event_to_summary_lag_seconds", "", "")...)
	g.timeseries(dashPanel{title: "Engine KV cache usage", unit: units.PercentUnit, w: 8, min: dashNum(0), max: dashNum(1),
		desc: "The share of each engine's KV cache its live requests hold, as its sidecar last scraped it."},
		dq("max by (engine) ("+dashSel("kvroute_sidecar_engine_kv_cache_usage_ratio")+")", "{{engine}}"))

	g.row("Render (tokenize)")
	g.timeseries(dashPanel{title: "Render latency", unit: units.Seconds, w: 8, min: dashNum(0),
		desc: "Render or tokenize call latency at the engines, by the endpoint used (chat_render, completions_render, responses_render, responses_as_chat, tokenize)."},
		dashQuantiles("kvroute_picker_tokenize_seconds", "via", "{{via}}")...)
	g.timeseries(dashPanel{title: "Render errors by kind", unit: units.OpsPerSecond, w: 8, min: dashNum(0),
		desc: "Failed render or tokenize calls: timeout, refused, error. The request is then routed by load only."},
		dq(dashSum("kind", dashRate("kvroute_picker_tokenize_errors_total")), "{{kind}}"))
	g.timeseries(dashPanel{title: "Proxy overhead", unit: units.Seconds, w: 8, min: dashNum(0),
		desc: "From a proxied request's arrival to its dispatch to the chosen engine (body read, tokens, decision), per attempt."},
		dashQuantiles("kvroute_picker_proxy_overhead_seconds", "", "")...)

	g.row("Requests")
	g.timeseries(dashPanel{title: "Request rate by route", unit: units.RequestsPerSecond, w: 8, stack: true,
		desc: "Requests answered per second by route (the API path)."},
		dq(dashSum("route", dashRate("kvroute_picker_requests_total")), "{{route}}"))
	g.timeseries(dashPanel{title: "Request latency by route", unit: units.Seconds, w: 8, min: dashNum(0),
		desc: "From a request's arrival to the end of its answer, by route."},
		dashQuantiles("kvroute_picker_request_duration_seconds", "route", "{{route}}")...)
	g.timeseries(dashPanel{title: "Time to first byte by route", unit: units.Seconds, w: 8, min: dashNum(0),
		desc: "From a request's arrival to the first byte of its answer's body (for a stream, the time to first token as the client sees it), by route."},
		dashQuantiles("kvroute_picker_time_to_first_byte_seconds", "route", "{{route}}")...)
	g.timeseries(dashPanel{title: "Errors by route and code", unit: units.RequestsPerSecond, w: 8, min: dashNum(0),
		desc: "Requests answered with a status other than 2xx, by route and code (0 for a route without any)."},
		dq(errorRequests("route, code")+" or on (route) "+allRequests("route")+" * 0", "{{route}} {{code}}"))
	g.timeseries(dashPanel{title: "Error ratio by route", unit: units.PercentUnit, w: 8, min: dashNum(0),
		desc: "Share of requests answered with a status other than 2xx, by route."},
		dq(errorRequests("route")+" / "+allRequests("route")+" or on (route) "+allRequests("route")+" * 0", "{{route}}"))
	g.timeseries(dashPanel{title: "Upstream retries and stream aborts", unit: units.OpsPerSecond, w: 8, min: dashNum(0),
		desc: "Requests offered to another engine (connect_error, bad_status) and answers aborted after their first byte, by cause (upstream_error, upstream_truncated, client_gone)."},
		dq(dashSum("cause", dashRate("kvroute_picker_upstream_retries_total")), "retry: {{cause}}"),
		dq(dashSum("cause", dashRate("kvroute_picker_stream_aborts_total")), "abort: {{cause}}"))
	g.timeseries(dashPanel{title: "Endpoint picker (ext_proc) requests", unit: units.OpsPerSecond, w: 12, stack: true,
		desc: "Requests the endpoint picker answered a gateway, by result: picked, no_endpoint, subset_empty, shed, refused, error."},
		dq(dashSum("result", dashRate("kvroute_picker_extproc_requests_total")), "{{result}}"))
	g.timeseries(dashPanel{title: "Endpoint picker: endpoint served", unit: units.OpsPerSecond, w: 12, stack: true,
		desc: "Endpoint picker answers by the endpoint the gateway reports served them: picked, fallback (a later one of the list), other, unreported."},
		dq(dashSum("as", dashRate("kvroute_picker_extproc_served_total")), "{{as}}"))

	g.row("Admission queue")
	g.timeseries(dashPanel{title: "Queue depth", unit: units.Short, w: 6, min: dashNum(0), stack: true,
		desc: "Requests waiting for a saturated model group, by fairness key, all pickers together."},
		dq(dashSum("fairness_key", dashSel("kvroute_picker_queue_depth")), "{{fairness_key}}"))
	g.timeseries(dashPanel{title: "Queue wait", unit: units.Seconds, w: 6, min: dashNum(0),
		desc: "How long requests released from the queue waited."},
		dashQuantiles("kvroute_picker_queue_wait_seconds", "", "")...)
	g.timeseries(dashPanel{title: "Admission results", unit: units.OpsPerSecond, w: 6, stack: true,
		desc: "Requests by how they passed admission: admitted, queued, shed, displaced, expired (429s), abandoned, stopped (503)."},
		dq(dashSum("result", dashRate("kvroute_picker_admission_total")), "{{result}}"))
	g.timeseries(dashPanel{title: "Saturated models", unit: units.Short, w: 6, min: dashNum(0), max: dashNum(1), decimals: dashNum(0),
		desc: "1 while every routable endpoint of the model's group is saturated (requests queue in the pickers), the most any picker reports."},
		dq("max by (model) ("+dashSel("kvroute_picker_model_saturated")+")", "{{model}}"))

	g.row("Gossip and summary streams")
	g.timeseries(dashPanel{title: "Gossip members", unit: units.Short, w: 6, min: dashNum(0), decimals: dashNum(0),
		desc: "Members alive in each node's gossip view: pickers and sidecars should agree."},
		dq("max by (pod) ("+dashSel("kvroute_gossip_members")+")", "{{pod}}"))
	g.timeseries(dashPanel{title: "Gossip events and conflicts", unit: units.Short, w: 6, min: dashNum(0),
		desc: "Membership events and events dropped (the consumer fell behind) over the rate interval, and the nodes holding a name conflict, by kind."},
		dq(dashSum("", dashIncrease("kvroute_gossip_events_total")), "events"),
		dq(dashSum("", dashIncrease("kvroute_gossip_events_dropped_total")), "dropped"),
		dq(dashSum("kind", dashSel("kvroute_gossip_name_conflict")), "name conflict: {{kind}}"))
	g.timeseries(dashPanel{title: "Summary stream from the sidecars", unit: units.BytesPerSecondSI, w: 6, min: dashNum(0), stack: true,
		desc: "Bytes per second of updates sent to watching pickers, by kind (snapshot, delta, load)."},
		dq(dashSum("kind", dashRate("kvroute_sidecar_stream_bytes_total")), "{{kind}}"))
	g.timeseries(dashPanel{title: "Watchers and draining", unit: units.Short, w: 6, min: dashNum(0), decimals: dashNum(0),
		desc: "Pickers watching the sidecars' summaries, watchers cut for falling behind (over the rate interval), and pickers and sidecars draining."},
		dq(dashSum("", dashSel("kvroute_sidecar_watchers")), "watchers"),
		dq(dashSum("", dashIncrease("kvroute_sidecar_watchers_cut_total")), "watchers cut"),
		dq(dashSum("", dashSel("kvroute_picker_draining")), "pickers draining"),
		dq(dashSum("", dashSel("kvroute_sidecar_draining")), "sidecars draining"))

	return g.b.Build()
}

var update = flag.Bool("update", false, "rewrite the generated files: deploy/monitoring/grafana-dashboard.json (TestDashboardGolden) and deploy/monitoring/kvroute-rules.yaml (TestRuleFileGolden)")

// dashboardJSON is the generated dashboard as committed: indented by two
// spaces, with a trailing newline.
func dashboardJSON(t *testing.T) []byte {
	t.Helper()
	d, err := buildDashboard()
	if err != nil {
		t.Fatalf("building the dashboard: %v", err)
	}
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}

// TestDashboardGolden checks the committed dashboard is its generator's
// output; -update rewrites it.
func TestDashboardGolden(t *testing.T) {
	checkGolden(t, dashboardFile, dashboardJSON(t), "TestDashboardGolden")
}

// checkGolden checks the committed file is want, the output of its
// generator (the test named test); -update rewrites it instead.
func checkGolden(t *testing.T, file string, want []byte, test string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(file, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		i := 0
		for i < len(gl) && i < len(wl) && gl[i] == wl[i] {
			i++
		}
		line := func(ls []string) string {
			if i < len(ls) {
				return ls[i]
			}
			return "(end of file)"
		}
		t.Fatalf("%s is not its generator's output (first difference at line %d: have %q, want %q); run go test ./deploy -run %s -update",
			file, i+1, line(gl), line(wl), test)
	}
}

// dashStrictErr is the error of one of the SDK's UnmarshalJSONStrict: in
// v0.0.22 they return their list of errors even when it is empty, a non-nil
// error that says nothing.
func dashStrictErr(err error) error {
	var errs cog.BuildErrors
	if errors.As(err, &errs) && len(errs) == 0 {
		return nil
	}
	return err
}

// dashStrictDecodeErr decodes a dashboard strictly with the SDK (its default
// plugins registered, so panel options, custom field config and Prometheus
// queries decode into their types): an unknown field, a missing required
// one or a value of the wrong type is an error. The SDK decodes a panel's
// fieldConfig leniently but for its custom part, so each panel's, a row's
// panels' included, is decoded strictly again here.
func dashStrictDecodeErr(raw []byte) error {
	plugins.RegisterDefaultPlugins()
	var d dashboard.Dashboard
	if err := dashStrictErr(d.UnmarshalJSONStrict(raw)); err != nil {
		return err
	}
	var plain struct {
		Panels []struct {
			Title       string          `json:"title"`
			FieldConfig json.RawMessage `json:"fieldConfig"`
			Panels      []struct {
				Title       string          `json:"title"`
				FieldConfig json.RawMessage `json:"fieldConfig"`
			} `json:"panels"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &plain); err != nil {
		return err
	}
	check := func(title string, fc json.RawMessage) error {
		if fc == nil {
			return nil
		}
		var f dashboard.FieldConfigSource
		if err := dashStrictErr(f.UnmarshalJSONStrict(fc)); err != nil {
			return fmt.Errorf("panel %q: fieldConfig: %w", title, err)
		}
		return nil
	}
	for _, p := range plain.Panels {
		if err := check(p.Title, p.FieldConfig); err != nil {
			return err
		}
		for _, n := range p.Panels {
			if err := check(n.Title, n.FieldConfig); err != nil {
				return err
			}
		}
	}
	return nil
}

// decodeDashboard decodes the committed dashboard strictly
// (strictDecodeErr) and returns it in the SDK's types. The value comes from
// the SDK's plain decoding of the same bytes: v0.0.22's strict decoding
// reports errors faithfully, but its non-nil empty error lists (strictErr)
// make it drop every panel, query and options it decoded.
func decodeDashboard(t *testing.T) *dashboard.Dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := dashStrictDecodeErr(raw); err != nil {
		t.Fatalf("%s: strict decoding: %v", dashboardFile, err)
	}
	var d dashboard.Dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return &d
}

// TestDashboardStrictDecoding checks strictDecodeErr refuses what it
// should, so TestDashboardStructure's passing means something: the
// committed dashboard with one thing wrong, in each part the SDK decodes.
func TestDashboardStrictDecoding(t *testing.T) {
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := dashStrictDecodeErr(raw); err != nil {
		t.Fatalf("the committed dashboard: %v", err)
	}
	// firstOf returns the first top-level panel of type typ.
	firstOf := func(d map[string]any, typ string) map[string]any {
		for _, p := range d["panels"].([]any) {
			if p := p.(map[string]any); p["type"] == typ {
				return p
			}
		}
		t.Fatalf("no %s panel", typ)
		return nil
	}
	obj := func(v any, keys ...string) map[string]any {
		m := v.(map[string]any)
		for _, k := range keys {
			m = m[k].(map[string]any)
		}
		return m
	}
	for name, spoil := range map[string]func(d map[string]any){
		"dashboard field":    func(d map[string]any) { d["uidd"] = "x" },
		"schemaVersion type": func(d map[string]any) { d["schemaVersion"] = "42" },
		"variable field":     func(d map[string]any) { obj(d, "templating")["list"].([]any)[1].(map[string]any)["regexp"] = "x" },
		"row field":          func(d map[string]any) { firstOf(d, "row")["colapsed"] = true },
		"panel field":        func(d map[string]any) { firstOf(d, "timeseries")["titel"] = "x" },
		"gridPos type":       func(d map[string]any) { obj(firstOf(d, "timeseries"), "gridPos")["w"] = "8" },
		"datasource field":   func(d map[string]any) { obj(firstOf(d, "timeseries"), "datasource")["name"] = "x" },
		"target field":       func(d map[string]any) { firstOf(d, "timeseries")["targets"].([]any)[0].(map[string]any)["exp"] = "up" },
		"target type":        func(d map[string]any) { firstOf(d, "timeseries")["targets"].([]any)[0].(map[string]any)["expr"] = 1 },
		"options field":      func(d map[string]any) { obj(firstOf(d, "timeseries"), "options")["legends"] = map[string]any{} },
		"options enum type":  func(d map[string]any) { obj(firstOf(d, "stat"), "options")["graphMode"] = 1 },
		"legend required":    func(d map[string]any) { delete(obj(firstOf(d, "timeseries"), "options", "legend"), "displayMode") },
		"custom field": func(d map[string]any) {
			obj(firstOf(d, "timeseries"), "fieldConfig", "defaults", "custom")["lineWidht"] = 1
		},
		"state timeline field": func(d map[string]any) { obj(firstOf(d, "state-timeline"), "options")["rowHeigth"] = 1 },
		"defaults field":       func(d map[string]any) { obj(firstOf(d, "timeseries"), "fieldConfig", "defaults")["units"] = "s" },
		"nested panel field": func(d map[string]any) {
			r := firstOf(d, "row")
			r["collapsed"] = true
			p := firstOf(d, "timeseries")
			p = maps.Clone(p)
			p["titel"] = "x"
			r["panels"] = []any{p}
		},
	} {
		var d map[string]any
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		spoil(d)
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := dashStrictDecodeErr(b); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// dashRect is a panel's place on the grid.
type dashRect struct {
	id         uint32
	x, y, w, h uint32
}

func (r dashRect) overlaps(o dashRect) bool {
	return r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h
}

// dashCheckGrid checks panels fit the 24 columns and do not overlap.
func dashCheckGrid(t *testing.T, where string, rs []dashRect) {
	t.Helper()
	for i, r := range rs {
		if r.w == 0 || r.h == 0 || r.x+r.w > 24 {
			t.Errorf("%s: panel %d: gridPos x=%d w=%d h=%d: not within 24 columns", where, r.id, r.x, r.w, r.h)
		}
		for _, o := range rs[:i] {
			if r.overlaps(o) {
				t.Errorf("%s: panels %d and %d overlap: %+v, %+v", where, o.id, r.id, o, r)
			}
		}
	}
}

// The substitutes TestDashboardStructure parses with: values no query
// writes itself, so a selector without the variable, or a range other than
// the rate interval, stands out.
const (
	dashNSMarker     = "NAMESPACE_VARIABLE"
	dashRateInterval = 7*time.Minute + 13*time.Second
)

// TestDashboardStructure decodes the committed dashboard strictly and
// checks what Grafana and its users rely on.
func TestDashboardStructure(t *testing.T) {
	d := decodeDashboard(t)
	if d.Uid == nil || *d.Uid != dashboardUID {
		t.Errorf("uid %v, want %q (Grafana keys the dashboard by it)", d.Uid, dashboardUID)
	}
	if d.SchemaVersion == 0 {
		t.Error("no schemaVersion")
	}
	if d.Title == nil || *d.Title == "" {
		t.Error("no title")
	}

	// The template variables.
	vars := map[string]dashboard.VariableModel{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok {
		t.Error("no datasource variable")
	} else if v.Type != dashboard.VariableTypeDatasource || v.Query == nil || v.Query.String == nil || *v.Query.String != "prometheus" {
		t.Errorf("datasource variable: type %q, query %v: want a datasource variable of type prometheus", v.Type, v.Query)
	}
	if v, ok := vars["namespace"]; !ok {
		t.Error("no namespace variable")
	} else {
		if v.Type != dashboard.VariableTypeQuery {
			t.Errorf("namespace variable: type %q, want query", v.Type)
		}
		if v.Datasource == nil || v.Datasource.Uid == nil || *v.Datasource.Uid != "${datasource}" {
			t.Errorf("namespace variable: datasource %v, want ${datasource}", v.Datasource)
		}
		if v.Query == nil || v.Query.String == nil || !regexp.MustCompile(`^label_values\(kvroute_\w+, namespace\)$`).MatchString(*v.Query.String) {
			t.Errorf("namespace variable: query %v, want label_values(kvroute_…, namespace)", v.Query)
		}
		if v.IncludeAll == nil || !*v.IncludeAll || v.AllValue == nil || *v.AllValue != ".*" {
			t.Error("namespace variable: want All, as .*")
		}
	}

	// The panels: rows and the panels after each.
	ids := map[uint32]string{}
	titles := map[string]bool{}
	var top []dashRect
	var panels []dashboard.Panel
	inRow := false
	id := func(n uint32, title string) {
		if prev, dup := ids[n]; dup {
			t.Errorf("panel id %d of %q is also %q's", n, title, prev)
		}
		ids[n] = title
	}
	for _, pr := range d.Panels {
		switch {
		case pr.RowPanel != nil:
			r := pr.RowPanel
			title := ""
			if r.Title != nil {
				title = *r.Title
			}
			if title == "" {
				t.Errorf("row %d has no title", r.Id)
			}
			id(r.Id, "row "+title)
			if r.GridPos == nil {
				t.Fatalf("row %q: no gridPos", title)
			}
			top = append(top, dashRect{r.Id, r.GridPos.X, r.GridPos.Y, r.GridPos.W, r.GridPos.H})
			var nested []dashRect
			for _, p := range r.Panels {
				panels = append(panels, p)
				if p.GridPos != nil && p.Id != nil {
					nested = append(nested, dashRect{*p.Id, p.GridPos.X, p.GridPos.Y, p.GridPos.W, p.GridPos.H})
				}
			}
			dashCheckGrid(t, "row "+title, nested)
			inRow = true
		case pr.Panel != nil:
			p := *pr.Panel
			if !inRow {
				t.Errorf("panel %v before the first row", p.Title)
			}
			panels = append(panels, p)
			if p.GridPos != nil && p.Id != nil {
				top = append(top, dashRect{*p.Id, p.GridPos.X, p.GridPos.Y, p.GridPos.W, p.GridPos.H})
			}
		}
	}
	dashCheckGrid(t, "dashboard", top)

	ps := parser.NewParser(parser.Options{})
	metrics := map[string]bool{}
	for _, p := range panels {
		title := ""
		if p.Title != nil {
			title = *p.Title
		}
		if title == "" || titles[title] {
			t.Errorf("panel title %q: empty or not unique", title)
		}
		titles[title] = true
		if p.Id == nil {
			t.Errorf("panel %q: no id", title)
		} else {
			id(*p.Id, title)
		}
		if p.GridPos == nil {
			t.Errorf("panel %q: no gridPos", title)
		}
		if p.Description == nil || *p.Description == "" {
			t.Errorf("panel %q: no description", title)
		}
		if !isDashDatasource(p.Datasource) {
			t.Errorf("panel %q: datasource %v, want the datasource variable (type prometheus, uid ${datasource})", title, p.Datasource)
		}
		if p.Type != "state-timeline" && (p.FieldConfig == nil || p.FieldConfig.Defaults.Unit == nil || *p.FieldConfig.Defaults.Unit == "") {
			t.Errorf("panel %q (%s): no unit", title, p.Type)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no targets", title)
		}
		refs := map[string]bool{}
		for i, raw := range p.Targets {
			q, ok := raw.(*prometheus.Dataquery)
			if !ok {
				t.Errorf("panel %q: target %d: %T, want a Prometheus query", title, i, raw)
				continue
			}
			if q.RefId == nil || refs[*q.RefId] {
				t.Errorf("panel %q: target %d: refId %v missing or repeated", title, i, q.RefId)
			} else {
				refs[*q.RefId] = true
			}
			if !isDashDatasource(q.Datasource) {
				t.Errorf("panel %q: target %d: datasource %v, want the datasource variable", title, i, q.Datasource)
			}
			if q.LegendFormat == nil || *q.LegendFormat == "" {
				t.Errorf("panel %q: target %d: no legendFormat", title, i)
			}
			if strings.TrimSpace(q.Expr) == "" {
				t.Errorf("panel %q: target %d: empty expr", title, i)
				continue
			}
			expr := strings.NewReplacer("$namespace", dashNSMarker, "$__rate_interval", model.Duration(dashRateInterval).String()).Replace(q.Expr)
			e, err := ps.ParseExpr(expr)
			if err != nil {
				t.Errorf("panel %q: target %d: %s: %v", title, i, q.Expr, err)
				continue
			}
			parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
				switch n := n.(type) {
				case *parser.VectorSelector:
					metrics[n.Name] = true
					if !strings.HasPrefix(n.Name, "kvroute_") {
						t.Errorf("panel %q: %s: selects %q, not a kvroute metric", title, q.Expr, n.Name)
					}
					if !slices.ContainsFunc(n.LabelMatchers, func(m *labels.Matcher) bool {
						return m.Name == "namespace" && m.Type == labels.MatchRegexp && m.Value == dashNSMarker
					}) {
						t.Errorf("panel %q: %s: selector %s without namespace=~\"$namespace\"", title, q.Expr, n)
					}
				case *parser.MatrixSelector:
					if n.Range != dashRateInterval {
						t.Errorf("panel %q: %s: range %s, want $__rate_interval", title, q.Expr, n.Range)
					}
				case *parser.SubqueryExpr:
					t.Errorf("panel %q: %s: a subquery", title, q.Expr)
				}
				return nil
			})
		}
	}

	// What issue 20 asks the dashboard to show.
	for _, m := range []string{
		"kvroute_picker_decisions_total",
		"kvroute_picker_predicted_cached_tokens_total", "kvroute_picker_reported_cached_tokens_total", "kvroute_picker_outcomes_total",
		"kvroute_picker_load_overrides_total", "kvroute_picker_load_override_tokens_total",
		"kvroute_picker_endpoint_state", "kvroute_picker_endpoint_staleness_seconds", "kvroute_picker_event_to_routable_seconds_bucket",
		"kvroute_sidecar_events_total", "kvroute_sidecar_seq_gaps_total", "kvroute_sidecar_replays_total",
		"kvroute_sidecar_engine_restarts_total", "kvroute_sidecar_stream_state",
		"kvroute_picker_tokenize_seconds_bucket", "kvroute_picker_tokenize_errors_total",
		"kvroute_picker_requests_total", "kvroute_picker_request_duration_seconds_bucket", "kvroute_picker_time_to_first_byte_seconds_bucket",
		"kvroute_picker_queue_depth", "kvroute_picker_queue_wait_seconds_bucket", "kvroute_picker_admission_total", "kvroute_picker_model_saturated",
		"kvroute_gossip_members", "kvroute_picker_stream_aborts_total",
	} {
		if !metrics[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
	t.Logf("%d rows, %d panels, %d metrics", len(d.Panels)-len(panels), len(panels), len(metrics))
}

func isDashDatasource(r *common.DataSourceRef) bool {
	return r != nil && r.Type != nil && *r.Type == "prometheus" && r.Uid != nil && *r.Uid == "${datasource}"
}

// TestDashboardMetricsExist checks every metric the dashboard selects is
// one kvroute defines: its full name, or its name within the subsystem
// (kvroute_picker_X: "X" in package picker), is a string in the code that
// registers it. A histogram's _bucket, _sum and _count are its name's.
func TestDashboardMetricsExist(t *testing.T) {
	literals := codeLiterals(t)
	qs, err := DashboardQueries(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	ps := parser.NewParser(parser.Options{})
	seen := map[string]bool{}
	for _, q := range qs {
		e, err := ps.ParseExpr(q.Expr)
		if err != nil {
			t.Fatalf("%s: %s: %v", q.Panel, q.Expr, err)
		}
		parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
			if v, ok := n.(*parser.VectorSelector); ok {
				seen[v.Name] = true
			}
			return nil
		})
	}
	for name := range seen {
		if !dashMetricDefined(literals, name) {
			t.Errorf("the dashboard selects %s: no such metric in picker, sidecar or gossip", name)
		}
	}
}

// codeLiterals returns, by subsystem (picker, sidecar, gossip), the string
// literals of the code that registers its metrics (tests left out).
func codeLiterals(t *testing.T) map[string]map[string]bool {
	t.Helper()
	literals := map[string]map[string]bool{} // subsystem → string literals of its code
	lit := regexp.MustCompile(`"([a-z][a-z0-9_]*)"`)
	for sub, dir := range map[string]string{"picker": "../picker", "sidecar": "../sidecar", "gossip": "../gossip"} {
		literals[sub] = map[string]bool{}
		err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range lit.FindAllSubmatch(src, -1) {
				literals[sub][string(m[1])] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return literals
}

// TestDashboardSeriesBuiltIn: the series kvroute verify requires of each
// component (deploy/monitoring's Series, from the dashboard built into the
// binary) are exactly the kvroute series Prometheus's PromQL parser finds
// in the dashboard's queries, each under its component.
func TestDashboardSeriesBuiltIn(t *testing.T) {
	got, err := monitoring.Series()
	if err != nil {
		t.Fatal(err)
	}
	qs, err := DashboardQueries(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	ps := parser.NewParser(parser.Options{})
	for _, q := range qs {
		e, err := ps.ParseExpr(q.Expr)
		if err != nil {
			t.Fatalf("%s: %v", q.Panel, err)
		}
		for _, m := range MetricNames(e) {
			for _, c := range []string{monitoring.Picker, monitoring.Sidecar, monitoring.Gossip} {
				if strings.HasPrefix(m, "kvroute_"+c+"_") && !slices.Contains(want[c], m) {
					want[c] = append(want[c], m)
				}
			}
		}
	}
	for c := range want {
		slices.Sort(want[c])
	}
	if len(want[monitoring.Picker]) < 10 || len(want[monitoring.Sidecar]) < 5 {
		t.Fatalf("the dashboard reads few series: %v", want)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("built in: %v\nthe dashboard's queries: %v", got, want)
	}
	if _, err := monitoring.DashboardSeries([]byte(`{"panels":[{"targets":[{"expr":"up"}]}]}`)); err == nil {
		t.Error("a dashboard reading no kvroute series accepted")
	}
}

func dashMetricDefined(literals map[string]map[string]bool, name string) bool {
	names := []string{name}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			names = append(names, base)
		}
	}
	for _, n := range names {
		for sub, lits := range literals {
			if lits[n] {
				return true
			}
			if rest, ok := strings.CutPrefix(n, "kvroute_"+sub+"_"); ok && lits[rest] {
				return true
			}
		}
	}
	return false
}

// TestDashboardQueries checks DashboardQueries on a dashboard of every
// shape it reads, and on the committed one.
func TestDashboardQueries(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := write("d.json", `{
  "panels": [
    {"type": "timeseries", "title": "A", "targets": [
      {"expr": "sum by (le) (rate(x_bucket{namespace=~\"$namespace\"}[$__rate_interval]))"},
      {"expr": "increase(y{pod=~\"${pod:regex}\", ns=~\"[[namespace]]\"}[$__interval]) / $__range_s"}
    ]},
    {"type": "row", "title": "R", "collapsed": true, "panels": [
      {"type": "stat", "title": "B", "targets": [{"expr": "max_over_time(z[$__range])"}, {"refId": "X", "datasource": {"type": "loki"}}]}
    ]},
    {"type": "text", "title": "C"}
  ]
}`)
	got, err := DashboardQueries(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []Query{
		{"A", `sum by (le) (rate(x_bucket{namespace=~".*"}[5m]))`},
		{"A", `increase(y{pod=~".*", ns=~".*"}[1m]) / 3600`},
		{"B", `max_over_time(z[1h])`},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}

	for name, s := range map[string]string{
		"empty.json":    `{"panels": [{"title": "E", "targets": [{"expr": " "}]}]}`,
		"notjson.json":  `{"panels": [`,
		"nopanels.json": `{"title": "x"}`,
		"badtype.json":  `{"panels": [{"title": "T", "targets": [{"expr": 1}]}]}`,
	} {
		if qs, err := DashboardQueries(write(name, s)); err == nil {
			t.Errorf("%s: no error, queries %q", name, qs)
		}
	}
	if _, err := DashboardQueries(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing file: no error")
	}

	// The committed dashboard: one query per target, each parsing.
	qs, err := DashboardQueries(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	d := decodeDashboard(t)
	n := 0
	for _, pr := range d.Panels {
		if pr.Panel != nil {
			n += len(pr.Panel.Targets)
		}
		if pr.RowPanel != nil {
			for _, p := range pr.RowPanel.Panels {
				n += len(p.Targets)
			}
		}
	}
	if len(qs) != n || n == 0 {
		t.Errorf("%d queries from %d targets", len(qs), n)
	}
	ps := parser.NewParser(parser.Options{})
	for _, q := range qs {
		if q.Panel == "" || strings.Contains(q.Expr, "$") {
			t.Errorf("query %q of panel %q: no panel or a variable left", q.Expr, q.Panel)
		}
		if _, err := ps.ParseExpr(q.Expr); err != nil {
			t.Errorf("panel %q: %s: %v", q.Panel, q.Expr, err)
		}
	}
}

// TestDashboardErrorPanelsReadZero evaluates the error panels' queries with
// Prometheus's engine: on requests that all succeeded they read 0 (the
// non-2xx series do not exist yet), and with errors on one route they read
// those errors, and 0 for the other route.
func TestDashboardErrorPanelsReadZero(t *testing.T) {
	qs, err := DashboardQueries(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	byPanel := map[string]string{}
	for _, q := range qs {
		byPanel[q.Panel] = q.Expr
	}
	const ok = `load 15s
  kvroute_picker_requests_total{namespace="llm", route="/v1/completions", model="m", code="200"} 0+10x40
  kvroute_picker_requests_total{namespace="llm", route="/v1/chat/completions", model="m", code="200"} 0+10x40
`
	const failing = ok + `  kvroute_picker_requests_total{namespace="llm", route="/v1/chat/completions", model="m", code="503"} 0+5x40
`
	engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 1_000_000)
	at := time.Unix(0, 0).Add(10 * time.Minute)
	eval := func(input, expr string) map[string]float64 {
		st := promqltest.LoadedStorage(t, input)
		q, err := engine.NewInstantQuery(context.Background(), st, nil, expr, at)
		if err != nil {
			t.Fatal(err)
		}
		v, err := q.Exec(context.Background()).Vector()
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		out := map[string]float64{}
		for _, s := range v {
			out[s.Metric.Get("route")+" "+s.Metric.Get("code")] = s.F
		}
		return out
	}
	for _, c := range []struct {
		panel, input string
		want         map[string]float64
	}{
		{"Non-2xx share", ok, map[string]float64{" ": 0}},
		{"Non-2xx share", failing, map[string]float64{" ": 0.2}},
		{"Errors by route and code", ok, map[string]float64{"/v1/completions ": 0, "/v1/chat/completions ": 0}},
		{"Errors by route and code", failing, map[string]float64{"/v1/completions ": 0, "/v1/chat/completions 503": 1.0 / 3}},
		{"Error ratio by route", ok, map[string]float64{"/v1/completions ": 0, "/v1/chat/completions ": 0}},
		{"Error ratio by route", failing, map[string]float64{"/v1/completions ": 0, "/v1/chat/completions ": 1.0 / 3}},
	} {
		expr, found := byPanel[c.panel]
		if !found {
			t.Fatalf("no panel %q", c.panel)
		}
		got := eval(c.input, expr)
		if len(got) != len(c.want) {
			t.Errorf("%s: %v, want %v", c.panel, got, c.want)
			continue
		}
		for k, w := range c.want {
			if g, ok := got[k]; !ok || math.Abs(g-w) > 1e-9 {
				t.Errorf("%s: %v, want %v", c.panel, got, c.want)
			}
		}
	}
}
