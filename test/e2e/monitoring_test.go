package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/util/teststorage"

	"github.com/kvroute/kvroute/deploy"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// The monitoring tests hold the alerts and the dashboard to real
// processes: the metric names they use must be in the live /metrics of a
// picker and a sidecar, and the alerts are driven to fire by evaluating
// the PrometheusRule with Prometheus's own rule engine over samples scraped
// from a fleet in the alert's condition (and shown quiet on a healthy one).

// scrapeStep is the synthetic time between two scrapes: the fleet is
// scraped for real at each step, and the samples are stamped a step apart,
// so a condition that holds across the scrapes held for the whole span (as
// Prometheus would have seen with its default 15 s interval).
const scrapeStep = 15 * time.Second

// target is one process's /metrics, with the scrape job the Prometheus
// Operator writes for it and the target labels that job gives it.
type target struct {
	url    string // the /metrics URL
	job    deploy.ScrapeJob
	labels map[string]string
}

// operatorTargets places a picker (its admin base URL) and vLLM pods (their
// sidecars' admin base URLs, in order) in the monitoring example, and
// returns their targets as the Operator's scrape jobs label them: the
// picker's pod is kvroute-picker-0, the vLLM pods vllm-0, vllm-1, ….
func operatorTargets(t *testing.T, pickerAdmin string, sidecarAdmins ...string) []target {
	t.Helper()
	pods := []deploy.PodAt{}
	if pickerAdmin != "" {
		pods = append(pods, deploy.PodAt{Deployment: "kvroute-picker", Name: "kvroute-picker-0", IP: "10.0.0.7",
			Addresses: map[string]string{"admin": strings.TrimPrefix(pickerAdmin, "http://")}})
	}
	for i, a := range sidecarAdmins {
		pods = append(pods, deploy.PodAt{Deployment: "vllm-qwen3", Name: fmt.Sprint("vllm-", i), IP: fmt.Sprint("10.0.1.", 5+i),
			Addresses: map[string]string{"admin": strings.TrimPrefix(a, "http://")}})
	}
	scrapes, err := deploy.OperatorScrapes(filepath.Join("..", "..", "deploy", "examples", "monitoring"), pods)
	if err != nil {
		t.Fatal(err)
	}
	var out []target
	for _, s := range scrapes {
		for _, meta := range s.Targets {
			ls, keep, err := deploy.TargetLabels(s.Job, meta)
			if err != nil {
				t.Fatal(err)
			}
			if keep {
				out = append(out, target{url: "http://" + meta["__address__"] + s.Job.MetricsPath, job: s.Job, labels: ls})
			}
		}
	}
	if len(out) != len(pods) {
		t.Fatalf("%d targets for %d pods", len(out), len(pods))
	}
	return out
}

// promStore is a Prometheus TSDB (the test storage) fed from targets as
// Prometheus's scrape loop feeds it: each series with its target's labels
// (a clash renames the scraped label exported_<name>, which fails the
// test), an up sample per target, and stale markers for a target's series
// when its scrape fails.
type promStore struct {
	t       *testing.T
	st      *teststorage.TestStorage
	targets []target
	now     time.Time // the synthetic time of the last scrape
	names   map[string]bool
	last    map[string][]labels.Labels // by target URL: the series of its last good scrape
}

func newPromStore(t *testing.T, targets ...target) *promStore {
	return &promStore{t: t, st: teststorage.New(t), targets: targets, now: time.Unix(1_800_000_000, 0), names: map[string]bool{},
		last: map[string][]labels.Labels{}}
}

