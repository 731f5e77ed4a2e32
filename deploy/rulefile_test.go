package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// ruleFile is the plain Prometheus rule file made from the PrometheusRule
// (RuleFile), for Prometheus without the Operator and for promtool.
const ruleFile = "monitoring/kvroute-rules.yaml"

// ruleTests are promtool's unit tests of every alert (promtool test rules).
const ruleTests = "monitoring/kvroute-rules_test.yaml"

// TestRuleFileGolden checks the committed rule file is the PrometheusRule's
// groups; -update rewrites it.
func TestRuleFileGolden(t *testing.T) {
	want, err := RuleFile(rulePath)
	if err != nil {
		t.Fatal(err)
	}
	want = append([]byte("# Generated from deploy/components/monitoring/prometheusrule.yaml (its spec.groups)\n"+
		"# by go test ./deploy -run TestRuleFileGolden -update: edit the PrometheusRule, not this file.\n"+
		"# For a Prometheus without the Operator: list it under rule_files.\n"), want...)
	checkGolden(t, ruleFile, want, "TestRuleFileGolden")
}

// TestRuleFileRefuses: a rule field a Prometheus 2 rule file cannot hold is
// an error, not dropped.
func TestRuleFileRefuses(t *testing.T) {
	for name, group := range map[string]string{
		"group labels":     "labels: {team: x}",
		"query offset":     "query_offset: 1m",
		"partial response": "partial_response_strategy: warn",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rule.yaml")
			y := "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec:\n  groups:\n    - name: g\n      " + group +
				"\n      rules:\n        - alert: A\n          expr: up == 0\n"
			if err := os.WriteFile(path, []byte(y), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := RuleFile(path); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

// promtool finds Prometheus's promtool (Debian's prometheus package, which
// make deps installs).
func promtool(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"promtool", "/usr/bin/promtool"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatal("promtool not found: run make deps (it installs Debian's prometheus package)")
	return ""
}

// TestPromtoolCheckRules: promtool accepts the rule file.
func TestPromtoolCheckRules(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", ruleFile).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool check rules %s: %v\n%s", ruleFile, err, out)
	}
}

// TestPromtoolTestRules runs promtool's unit tests of the alerts. Every
// alert has a test in which it fires, with its labels and its annotations
// rendered, and one evaluation before its hold ends at which it does not.
func TestPromtoolTestRules(t *testing.T) {
	out, err := exec.Command(promtool(t), "test", "rules", ruleTests).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool test rules %s: %v\n%s", ruleTests, err, out)
	}
	alerts, err := Alerts(rulePath)
	if err != nil {
		t.Fatal(err)
	}
	covered, err := ruleTestCoverage(ruleTests)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		c := covered[a.Name]
		if c.fires == nil {
			t.Errorf("%s: no promtool test in which it fires", a.Name)
			continue
		}
		if a.For > 0 && !slices.ContainsFunc(c.quiet, func(q time.Duration) bool { return q > 0 && q < *c.fires }) {
			t.Errorf("%s: no promtool test evaluates it within its hold (for %v, before it fires at %v) and expects it quiet", a.Name, a.For, *c.fires)
		}
	}
	for name := range covered {
		if !slices.ContainsFunc(alerts, func(a Alert) bool { return a.Name == name }) {
			t.Errorf("%s: tested, but the rule has no such alert", name)
		}
	}
}

// alertCoverage is what a promtool test file checks of one alert: the
// first evaluation at which it fires, and those at which it is quiet.
type alertCoverage struct {
	fires *time.Duration
	quiet []time.Duration
}

// ruleTestCoverage reads a promtool test file's alert_rule_test entries.
func ruleTestCoverage(path string) (map[string]alertCoverage, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				EvalTime  string `yaml:"eval_time"`
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[string]alertCoverage{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			at, err := time.ParseDuration(a.EvalTime)
			if err != nil {
				return nil, fmt.Errorf("%s: %s eval_time %q: %w", path, a.Alertname, a.EvalTime, err)
			}
			c := out[a.Alertname]
			if len(a.ExpAlerts) == 0 {
				c.quiet = append(c.quiet, at)
			} else if c.fires == nil || at < *c.fires {
				c.fires = &at
			}
			out[a.Alertname] = c
		}
	}
	return out, nil
}
