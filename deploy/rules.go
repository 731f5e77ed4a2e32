package deploy

import (
	"fmt"
	"os"
	"slices"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Alert is one alerting rule of a PrometheusRule.
type Alert struct {
	Group, Name, Expr string
	For               time.Duration
	Labels            map[string]string
	Annotations       map[string]string
}

// Alerts strictly decodes the PrometheusRule at path and returns its
// alerting rules in order. A recording rule, a rule with both or neither
// of alert and record, or a duration that does not parse is an error.
func Alerts(path string) ([]Alert, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pr monitoringv1.PrometheusRule
	if err := DecodeInto(raw, &pr); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		return nil, fmt.Errorf("%s: %s %s, want a monitoring.coreos.com/v1 PrometheusRule", path, pr.APIVersion, pr.Kind)
	}
	var out []Alert
	for _, g := range pr.Spec.Groups {
		for i, r := range g.Rules {
			if r.Alert == "" || r.Record != "" {
				return nil, fmt.Errorf("%s: group %s rule %d: want an alerting rule (alert set, record not)", path, g.Name, i+1)
			}
			a := Alert{Group: g.Name, Name: r.Alert, Expr: r.Expr.String(), Labels: r.Labels, Annotations: r.Annotations}
			if r.For != nil {
				d, err := model.ParseDuration(string(*r.For))
				if err != nil {
					return nil, fmt.Errorf("%s: %s: for %q: %w", path, r.Alert, *r.For, err)
				}
				a.For = time.Duration(d)
			}
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no alerting rule", path)
	}
	return out, nil
}

// MetricNames returns the metric names expr selects, sorted and without
// repeats.
func MetricNames(expr parser.Expr) []string {
	var out []string
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			if name == "" { // {__name__="…"}
				for _, m := range vs.LabelMatchers {
					if m.Name == "__name__" && m.Type == labels.MatchEqual {
						name = m.Value
					}
				}
			}
			if name != "" && !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
		return nil
	})
	slices.Sort(out)
	return out
}