// scrape reads every target once and stores the samples at the next step.
func (p *promStore) scrape() time.Time {
	p.t.Helper()
	p.now = p.now.Add(scrapeStep)
	app := p.st.Appender(context.Background())
	for _, tg := range p.targets {
		up := map[string]string{"__name__": "up"}
		maps.Copy(up, tg.labels)
		p.names["up"] = true
		series, err := p.read(tg)
		if err != nil { // as Prometheus: up 0, and the target's series go stale
			for _, ls := range p.last[tg.url] {
				if _, err := app.Append(0, ls, p.now.UnixMilli(), math.Float64frombits(value.StaleNaN)); err != nil {
					p.t.Fatal(err)
				}
			}
			p.last[tg.url] = nil
			if _, err := app.Append(0, labels.FromMap(up), p.now.UnixMilli(), 0); err != nil {
				p.t.Fatal(err)
			}
			continue
		}
		var stored []labels.Labels
		for _, s := range series {
			p.names[s.name] = true
			scraped := maps.Clone(s.labels)
			scraped["__name__"] = s.name
			ls, keep, err := deploy.SeriesLabels(tg.job, tg.labels, scraped)
			if err != nil {
				p.t.Fatal(err)
			}
			if !keep {
				continue
			}
			for name := range ls {
				if strings.HasPrefix(name, model.ExportedLabelPrefix) {
					p.t.Errorf("%s: %s: a label of kvroute's clashed with a target label the Operator sets (%v)", tg.url, s.name, ls)
				}
			}
			l := labels.FromMap(ls)
			stored = append(stored, l)
			if _, err := app.Append(0, l, p.now.UnixMilli(), s.value); err != nil {
				p.t.Fatal(err)
			}
		}
		p.last[tg.url] = stored
		if _, err := app.Append(0, labels.FromMap(up), p.now.UnixMilli(), 1); err != nil {
			p.t.Fatal(err)
		}
	}
	if err := app.Commit(); err != nil {
		p.t.Fatal(err)
	}
	return p.now
}

// read scrapes one target; an error is a failed scrape.
func (p *promStore) read(tg target) ([]scraped, error) {
	resp, err := http.Get(tg.url)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		return nil, fmt.Errorf("%s: %d %v", tg.url, resp.StatusCode, err)
	}
	families, err := metrictest.Parse(strings.NewReader(string(body)))
	if err != nil {
		p.t.Fatalf("%s: %v", tg.url, err)
	}
	return flatten(families), nil
}

type scraped struct {
	name   string
	labels map[string]string
	value  float64
}

// flatten turns metric families into series as Prometheus stores them
// (a histogram as _bucket{le}, _sum and _count).
func flatten(families []*dto.MetricFamily) []scraped {
	var out []scraped
	for _, f := range families {
		name := f.GetName()
		for _, m := range f.GetMetric() {
			ls := map[string]string{}
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = l.GetValue()
			}
			with := func(k, v string) map[string]string {
				c := maps.Clone(ls)
				c[k] = v
				return c
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out = append(out, scraped{name, ls, m.GetCounter().GetValue()})
			case dto.MetricType_GAUGE:
				out = append(out, scraped{name, ls, m.GetGauge().GetValue()})
			case dto.MetricType_UNTYPED:
				out = append(out, scraped{name, ls, m.GetUntyped().GetValue()})
			case dto.MetricType_HISTOGRAM:
				h := metrictest.HistogramOf([]*dto.MetricFamily{f}, name, ls) // this series alone: all its labels
				if n := len(h.Buckets); n == 0 || !math.IsInf(h.Buckets[n-1].UpperBound, 1) {
					h.Buckets = append(h.Buckets, metrictest.Bucket{UpperBound: math.Inf(1), Count: h.Count})
				}
				for _, b := range h.Buckets {
					out = append(out, scraped{name + "_bucket", with("le", fmt.Sprint(b.UpperBound)), float64(b.Count)})
				}
				out = append(out, scraped{name + "_sum", ls, h.Sum}, scraped{name + "_count", ls, float64(h.Count)})
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				for _, q := range s.GetQuantile() {
					out = append(out, scraped{name, with("quantile", fmt.Sprint(q.GetQuantile())), q.GetValue()})
				}
				out = append(out, scraped{name + "_sum", ls, s.GetSampleSum()}, scraped{name + "_count", ls, float64(s.GetSampleCount())})
			}
		}
	}
	return out
}

