package deploy

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// rulePath is the PrometheusRule in the monitoring component.
const rulePath = "components/monitoring/prometheusrule.yaml"

// TestAlertRules: the rule has the alerts; each parses with
// Prometheus's PromQL parser, names only kvroute metrics the code defines
// (as TestDashboardMetricsExist judges the dashboard's), has a severity,
// a summary and a runbook paragraph in deploy/monitoring/README.md.
func TestAlertRules(t *testing.T) {
	literals := codeLiterals(t)
	alerts, err := Alerts(rulePath)
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("monitoring/README.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	p := parser.NewParser(parser.Options{})
	for _, a := range alerts {
		names = append(names, a.Name)
		expr, err := p.ParseExpr(a.Expr)
		if err != nil {
			t.Errorf("%s: %v", a.Name, err)
			continue
		}
		if expr.Type() != parser.ValueTypeVector {
			t.Errorf("%s: the expression is a %s, want an instant vector", a.Name, expr.Type())
		}
		for _, m := range MetricNames(expr) {
			switch {
			case slices.Contains(ExternalMetrics, m):
			case !strings.HasPrefix(m, "kvroute_"):
				t.Errorf("%s: names %s, not a kvroute metric", a.Name, m)
			case !dashMetricDefined(literals, m):
				t.Errorf("%s: names %s: no such metric in picker, sidecar or gossip", a.Name, m)
			}
		}
		if !slices.Contains([]string{"critical", "warning", "info"}, a.Labels["severity"]) {
			t.Errorf("%s: severity %q", a.Name, a.Labels["severity"])
		}
		if a.Annotations["summary"] == "" || a.Annotations["description"] == "" {
			t.Errorf("%s: no summary or description", a.Name)
		}
		anchor := strings.ToLower(a.Name)
		if a.Annotations["runbook_url"] != "deploy/monitoring/README.md#"+anchor {
			t.Errorf("%s: runbook_url %q", a.Name, a.Annotations["runbook_url"])
		}
		if !strings.Contains(string(readme), "\n### "+a.Name+"\n") {
			t.Errorf("%s: no runbook paragraph (### %s) in deploy/monitoring/README.md", a.Name, a.Name)
		}
	}
	for _, want := range []string{"KvrouteEndpointLoadOnly", "KvrouteEventStreamSilent", "KvroutePredictionAgreementLow",
		"KvroutePickerNoEndpoints", "KvrouteRenderErrors", "KvrouteSidecarReplayFailures", "KvrouteGossipFlapping",
		"KvroutePickersAbsent", "KvroutePickerTargetDown", "KvrouteSidecarTargetDown", "KvrouteScrapeJobUnexpected",
		"KvrouteEndpointsUntrusted", "KvrouteSidecarStreamsFailing"} {
		if !slices.Contains(names, want) {
			t.Errorf("no alert %s (have %v)", want, names)
		}
	}
	if a := alerts[slices.IndexFunc(alerts, func(a Alert) bool { return a.Name == "KvrouteEndpointLoadOnly" })]; a.For.Minutes() != 5 {
		t.Errorf("KvrouteEndpointLoadOnly: for %v, want 5m (the issue's: routable by load only for more than 5 minutes)", a.For)
	}
	// Every runbook paragraph belongs to an alert.
	for _, m := range regexp.MustCompile(`\n### (\w+)\n`).FindAllStringSubmatch(string(readme), -1) {
		if !slices.Contains(names, m[1]) {
			t.Errorf("deploy/monitoring/README.md: runbook %s has no alert", m[1])
		}
	}
}

// TestAlertsRefused: Alerts refuses what Prometheus would not load or
// the tests could not check.
func TestAlertsRefused(t *testing.T) {
	for name, body := range map[string]string{
		"unknown field": "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {groups: [{name: g, rules: [{alert: A, expr: up, fore: 5m}]}]}\n",
		"recording":     "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {groups: [{name: g, rules: [{record: r, expr: up}]}]}\n",
		"bad duration":  "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {groups: [{name: g, rules: [{alert: A, expr: up, for: 5 minutes}]}]}\n",
		"empty":         "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {groups: []}\n",
		"other kind":    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
	} {
		path := filepath.Join(t.TempDir(), "rule.yaml")
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Alerts(path); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestMonitoringComponent: the monitoring example carries the
// ServiceMonitors (on the Services' own port names), the rule and the
// dashboard ConfigMap (its content the JSON file, the Grafana sidecar's
// label, no hash suffix); the fleets without it carry no CRD kind.
func TestMonitoringComponent(t *testing.T) {
	objs := built(t, "examples/monitoring")
	picker, sidecars := objs["Service/kvroute-picker-admin"].(*corev1.Service), objs["Service/kvroute-sidecars"].(*corev1.Service)
	if picker == nil || picker.Spec.ClusterIP != "None" || picker.Spec.Selector["app.kubernetes.io/name"] != "kvroute-picker" {
		t.Fatalf("the pickers' admin Service: %+v", picker)
	}
	for _, c := range []struct {
		sm   string
		svc  *corev1.Service
		port string
	}{{"ServiceMonitor/kvroute-picker", picker, "admin"}, {"ServiceMonitor/kvroute-sidecars", sidecars, "admin"}} {
		sm, ok := objs[c.sm].(*monitoringv1.ServiceMonitor)
		if !ok {
			t.Fatalf("no %s", c.sm)
		}
		if sm.Namespace != "llm" || sm.Spec.Endpoints[0].Port != c.port || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("%s: %+v", c.sm, sm.Spec)
		}
		for k, v := range sm.Spec.Selector.MatchLabels {
			if c.svc.Labels[k] != v {
				t.Errorf("%s selects %s=%s; Service %s has labels %v", c.sm, k, v, c.svc.Name, c.svc.Labels)
			}
		}
		if !slices.ContainsFunc(c.svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == c.port }) {
			t.Errorf("Service %s has no port %s", c.svc.Name, c.port)
		}
	}
	if _, ok := objs["PrometheusRule/kvroute"].(*monitoringv1.PrometheusRule); !ok {
		t.Fatal("no PrometheusRule/kvroute")
	}
	cm, ok := objs["ConfigMap/kvroute-grafana-dashboard"].(*corev1.ConfigMap)
	if !ok {
		t.Fatalf("no ConfigMap/kvroute-grafana-dashboard: %v", keys(objs))
	}
	want, err := os.ReadFile("monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if cm.Labels["grafana_dashboard"] != "1" || cm.Data["kvroute.json"] != string(want) || cm.Namespace != "llm" {
		t.Errorf("dashboard ConfigMap: labels %v, namespace %q, %d bytes (want %d)", cm.Labels, cm.Namespace, len(cm.Data["kvroute.json"]), len(want))
	}
	for _, dir := range []string{"examples/vllm", "examples/vllm-dp2", "examples/agentic-api"} {
		for id, v := range built(t, dir) {
			switch v.(type) {
			case *monitoringv1.ServiceMonitor, *monitoringv1.PrometheusRule:
				t.Errorf("%s: %s needs the Prometheus Operator; it belongs in components/monitoring", dir, id)
			}
		}
	}
}

// TestSettingsChangeRollsPods: the picker's and the sidecar's settings
// come from generators whose names carry a hash of their content, so
// editing them gives the ConfigMaps new names, and the Deployments that
// mount them change with them (a rollout).
func TestSettingsChangeRollsPods(t *testing.T) {
	tmp := t.TempDir()
	if err := os.CopyFS(tmp, os.DirFS(".")); err != nil {
		t.Fatal(err)
	}
	before := built(t, filepath.Join(tmp, "examples/vllm"))
	for _, f := range []string{"base/picker.json", "components/sidecar/sidecar.json"} {
		path := filepath.Join(tmp, f)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		edited := strings.Replace(string(b), `"log-level": "info"`, `"log-level": "debug"`, 1)
		if edited == string(b) {
			t.Fatalf("%s: nothing to edit", f)
		}
		if err := os.WriteFile(path, []byte(edited), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	after := built(t, filepath.Join(tmp, "examples/vllm"))
	for _, c := range []struct{ deployment, configMap string }{
		{"Deployment/kvroute-picker", "kvroute-picker"}, {"Deployment/vllm-qwen3", "kvroute-sidecar"}} {
		old, cur := generated(t, before, c.configMap), generated(t, after, c.configMap)
		if old.Name == cur.Name {
			t.Errorf("%s kept its name %s after its content changed: the pods would not roll", c.configMap, cur.Name)
		}
		for _, objs := range []map[string]any{before, after} {
			cm := generated(t, objs, c.configMap)
			if !mounts(objs[c.deployment].(*appsv1.Deployment), cm.Name) {
				t.Errorf("%s does not mount %s", c.deployment, cm.Name)
			}
		}
	}
}

// mounts reports whether d's pods mount ConfigMap name.
func mounts(d *appsv1.Deployment, name string) bool {
	return slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.ConfigMap != nil && v.ConfigMap.Name == name
	})
}

// TestImageInOnePlace: the manifests name the kvroute image without a
// registry or tag, and one images: entry in an overlay sets it for the
// picker and the sidecar alike.
func TestImageInOnePlace(t *testing.T) {
	image := regexp.MustCompile(`(?m)^\s*image:\s*(\S+)`)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || strings.HasPrefix(path, "examples/agentic-api") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range image.FindAllStringSubmatch(string(b), -1) {
			if strings.Contains(m[1], "kvroute") && m[1] != "kvroute" {
				t.Errorf("%s: image %s: name it kvroute and let the overlay's images: set registry and tag", path, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if err := os.CopyFS(tmp, os.DirFS(".")); err != nil {
		t.Fatal(err)
	}
	kust := filepath.Join(tmp, "examples/vllm-dp2/kustomization.yaml")
	b, err := os.ReadFile(kust)
	if err != nil {
		t.Fatal(err)
	}
	const want = "registry.test/team/kvroute:v9.9.9"
	edited := strings.Replace(string(b), "    newName: kvroute\n    newTag: v0.1.0\n", "    newName: registry.test/team/kvroute\n    newTag: v9.9.9\n", 1)
	if edited == string(b) {
		t.Fatal("examples/vllm-dp2 has no images: entry to edit")
	}
	if err := os.WriteFile(kust, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	var seen []string
	for id, v := range built(t, filepath.Join(tmp, "examples/vllm-dp2")) {
		d, ok := v.(*appsv1.Deployment)
		if !ok {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == "picker" || c.Name == "kvroute-sidecar" {
				seen = append(seen, c.Name)
				if c.Image != want {
					t.Errorf("%s: container %s runs %s, want %s", id, c.Name, c.Image, want)
				}
			}
		}
	}
	slices.Sort(seen)
	if !slices.Equal(seen, []string{"kvroute-sidecar", "picker"}) {
		t.Fatalf("kvroute containers %v", seen)
	}
}

// plumbingLabels are target labels the Operator sets that describe how a
// series was scraped, not what it is about: no alert or panel may group,
// match or name its legend by them (grouping by endpoint once gave every
// per-engine panel one series, named after the scraped port).
var plumbingLabels = []string{"endpoint", "service", "container"}

// plumbingUses lists where expr groups, matches on, or selects by a
// plumbing label.
func plumbingUses(expr parser.Expr) []string {
	var out []string
	check := func(where string, ls []string) {
		for _, l := range ls {
			if slices.Contains(plumbingLabels, l) {
				out = append(out, where+" "+l)
			}
		}
	}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.AggregateExpr:
			check("groups by", n.Grouping)
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				check("matches on", n.VectorMatching.MatchingLabels)
				check("includes", n.VectorMatching.Include)
			}
		case *parser.VectorSelector:
			if n.Name == "kube_pod_container_status_waiting_reason" {
				break // kube-state-metrics' own container label, about the container it reports on
			}
			for _, m := range n.LabelMatchers {
				check("selects by", []string{m.Name})
			}
		}
		return nil
	})
	return out
}

// TestNoPlumbingLabels: no alert and no dashboard query groups, matches or
// selects by endpoint, service or container, and no legend names them.
func TestNoPlumbingLabels(t *testing.T) {
	alerts, err := Alerts(rulePath)
	if err != nil {
		t.Fatal(err)
	}
	queries, err := DashboardQueries(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	exprs := map[string]string{} // where → expression
	for _, a := range alerts {
		exprs["alert "+a.Name] = a.Expr
		for k, v := range a.Annotations {
			for _, l := range plumbingLabels {
				if strings.Contains(v, "$labels."+l) {
					t.Errorf("alert %s: annotation %s names $labels.%s", a.Name, k, l)
				}
			}
		}
	}
	for i, q := range queries {
		exprs[fmt.Sprintf("panel %q (query %d)", q.Panel, i)] = q.Expr
	}
	p := parser.NewParser(parser.Options{})
	for where, e := range exprs {
		expr, err := p.ParseExpr(e)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if u := plumbingUses(expr); len(u) > 0 {
			t.Errorf("%s %v", where, u)
		}
	}
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range plumbingLabels {
		if strings.Contains(string(raw), "{{"+l+"}}") {
			t.Errorf("a legend names {{%s}}", l)
		}
	}
	// The rule bites: the old per-engine grouping is caught.
	old, _ := p.ParseExpr(`max by (namespace, endpoint) (kvroute_picker_endpoint_state{state="load_only"}) == 1`)
	if u := plumbingUses(old); len(u) != 1 {
		t.Errorf("grouping by endpoint not caught: %v", u)
	}
}
