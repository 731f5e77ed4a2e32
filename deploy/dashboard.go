package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// Query is one PromQL expression of a Grafana dashboard: its panel's title
// and the expression with Grafana's variables substituted.
type Query struct {
	Panel, Expr string
}

// grafanaIntervals are the values DashboardQueries puts for Grafana's
// built-in interval variables: durations PromQL accepts where Grafana would
// put its own.
var grafanaIntervals = map[string]string{
	"__rate_interval":    "5m",
	"__interval":         "1m",
	"__range":            "1h",
	"__rate_interval_ms": "300000",
	"__interval_ms":      "60000",
	"__range_ms":         "3600000",
	"__range_s":          "3600",
}

// grafanaVariable matches a variable reference in Grafana's three syntaxes:
// $name, ${name} (with an optional :format) and [[name]].
var grafanaVariable = regexp.MustCompile(`\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]`)

// DashboardQueries returns every PromQL expression of the dashboard JSON at
// path, in panel order (a row's nested panels after the row), each with its
// panel's title. Grafana's variables are substituted so the expression
// parses: $__rate_interval → 5m, $__interval → 1m, $__range → 1h (their _ms
// and _s forms likewise), and every other variable ($namespace and the
// dashboard's other template variables) → .*, the value of "All" in a
// regex matcher. A target without an expr (another datasource's query) is
// skipped; a target with an empty one is an error, as is JSON that is not a
// dashboard.
//
// It reads the JSON as plain data (panels, rows' panels, targets[].expr),
// so it needs nothing from Grafana's own types.
func DashboardQueries(path string) ([]Query, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []dashboardPanel `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if d.Panels == nil {
		return nil, fmt.Errorf("%s: no panels: not a dashboard", path)
	}
	var out []Query
	var walk func(ps []dashboardPanel) error
	walk = func(ps []dashboardPanel) error {
		for _, p := range ps {
			for i, t := range p.Targets {
				if t.Expr == nil {
					continue
				}
				if strings.TrimSpace(*t.Expr) == "" {
					return fmt.Errorf("%s: panel %q: target %d: empty expr", path, p.Title, i)
				}
				out = append(out, Query{Panel: p.Title, Expr: substituteGrafanaVariables(*t.Expr)})
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(d.Panels); err != nil {
		return nil, err
	}
	return out, nil
}

// dashboardPanel is what DashboardQueries reads of a panel or row.
type dashboardPanel struct {
	Title   string           `json:"title"`
	Targets []dashboardQuery `json:"targets"`
	Panels  []dashboardPanel `json:"panels"` // a row's
}

type dashboardQuery struct {
	Expr *string `json:"expr"`
}

// substituteGrafanaVariables replaces Grafana's variables in a PromQL
// expression: the built-in intervals by fixed durations, every other
// variable by .*.
func substituteGrafanaVariables(expr string) string {
	return grafanaVariable.ReplaceAllStringFunc(expr, func(ref string) string {
		m := grafanaVariable.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3] // one of them matched
		if v, ok := grafanaIntervals[name]; ok {
			return v
		}
		return ".*"
	})
}