// alertRules loads the PrometheusRule's alerts as Prometheus's rule engine
// runs them.
func alertRules(t *testing.T) map[string]*rules.AlertingRule {
	t.Helper()
	alerts, err := deploy.Alerts(filepath.Join("..", "..", "deploy", "components", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*rules.AlertingRule{}
	p := parser.NewParser(parser.Options{})
	for _, a := range alerts {
		expr, err := p.ParseExpr(a.Expr)
		if err != nil {
			t.Fatalf("%s: %v", a.Name, err)
		}
		out[a.Name] = rules.NewAlertingRule(a.Name, expr, a.For, 0, labels.FromMap(a.Labels), labels.FromMap(a.Annotations),
			labels.EmptyLabels(), "", false, slog.New(slog.DiscardHandler))
	}
	return out
}

// evaluate scrapes the fleet steps times and evaluates every rule after
// each scrape, as Prometheus's rule manager would; it returns the rules
// firing at the end, with their alerts' labels. before, when given, runs
// before each scrape (to keep traffic going through every step).
func evaluate(t *testing.T, p *promStore, rs map[string]*rules.AlertingRule, steps int, before ...func()) map[string][]string {
	t.Helper()
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 10_000_000, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute})
	query := rules.EngineQueryFunc(engine, p.st)
	for range steps {
		for _, f := range before {
			f()
		}
		ts := p.scrape()
		for name, r := range rs {
			if _, err := r.Eval(context.Background(), 0, ts, query, nil, 0); err != nil {
				t.Fatalf("%s at %v: %v", name, ts, err)
			}
		}
	}
	firing := map[string][]string{}
	for name, r := range rs {
		for _, a := range r.ActiveAlerts() {
			if a.State != rules.StateFiring {
				continue
			}
			firing[name] = append(firing[name], a.Labels.String())
			a.Annotations.Range(func(l labels.Label) {
				if strings.Contains(l.Value, "<error expanding template") {
					t.Errorf("%s: annotation %s: %s", name, l.Name, l.Value)
				}
			})
		}
	}
	return firing
}

// stepsFor is the number of scrapes after which a rule with hold d fires
// if its condition held throughout, with room for its range windows.
func stepsFor(d time.Duration) int { return int(math.Ceil(float64(d)/float64(scrapeStep))) + 4 }

