package monitoring

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

//go:embed grafana-dashboard.json
var dashboard []byte

// The components whose series a dashboard reads.
const (
	Picker  = "picker"
	Sidecar = "sidecar"
	Gossip  = "gossip"
)

// Series returns the kvroute series the dashboard built in reads, by
// component (DashboardSeries).
func Series() (map[string][]string, error) { return DashboardSeries(dashboard) }

// kvrouteSeries matches a kvroute metric name in a PromQL expression: its
// component, then the rest. Label values are quoted and hyphenated
// ("kvroute-picker-admin") and label names never start with kvroute_.
var kvrouteSeries = regexp.MustCompile(`\bkvroute_(picker|sidecar|gossip)_[a-zA-Z0-9_]+`)

// DashboardSeries returns, by component (Picker, Sidecar, Gossip), the
// kvroute series the expressions of the dashboard JSON in doc select,
// sorted and each once.
func DashboardSeries(doc []byte) (map[string][]string, error) {
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var exprs []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok {
				exprs = append(exprs, e)
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(v)
	out := map[string][]string{}
	for _, e := range exprs {
		for _, m := range kvrouteSeries.FindAllStringSubmatch(e, -1) {
			if !slices.Contains(out[m[1]], m[0]) {
				out[m[1]] = append(out[m[1]], m[0])
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("dashboard: no query selects a kvroute series")
	}
	for _, names := range out {
		slices.SortFunc(names, strings.Compare)
	}
	return out, nil
}
