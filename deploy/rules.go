package deploy

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// ExternalMetrics are the metrics the alerts read that are not kvroute's:
// up (Prometheus's own, one per target) and
// kube_pod_container_status_waiting_reason (kube-state-metrics, optional:
// an expression reading it must still work where it is absent).
var ExternalMetrics = []string{"up", "kube_pod_container_status_waiting_reason"}

// Alert is one alerting rule of a PrometheusRule.
type Alert struct {
	Group, Name, Expr string
	For               time.Duration
	Labels            map[string]string
	Annotations       map[string]string
}

// readPrometheusRule strictly decodes the monitoring.coreos.com/v1
// PrometheusRule at path.
func readPrometheusRule(path string) (*monitoringv1.PrometheusRule, error) {
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
	return &pr, nil
}

// RuleFile returns the PrometheusRule at path as a Prometheus rule file:
// its spec.groups, which Prometheus (rule_files) and promtool read without
// the Operator. Keys keep the rule file's order (name, interval, rules;
// alert, expr, for, labels, annotations) and expressions stay literal
// blocks, so the output is the file an operator would write. A group or
// rule field a plain Prometheus 2 rule file does not take (group labels,
// query_offset, partial_response_strategy) is an error.
func RuleFile(path string) ([]byte, error) {
	pr, err := readPrometheusRule(path)
	if err != nil {
		return nil, err
	}
	type rule struct {
		Alert         string            `yaml:"alert,omitempty"`
		Record        string            `yaml:"record,omitempty"`
		Expr          string            `yaml:"expr"`
		For           string            `yaml:"for,omitempty"`
		KeepFiringFor string            `yaml:"keep_firing_for,omitempty"`
		Labels        map[string]string `yaml:"labels,omitempty"`
		Annotations   map[string]string `yaml:"annotations,omitempty"`
	}
	type group struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval,omitempty"`
		Limit    int    `yaml:"limit,omitempty"`
		Rules    []rule `yaml:"rules"`
	}
	var out struct {
		Groups []group `yaml:"groups"`
	}
	for _, g := range pr.Spec.Groups {
		if len(g.Labels) > 0 || g.QueryOffset != nil || g.PartialResponseStrategy != "" {
			return nil, fmt.Errorf("%s: group %s: labels, query_offset or partial_response_strategy: not in a Prometheus 2 rule file", path, g.Name)
		}
		og := group{Name: g.Name}
		if g.Interval != nil {
			og.Interval = string(*g.Interval)
		}
		if g.Limit != nil {
			og.Limit = *g.Limit
		}
		for _, r := range g.Rules {
			or := rule{Alert: r.Alert, Record: r.Record, Expr: r.Expr.String(), Labels: r.Labels, Annotations: r.Annotations}
			if r.For != nil {
				or.For = string(*r.For)
			}
			if r.KeepFiringFor != nil {
				or.KeepFiringFor = string(*r.KeepFiringFor)
			}
			og.Rules = append(og.Rules, or)
		}
		out.Groups = append(out.Groups, og)
	}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(out); err != nil {
		return nil, err
	}
	return []byte(b.String()), nil
}

// Alerts strictly decodes the PrometheusRule at path and returns its
// alerting rules in order. A recording rule, a rule with both or neither
// of alert and record, or a duration that does not parse is an error.
func Alerts(path string) ([]Alert, error) {
	pr, err := readPrometheusRule(path)
	if err != nil {
		return nil, err
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