// TestMonitoringHealthyFleet: on a healthy process fleet that served
// requests, every metric the alerts and the dashboard name is in the live
// /metrics of the picker or the sidecar, and no alert fires over six
// minutes of scrapes.
func TestMonitoringHealthyFleet(t *testing.T) {
	bin := buildKvroute(t)
	f := startHealthFleet(t, bin, 1, nil, nil)
	l := startLoad(t, f.picker, 2, false)
	testnet.Await(t, 20*time.Second, 20*time.Millisecond, func() error {
		if n := f.metric(t, "kvroute_picker_outcomes_total", map[string]string{"outcome": "as_predicted"}); n < 5 {
			return fmt.Errorf("%v requests as predicted", n)
		}
		return nil
	})
	l.end()
	if len(l.failures) > 0 {
		t.Fatalf("load failures: %v", l.failures)
	}
	p := newPromStore(t, operatorTargets(t, f.admin, sidecarDebug(t, f.admin))...)
	rs := alertRules(t)
	if firing := evaluate(t, p, rs, stepsFor(6*time.Minute)); len(firing) > 0 {
		t.Fatalf("alerts firing on a healthy fleet: %v", firing)
	}
	used := map[string][]string{} // metric → where it is used
	pp := parser.NewParser(parser.Options{})
	for name, r := range rs {
		for _, m := range deploy.MetricNames(r.Query()) {
			used[m] = append(used[m], "alert "+name)
		}
	}
	queries, err := deploy.DashboardQueries(filepath.Join("..", "..", "deploy", "monitoring", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		expr, err := pp.ParseExpr(q.Expr)
		if err != nil {
			t.Fatalf("dashboard panel %q: %v", q.Panel, err)
		}
		for _, m := range deploy.MetricNames(expr) {
			used[m] = append(used[m], "panel "+q.Panel)
		}
	}
	if len(used) < 20 {
		t.Fatalf("only %d metrics used: %v", len(used), slices.Sorted(maps.Keys(used)))
	}
	for _, m := range slices.Sorted(maps.Keys(used)) {
		if !p.names[m] && !slices.Contains(deploy.ExternalMetrics, m) {
			t.Errorf("%s (used by %v) is in neither the picker's nor the sidecar's /metrics", m, used[m])
		}
	}
}

// sidecarDebug returns the debug URL of the first endpoint's sidecar, as
// the picker (its admin surface at admin) lists it.
func sidecarDebug(t *testing.T, admin string) string {
	t.Helper()
	dbg, err := debugEndpoints(admin)
	if err != nil || len(dbg.Endpoints) == 0 || dbg.Endpoints[0].SidecarDebug == "" {
		t.Fatalf("the picker's endpoints: %+v %v", dbg, err)
	}
	return dbg.Endpoints[0].SidecarDebug
}

// sidecarAdmins returns each engine's sidecar admin base URL, in the order
// of f.urls, as the picker lists them on /debug/endpoints.
func (f *healthFleet) sidecarAdmins(t *testing.T) []string {
	t.Helper()
	dbg, err := debugEndpoints(f.admin)
	if err != nil {
		t.Fatal(err)
	}
	byEngine := map[string]string{}
	for _, e := range dbg.Endpoints {
		byEngine[e.Endpoint] = e.SidecarDebug
	}
	var out []string
	for _, u := range f.urls {
		if byEngine[u] == "" {
			t.Fatalf("no sidecar admin URL for %s: %+v", u, dbg)
		}
		out = append(out, byEngine[u])
	}
	return out
}

// TestAlertPickerNoEndpoints: a picker started with default flags and no
// sidecar to find fires KvroutePickerNoEndpoints after its minute, and
// nothing else.
func TestAlertPickerNoEndpoints(t *testing.T) {
	bin := buildKvroute(t)
	api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	run(t, bin, "picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--gossip-bind", "127.0.0.1:0", "--log-level", "warn")
	testnet.Await(t, 20*time.Second, 20*time.Millisecond, func() error {
		_, err := http.Get("http://" + admin + "/metrics")
		return err
	})
	p := newPromStore(t, operatorTargets(t, "http://"+admin)...)
	rs := alertRules(t)
	firing := evaluate(t, p, rs, stepsFor(time.Minute))
	if len(firing["KvroutePickerNoEndpoints"]) != 1 || len(firing) != 1 {
		t.Fatalf("firing %v, want KvroutePickerNoEndpoints alone", firing)
	}
	if !strings.Contains(firing["KvroutePickerNoEndpoints"][0], `pod="kvroute-picker-0"`) {
		t.Fatalf("alert labels %v", firing["KvroutePickerNoEndpoints"])
	}
}

// TestAlertSilentStream: the newcomer's mistake — an engine whose event
// endpoint names a host (so it connects) and a sidecar in its default
// connect mode — gives a silent stream: KvrouteEventStreamSilent fires
// after its two minutes, and the picker following that sidecar routes the
// endpoint by load only, so KvrouteEndpointLoadOnly fires after its five.
func TestAlertSilentStream(t *testing.T) {
	bin := buildKvroute(t)
	pod := startStreamPod(t, bin, "connect", false)
	api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	run(t, bin, "picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--gossip-bind", "", "--sidecars", pod.grpc,
		"--capacity", "4096", "--log-level", "warn")
	pod.request(t, 160, 5000) // new blocks, and no live batch
	testnet.Await(t, 20*time.Second, 20*time.Millisecond, func() error {
		st, err := pod.state()
		if err != nil {
			return err
		}
		if st.StreamState != "silent" {
			return fmt.Errorf("stream %s", st.StreamState)
		}
		dbg, err := debugEndpoints("http://" + admin)
		if err != nil {
			return err
		}
		if len(dbg.Endpoints) != 1 || dbg.Endpoints[0].State != "load_only" {
			return fmt.Errorf("picker endpoints %+v", dbg.Endpoints)
		}
		return nil
	})
	p := newPromStore(t, operatorTargets(t, "http://"+admin, pod.debug)...)
	rs := alertRules(t)
	silent := map[string]*rules.AlertingRule{"KvrouteEventStreamSilent": rs["KvrouteEventStreamSilent"]}
	if firing := evaluate(t, p, silent, stepsFor(2*time.Minute)); len(firing["KvrouteEventStreamSilent"]) != 1 ||
		!strings.Contains(firing["KvrouteEventStreamSilent"][0], `engine="`+pod.engine+`"`) {
		t.Fatalf("after two minutes silent: firing %v", firing)
	}
	firing := evaluate(t, p, rs, stepsFor(5*time.Minute))
	for _, want := range []string{"KvrouteEventStreamSilent", "KvrouteEndpointLoadOnly"} {
		if len(firing[want]) != 1 {
			t.Errorf("%s: firing %v", want, firing[want])
		}
	}
	if len(firing) != 2 {
		t.Errorf("firing %v, want the silent stream and the load-only endpoint alone", firing)
	}
}

// TestAlertReplayFailures: an engine losing half its live event batches,
// and a sidecar whose --replay names a port nothing answers on: each gap's
// replay fails, and KvrouteSidecarReplayFailures fires at the first scrape
// after a failure (the counter exists at 0 from the start, so even the
// first failure is an increase).
func TestAlertReplayFailures(t *testing.T) {
	bin := buildKvroute(t)
	dead := fmt.Sprintf("tcp://127.0.0.1:%d", testnet.FreePort(t))
	f := startHealthFleet(t, bin, 1, []string{"--sim-drop-events-pct", "50"}, []string{"--replay", dead, "--replay-timeout", "200ms"})
	p := newPromStore(t, operatorTargets(t, f.admin, sidecarDebug(t, f.admin))...)
	rs := alertRules(t)
	replay := map[string]*rules.AlertingRule{"KvrouteSidecarReplayFailures": rs["KvrouteSidecarReplayFailures"]}
	// The sidecar's idle catch-ups may have failed already (they ask the
	// same dead port): a scrape takes the baseline, and the alert must see
	// a failure after it (the healthy-fleet test shows it quiet).
	sidecar := sidecarDebug(t, f.admin)
	evaluate(t, p, replay, 1)
	base := metrictest.Scraped(t, sidecar+"/metrics", "kvroute_sidecar_replays_total", map[string]string{"outcome": "failed"}) // ≥ what the scrape saw
	l := startLoad(t, f.picker, 2, true)
	defer l.end()
	testnet.Await(t, 30*time.Second, 50*time.Millisecond, func() error {
		if n := metrictest.Scraped(t, sidecar+"/metrics", "kvroute_sidecar_replays_total", map[string]string{"outcome": "failed"}); n <= base {
			return fmt.Errorf("%v failed replays, %v before the load", n, base)
		}
		return nil
	})
	firing := evaluate(t, p, replay, 1)
	if len(firing["KvrouteSidecarReplayFailures"]) != 1 || !strings.Contains(firing["KvrouteSidecarReplayFailures"][0], `engine="`+f.urls[0]+`"`) {
		t.Fatalf("after a failed replay: firing %v", firing)
	}
}

// TestAlertPredictionAgreement: an engine whose KV events reach the
// sidecar 1.5 s late, and every prompt sent twice in a row: the second
// finds the blocks the picker does not know of yet
// (more_cached_than_predicted), so half the predictions miss and
// KvroutePredictionAgreementLow fires after its 15 minutes of traffic.
func TestAlertPredictionAgreement(t *testing.T) {
	bin := buildKvroute(t)
	f := startHealthFleet(t, bin, 1, []string{"--sim-delay-events", "1500ms"}, nil)
	p := newPromStore(t, operatorTargets(t, f.admin)...)
	rs := alertRules(t)
	agreement := map[string]*rules.AlertingRule{"KvroutePredictionAgreementLow": rs["KvroutePredictionAgreementLow"]}
	pair := 0
	twice := func() { // a new prompt, twice: as_predicted, then more_cached_than_predicted
		pair++
		body, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "max_tokens": 1, "cache_salt": fmt.Sprint("pair-", pair),
			"prompt": strings.Repeat("A prompt whose blocks reach the picker late. ", 8)})
		for range 2 {
			postOK(t, f.picker+"/v1/completions", body)
		}
	}
	// Two pairs each scrape step: 16 requests a synthetic minute, half of
	// them mispredicted. The condition holds once the window has 50 (13
	// steps); then the hold of 15 minutes.
	steps := 13 + stepsFor(15*time.Minute)
	firing := evaluate(t, p, agreement, steps, twice, twice)
	if len(firing["KvroutePredictionAgreementLow"]) != 1 {
		t.Fatalf("firing %v; outcomes: as predicted %v, more cached %v", firing,
			f.metric(t, "kvroute_picker_outcomes_total", map[string]string{"outcome": "as_predicted"}),
			f.metric(t, "kvroute_picker_outcomes_total", map[string]string{"outcome": "more_cached_than_predicted"}))
	}
}

