package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/deploy"
	"github.com/kvroute/kvroute/test/testnet"
)

// The tests here run a real Prometheus server (Debian's prometheus, which
// make deps installs) on loopback, scraping real picker and sidecar
// processes with the scrape jobs the Prometheus Operator writes for
// kvroute's ServiceMonitors (deploy.OperatorScrapes: its relabelings, so
// its target labels, endpoint="admin" among them, and honor_labels off),
// and the rules loaded from the PrometheusRule. Two settings differ from a
// cluster, for time: the scrape and evaluation interval is 1 s (the
// ServiceMonitors say 15 s), and the targets come from a file carrying the
// meta labels Kubernetes discovery would give them instead of from the
// Kubernetes API.

// promServer is a Prometheus server started for a test.
type promServer struct {
	t    *testing.T
	base string // http://127.0.0.1:port
	dir  string
}

// prometheusBinary finds Prometheus's server.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"prometheus", "/usr/bin/prometheus"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatal("prometheus not found: run make deps (it installs Debian's prometheus package)")
	return ""
}

// startPrometheus writes a configuration scraping every job of scrapes
// (targets in a file per job, kept while the test rewrites them) and
// loading the rule file, starts Prometheus on a free loopback port and
// waits for it to be ready.
func startPrometheus(t *testing.T, scrapes []deploy.Scrape, ruleFile string) *promServer {
	t.Helper()
	p := &promServer{t: t, dir: t.TempDir()}
	var jobs []map[string]any
	for i, s := range scrapes {
		raw, err := json.Marshal(s.Job)
		if err != nil {
			t.Fatal(err)
		}
		var job map[string]any
		if err := json.Unmarshal(raw, &job); err != nil {
			t.Fatal(err)
		}
		job["scrape_interval"], job["scrape_timeout"] = "1s", "1s"
		file := filepath.Join(p.dir, fmt.Sprintf("targets-%d.json", i))
		p.writeTargets(file, s.Targets)
		job["file_sd_configs"] = []any{map[string]any{"files": []string{file}, "refresh_interval": "1s"}}
		jobs = append(jobs, job)
	}
	rules, err := filepath.Abs(ruleFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := yaml.Marshal(map[string]any{
		"global":         map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"rule_files":     []string{rules},
		"scrape_configs": jobs,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(p.dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	p.base = "http://" + addr
	cmd := exec.Command(prometheusBinary(t), "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(p.dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	startProcess(t, cmd, syscall.SIGTERM, func(out string) { t.Logf("prometheus output:\n%s\nconfiguration:\n%s", out, cfg) })
	testnet.Await(t, 30*time.Second, 100*time.Millisecond, func() error {
		resp, err := http.Get(p.base + "/-/ready")
		if err != nil {
			return fmt.Errorf("prometheus not ready: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("prometheus not ready: /-/ready: %d", resp.StatusCode)
		}
		return nil
	})
	return p
}

// writeTargets writes targets (meta labels with __address__) as a file
// service discovery file.
func (p *promServer) writeTargets(file string, targets []map[string]string) {
	p.t.Helper()
	groups := []map[string]any{}
	for _, tg := range targets {
		ls := maps.Clone(tg)
		addr := ls["__address__"]
		delete(ls, "__address__")
		groups = append(groups, map[string]any{"targets": []string{addr}, "labels": ls})
	}
	raw, err := json.Marshal(groups)
	if err != nil {
		p.t.Fatal(err)
	}
	// Written whole, then renamed: discovery never reads half a file.
	if err := os.WriteFile(file+".tmp", raw, 0o644); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		p.t.Fatal(err)
	}
}

// api GETs a Prometheus HTTP API path and decodes its data.
func (p *promServer) api(path string, q url.Values, data any) error {
	resp, err := http.Get(p.base + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status, Error string
		Data          json.RawMessage
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %d: %v", path, resp.StatusCode, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s %v: %s", path, q, body.Error)
	}
	return json.Unmarshal(body.Data, data)
}

// query runs an instant PromQL query and returns its series' labels (the
// metric name under __name__ when kept).
func (p *promServer) query(expr string) ([]map[string]string, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: a %s, want a vector", expr, data.ResultType)
	}
	var out []map[string]string
	for _, r := range data.Result {
		out = append(out, r.Metric)
	}
	return out, nil
}

// await polls query until check accepts its result (bounded), and
// returns the last result.
func (p *promServer) await(what, expr string, within time.Duration, check func([]map[string]string) error) []map[string]string {
	p.t.Helper()
	var last []map[string]string
	testnet.Await(p.t, within, 250*time.Millisecond, func() error {
		r, err := p.query(expr)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", what, expr, err)
		}
		last = r
		if err := check(r); err != nil {
			return fmt.Errorf("%s: %s: %w (last result %v)", what, expr, err, r)
		}
		return nil
	})
	return last
}

// promTarget is an active target as Prometheus's targets API lists it.
type promTarget struct {
	Labels    map[string]string `json:"labels"`
	ScrapeURL string            `json:"scrapeUrl"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
}

func (p *promServer) targets() ([]promTarget, int, error) {
	var data struct {
		Active  []promTarget `json:"activeTargets"`
		Dropped []any        `json:"droppedTargets"`
	}
	err := p.api("/api/v1/targets", url.Values{}, &data)
	return data.Active, len(data.Dropped), err
}

// alertExpr returns the expression of the PrometheusRule's alert name.
func alertExpr(t *testing.T, name string) string {
	t.Helper()
	alerts, err := deploy.Alerts(filepath.Join("..", "..", "deploy", "components", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		if a.Name == name {
			return a.Expr
		}
	}
	t.Fatalf("no alert %s", name)
	return ""
}

// oneSeries accepts a result of exactly one series with label = value.
func oneSeries(label, value string) func([]map[string]string) error {
	return func(r []map[string]string) error {
		if len(r) != 1 || r[0][label] != value {
			return fmt.Errorf("want one series with %s=%q", label, value)
		}
		return nil
	}
}

// promFleet is a process fleet (two engines, their sidecars, a picker)
// placed as pods of the monitoring example: its picker and vLLM pods, with
// the processes' real addresses behind the Services' admin ports.
type promFleet struct {
	*healthFleet
	pickerPod string
	vllmPods  []string          // by engine, as f.urls
	sidecars  map[string]string // engine URL → its sidecar's admin base URL
}

func startPromFleet(t *testing.T, bin string) (*promFleet, []deploy.Scrape) {
	t.Helper()
	f := &promFleet{healthFleet: startHealthFleet(t, bin, 2, nil, nil), pickerPod: "kvroute-picker-6c9d8f7b5-x2k4q", sidecars: map[string]string{}}
	admins := f.sidecarAdmins(t)
	pods := []deploy.PodAt{{Deployment: "kvroute-picker", Name: f.pickerPod, IP: "10.0.0.7",
		Addresses: map[string]string{"admin": strings.TrimPrefix(f.admin, "http://")}}}
	for i, u := range f.urls {
		f.sidecars[u] = admins[i]
		pod := fmt.Sprintf("vllm-qwen3-5b7c9d6f4-%d", i)
		f.vllmPods = append(f.vllmPods, pod)
		pods = append(pods, deploy.PodAt{Deployment: "vllm-qwen3", Name: pod, IP: fmt.Sprintf("10.0.1.%d", 5+i),
			Addresses: map[string]string{"admin": strings.TrimPrefix(f.sidecars[u], "http://")}})
	}
	scrapes, err := deploy.OperatorScrapes(filepath.Join("..", "..", "deploy", "examples", "monitoring"), pods)
	if err != nil {
		t.Fatal(err)
	}
	return f, scrapes
}

// TestPrometheusScrapesFleet: a real Prometheus scrapes a picker and two
// sidecars as the Operator would. Every target is up with exactly the
// Operator's target labels; no kvroute label clashes with one (no
// exported_ label); the rules load and evaluate, and none is pending or
// firing; every dashboard query
// runs, every panel has data on this healthy fleet, and each per-engine
// query gives one series per engine; the README's list of per-engine
// metrics is true. Then a sidecar is killed: the load-only alert's
// expression names its engine (and the alert is pending for it), and the
// sidecar-target alert's names its pod. Then the picker is killed: the
// picker-target and pickers-absent alerts' expressions fire.
func TestPrometheusScrapesFleet(t *testing.T) {
	t.Parallel() // its own processes and ports; bounded polls only
	bin := buildKvroute(t)
	f, scrapes := startPromFleet(t, bin)
	l := startLoad(t, f.picker, 2, true)
	p := startPrometheus(t, scrapes, filepath.Join("..", "..", "deploy", "monitoring", "kvroute-rules.yaml"))

	checkTargets(t, p, f)
	oneResult := func(r []map[string]string) error {
		if len(r) != 1 {
			return fmt.Errorf("no result yet")
		}
		return nil
	}
	p.await("the picker served requests", `sum(kvroute_picker_requests_total{code="200"})`, 30*time.Second, oneResult)
	p.await("both engines picked", `count(kvroute_picker_selected_total > 0) == 2`, 30*time.Second, oneResult)
	checkNoClash(t, p)
	checkRulesLoaded(t, p)
	checkQuiet(t, p)
	checkDashboard(t, p, f)
	checkEngineLabelDoc(t, p)
	l.end()
	if len(l.failures) > 0 {
		t.Fatalf("load failures: %v", l.failures[:min(5, len(l.failures))])
	}

	// A sidecar killed: its target goes down, and the picker routes its
	// engine by load only until its grace period ends.
	victim := 1
	if err := f.healthFleet.sidecars[victim].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.await("the sidecar-target alert names the killed sidecar's pod", alertExpr(t, "KvrouteSidecarTargetDown"), 30*time.Second,
		oneSeries("pod", f.vllmPods[victim]))
	p.await("the load-only alert names the killed sidecar's engine", alertExpr(t, "KvrouteEndpointLoadOnly"), 30*time.Second,
		oneSeries("engine", f.urls[victim]))
	awaitAlert(t, p, "KvrouteEndpointLoadOnly", "engine", f.urls[victim])
	awaitAlert(t, p, "KvrouteSidecarTargetDown", "pod", f.vllmPods[victim])

	// The picker killed: its target goes down and no picker reports.
	if err := f.pickerP.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.await("the picker-target alert names the picker's pod", alertExpr(t, "KvroutePickerTargetDown"), 30*time.Second,
		oneSeries("pod", f.pickerPod))
	p.await("the pickers-absent alert", alertExpr(t, "KvroutePickersAbsent"), 30*time.Second, func(r []map[string]string) error {
		var ns []string
		for _, s := range r {
			ns = append(ns, s["namespace"])
		}
		slices.Sort(ns)
		if !slices.Equal(ns, []string{"", "llm"}) { // no picker anywhere; none in llm, where a sidecar reports
			return fmt.Errorf("namespaces %q", ns)
		}
		return nil
	})
	awaitAlert(t, p, "KvroutePickersAbsent", "namespace", "llm")
}

// checkTargets: the picker's and each sidecar's admin port are up, with
// exactly the target labels the Operator sets, and the sidecars' gRPC
// port is dropped by the relabelings.
func checkTargets(t *testing.T, p *promServer, f *promFleet) {
	t.Helper()
	want := map[string]map[string]string{ // by pod
		f.pickerPod: {"namespace": "llm", "service": "kvroute-picker-admin", "pod": f.pickerPod, "container": "picker",
			"endpoint": "admin", "job": "kvroute-picker-admin", "instance": strings.TrimPrefix(f.admin, "http://")},
	}
	for i, u := range f.urls {
		want[f.vllmPods[i]] = map[string]string{"namespace": "llm", "service": "kvroute-sidecars", "pod": f.vllmPods[i],
			"container": "kvroute-sidecar", "endpoint": "admin", "job": "kvroute-sidecars", "instance": strings.TrimPrefix(f.sidecars[u], "http://")}
	}
	var active []promTarget
	dropped := 0
	testnet.Await(t, 30*time.Second, 250*time.Millisecond, func() error {
		var err error
		if active, dropped, err = p.targets(); err != nil {
			return err
		}
		if len(active) != len(want) {
			return fmt.Errorf("targets: %d active, want %d (%+v)", len(active), len(want), active)
		}
		for _, tg := range active {
			if tg.Health != "up" {
				return fmt.Errorf("targets: %s: %s %s", tg.ScrapeURL, tg.Health, tg.LastError)
			}
		}
		return nil
	})
	for _, tg := range active {
		if w := want[tg.Labels["pod"]]; !maps.Equal(tg.Labels, w) {
			t.Errorf("target %s: labels %v, want %v", tg.ScrapeURL, tg.Labels, w)
		}
	}
	if dropped != len(f.urls) {
		t.Errorf("%d dropped targets, want %d (the sidecars' grpc port)", dropped, len(f.urls))
	}
}

// checkNoClash: no label of any stored series is an exported_ one — none
// of kvroute's labels clashed with a target label.
func checkNoClash(t *testing.T, p *promServer) {
	t.Helper()
	var names []string
	if err := p.api("/api/v1/labels", url.Values{}, &names); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "exported_") {
			r, _ := p.query(`count by (__name__) ({` + n + `!=""})`)
			t.Errorf("label %s: a scraped label clashed with a target label, in %v", n, r)
		}
	}
	if !slices.Contains(names, "engine") {
		t.Errorf("no series with the label engine: %v", names)
	}
}

// checkRulesLoaded: every alert of the PrometheusRule is loaded, and each
// has been evaluated without error.
func checkRulesLoaded(t *testing.T, p *promServer) {
	t.Helper()
	alerts, err := deploy.Alerts(filepath.Join("..", "..", "deploy", "components", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, 20*time.Second, 250*time.Millisecond, func() error {
		rules, err := p.rules()
		if err != nil {
			return err
		}
		var loaded []string
		for _, r := range rules {
			if r.Health != "ok" || r.LastEvaluation.IsZero() {
				return fmt.Errorf("rules: %s: health %q %s, evaluated %v", r.Name, r.Health, r.LastError, r.LastEvaluation)
			}
			loaded = append(loaded, r.Name)
		}
		for _, a := range alerts {
			if !slices.Contains(loaded, a.Name) {
				return fmt.Errorf("rules: %s not loaded (have %v)", a.Name, loaded)
			}
		}
		return nil
	})
}

// promRule is a rule as Prometheus's rules API lists it.
type promRule struct {
	Name           string    `json:"name"`
	Health         string    `json:"health"`
	LastError      string    `json:"lastError"`
	LastEvaluation time.Time `json:"lastEvaluation"`
}

// rules lists every loaded rule, all groups together.
func (p *promServer) rules() ([]promRule, error) {
	var data struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.api("/api/v1/rules", url.Values{}, &data); err != nil {
		return nil, err
	}
	var out []promRule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// checkDashboard: every dashboard query runs, every panel has data on a
// healthy fleet under load, and a query grouped by engine gives one series
// per engine.
func checkDashboard(t *testing.T, p *promServer, f *promFleet) {
	t.Helper()
	queries, err := deploy.DashboardQueries(filepath.Join("..", "..", "deploy", "monitoring", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	engines := slices.Sorted(slices.Values(f.urls))
	pp := parser.NewParser(parser.Options{})
	var empty []string
	testnet.Await(t, 30*time.Second, time.Second, func() error {
		empty = nil
		withData := map[string]bool{}
		for _, q := range queries {
			r, err := p.query(q.Expr)
			if err != nil {
				t.Fatalf("panel %q: %v", q.Panel, err)
			}
			if len(r) > 0 {
				withData[q.Panel] = true
			}
			expr, err := pp.ParseExpr(q.Expr)
			if err != nil {
				t.Fatalf("panel %q: %v", q.Panel, err)
			}
			if groupedBy(expr, "engine") {
				var got []string
				for _, s := range r {
					got = append(got, s["engine"])
				}
				slices.Sort(got)
				if !slices.Equal(got, engines) {
					return fmt.Errorf("dashboard: panel %q: %s: engines %q, want one series for each of %q", q.Panel, q.Expr, got, engines)
				}
			}
		}
		for _, q := range queries {
			if !withData[q.Panel] && !slices.Contains(empty, q.Panel) {
				empty = append(empty, q.Panel)
			}
		}
		if len(empty) > 0 {
			return fmt.Errorf("dashboard: %d panels with no data: %q", len(empty), empty)
		}
		return nil
	})
}

// groupedBy reports whether expr's outermost aggregation groups by label.
func groupedBy(expr parser.Expr, label string) bool {
	found := false
	parser.Inspect(expr, func(n parser.Node, path []parser.Node) error {
		if a, ok := n.(*parser.AggregateExpr); ok && !found {
			found = !a.Without && slices.Contains(a.Grouping, label)
			return fmt.Errorf("stop") // the outermost one only
		}
		return nil
	})
	return found
}

// checkEngineLabelDoc: deploy/monitoring/README.md's table of per-engine
// metrics lists every live metric that carries the engine label, and each
// metric it lists that is live carries it.
func checkEngineLabelDoc(t *testing.T, p *promServer) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "monitoring", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Labels\n")
	if !ok {
		t.Fatal("deploy/monitoring/README.md has no Labels section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	documented := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.Contains(cells[2], "`engine`") {
			for _, m := range regexp.MustCompile("`(kvroute_[a-z_]+)`").FindAllStringSubmatch(cells[1], -1) {
				documented[m[1]] = true
			}
		}
	}
	if len(documented) < 20 {
		t.Fatalf("the Labels table lists %d per-engine metrics: %v", len(documented), documented)
	}
	family := func(name string) string {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && documented[base] {
				return base
			}
		}
		return name
	}
	withEngine, err := p.query(`count by (__name__) ({__name__=~"kvroute_.+", engine!=""})`)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range withEngine {
		if !documented[family(s["__name__"])] {
			t.Errorf("%s carries engine; deploy/monitoring/README.md's Labels table does not list it", s["__name__"])
		}
	}
	without, err := p.query(`count by (__name__) ({__name__=~"kvroute_.+", engine=""})`)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range without {
		if documented[family(s["__name__"])] {
			t.Errorf("%s is listed as per-engine, but has a series without engine", s["__name__"])
		}
	}
}

// promAlert is an alert as Prometheus's alerts API lists it.
type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// alerts lists the alerts the rule manager holds (pending or firing).
func (p *promServer) alerts() ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := p.api("/api/v1/alerts", url.Values{}, &data)
	return data.Alerts, err
}

// checkQuiet: on the healthy fleet no alert is pending or firing, once
// the rules have been evaluated over the first scrapes (an evaluation
// before Prometheus first scraped the picker sees no picker, and holds
// KvroutePickersAbsent pending until the next one), and none is at any
// poll until every rule has been evaluated five more times (1 s apart):
// an alert that comes and goes on a healthy fleet is caught too.
func checkQuiet(t *testing.T, p *promServer) {
	t.Helper()
	var held []promAlert
	quiet := func() error {
		var err error
		if held, err = p.alerts(); err != nil {
			return err
		}
		if len(held) > 0 {
			return fmt.Errorf("%d alerts held", len(held))
		}
		return nil
	}
	testnet.Await(t, 10*time.Second, 250*time.Millisecond, func() error {
		if err := quiet(); err != nil {
			return fmt.Errorf("alerts on a healthy fleet: %w: %+v", err, held)
		}
		return nil
	})
	since := time.Now().Add(5 * time.Second) // five evaluation intervals from here
	var loud error
	testnet.Await(t, 20*time.Second, 250*time.Millisecond, func() error {
		if loud = quiet(); loud != nil {
			return nil // stop polling: the failure is reported below
		}
		rules, err := p.rules()
		if err != nil {
			return err
		}
		for _, r := range rules {
			if r.LastEvaluation.Before(since) {
				return fmt.Errorf("the rules were not evaluated five more times: %s last evaluated %v, before %v", r.Name, r.LastEvaluation, since)
			}
		}
		return nil
	})
	if loud != nil {
		t.Fatalf("alerts on a healthy fleet, after a quiet evaluation: %v: %+v", loud, held)
	}
}

// awaitAlert waits until Prometheus's rule manager holds an alert name
// (pending or firing) with label = value.
func awaitAlert(t *testing.T, p *promServer, name, label, value string) {
	t.Helper()
	testnet.Await(t, 30*time.Second, 250*time.Millisecond, func() error {
		alerts, err := p.alerts()
		if err != nil {
			return err
		}
		for _, a := range alerts {
			if a.Labels["alertname"] == name && a.Labels[label] == value && (a.State == "pending" || a.State == "firing") {
				return nil
			}
		}
		return fmt.Errorf("no %s alert with %s=%q; alerts %+v", name, label, value, alerts)
	})
}