// TestAlertGossipFlapping: a gossip member that keeps coming and going — a
// second picker started and stopped between scrapes, eight membership
// changes in all — changes the first picker's member count at each; with
// the changes inside the 15-minute window for five more minutes,
// KvrouteGossipFlapping fires for the picker that saw them.
func TestAlertGossipFlapping(t *testing.T) {
	bin := buildKvroute(t)
	seed := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	run(t, bin, "picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--gossip-bind", seed, "--gossip-ports", "1", "--log-level", "warn")
	members := func(want float64) error {
		fams, err := metrictest.Fetch("http://" + admin + "/metrics")
		if err != nil {
			return err
		}
		if n := metrictest.Sum(fams, "kvroute_gossip_members", nil); n != want {
			return fmt.Errorf("%v gossip members, want %v", n, want)
		}
		return nil
	}
	testnet.Await(t, 20*time.Second, 20*time.Millisecond, func() error { return members(1) })
	p := newPromStore(t, operatorTargets(t, "http://"+admin)...)
	rs := alertRules(t)
	flapping := map[string]*rules.AlertingRule{"KvrouteGossipFlapping": rs["KvrouteGossipFlapping"]}
	if firing := evaluate(t, p, flapping, 2); len(firing) > 0 {
		t.Fatalf("firing with a steady membership: %v", firing)
	}
	other := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	var second *exec.Cmd
	for i := range 8 {
		if i%2 == 0 { // join
			second = exec.Command(bin, "picker", "--listen", other, "--admin-listen", "127.0.0.1:0", "--grpc-listen", "", "--gossip-bind", "127.0.0.1:0",
				"--join", seed, "--node-name", fmt.Sprint("flapping-picker-", i), "--drain-delay", "0", "--log-level", "warn")
			startProcess(t, second, syscall.SIGTERM, func(out string) { t.Logf("second picker output:\n%s", out) })
		} else { // leave
			if err := second.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			_ = second.Wait()
		}
		want := float64(2 - i%2)
		testnet.Await(t, 20*time.Second, 20*time.Millisecond, func() error {
			if err := members(want); err != nil {
				return fmt.Errorf("flap %d: %w", i+1, err)
			}
			return nil
		})
		evaluate(t, p, flapping, 1)
	}
	firing := evaluate(t, p, flapping, stepsFor(5*time.Minute))
	if len(firing["KvrouteGossipFlapping"]) != 1 || !strings.Contains(firing["KvrouteGossipFlapping"][0], `pod="kvroute-picker-0"`) {
		t.Fatalf("after eight membership changes: firing %v", firing)
	}
}

// TestAlertsForSilence: a fleet that stops answering Prometheus. The
// sidecar SIGKILLed: its target is down, and KvrouteSidecarTargetDown fires
// for its pod once five minutes have passed, not before. Then the picker
// SIGKILLed: its target is down and its series go stale, so
// KvroutePickerTargetDown fires for its pod and KvroutePickersAbsent fires
// twice (no picker anywhere; none in namespace llm, whose other sidecar
// still reports) after their two minutes, not before.
func TestAlertsForSilence(t *testing.T) {
	t.Parallel() // its own processes and ports; synthetic time
	bin := buildKvroute(t)
	f := startHealthFleet(t, bin, 2, nil, nil)
	p := newPromStore(t, operatorTargets(t, f.admin, f.sidecarAdmins(t)...)...)
	rs := alertRules(t)
	silence := map[string]*rules.AlertingRule{}
	for _, name := range []string{"KvrouteSidecarTargetDown", "KvroutePickerTargetDown", "KvroutePickersAbsent"} {
		if rs[name] == nil {
			t.Fatalf("the PrometheusRule has no alert %s", name)
		}
		silence[name] = rs[name]
	}
	if firing := evaluate(t, p, silence, 3); len(firing) > 0 {
		t.Fatalf("firing on a fleet that answers: %v", firing)
	}
	if err := f.sidecars[1].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if firing := evaluate(t, p, silence, int(5*time.Minute/scrapeStep)-1); len(firing) > 0 {
		t.Fatalf("firing within the sidecar-target alert's hold: %v", firing)
	}
	firing := evaluate(t, p, silence, 2)
	if len(firing) != 1 || len(firing["KvrouteSidecarTargetDown"]) != 1 || !strings.Contains(firing["KvrouteSidecarTargetDown"][0], `pod="vllm-1"`) {
		t.Fatalf("five minutes after the sidecar died: firing %v, want KvrouteSidecarTargetDown for vllm-1", firing)
	}
	if err := f.pickerP.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if firing := evaluate(t, p, silence, int(2*time.Minute/scrapeStep)-1); len(firing) != 1 {
		t.Fatalf("within the picker alerts' hold: firing %v, want the sidecar's alone", firing)
	}
	firing = evaluate(t, p, silence, 2)
	if len(firing["KvroutePickerTargetDown"]) != 1 || !strings.Contains(firing["KvroutePickerTargetDown"][0], `pod="kvroute-picker-0"`) {
		t.Errorf("two minutes after the picker died: KvroutePickerTargetDown %v", firing["KvroutePickerTargetDown"])
	}
	// Fleet-wide (no picker series at all) and for namespace llm, where
	// sidecar vllm-0 still reports.
	if a := firing["KvroutePickersAbsent"]; len(a) != 2 || !slices.ContainsFunc(a, func(s string) bool { return strings.Contains(s, `namespace="llm"`) }) {
		t.Errorf("two minutes after the picker died: KvroutePickersAbsent %v", a)
	}
}
