package collect

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/deploy/monitoring"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/verify"
)

// metricsPage is a /metrics page in Prometheus's text format serving
// names, each as a histogram's bucket or a labelled sample as they would
// appear, with HELP and TYPE lines.
func metricsPage(names []string) string {
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "# HELP %s Something.\n# TYPE %s counter\n", n, n)
		if strings.HasSuffix(n, "_bucket") {
			fmt.Fprintf(&b, "%s{engine=\"http://10.0.0.1:8000\",le=\"+Inf\"} 3\n", n)
			continue
		}
		fmt.Fprintf(&b, "%s{reason=\"x y\"} 1\n%s 2\n", n, n)
	}
	return b.String()
}

// TestMetricsServed: verify reads each admin port's /metrics and fails a
// port whose page lacks a series the dashboard reads, naming it, and a
// port that does not serve /metrics; a page with every series passes.
func TestMetricsServed(t *testing.T) {
	want, err := monitoring.Series()
	if err != nil {
		t.Fatal(err)
	}
	serve := func(page string, status int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" || status != http.StatusOK {
				http.Error(w, "no", http.StatusNotFound)
				return
			}
			fmt.Fprint(w, page)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	picker := serve(metricsPage(want[monitoring.Picker]), http.StatusOK)
	lacking := want[monitoring.Sidecar][0]
	sidecarLacking := serve(metricsPage(want[monitoring.Sidecar][1:]), http.StatusOK)
	sidecarNone := serve("", http.StatusNotFound)
	sidecarOK := serve(metricsPage(want[monitoring.Sidecar]), http.StatusOK)
	// A sidecar that gossips must serve gossip's series too.
	gossiping := serve(metricsPage(append([]string{"kvroute_gossip_node_info"}, want[monitoring.Sidecar]...)), http.StatusOK)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()

	cfg := DefaultConfig()
	cfg.Picker, cfg.Admin, cfg.Timeout = "http://127.0.0.1:1", picker, 5*time.Second
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fleet := []debugapi.Endpoint{{Endpoint: "http://a", SidecarDebug: sidecarOK}, {Endpoint: "http://b", SidecarDebug: sidecarLacking},
		{Endpoint: "http://b2", SidecarDebug: sidecarLacking}, {Endpoint: "http://c", SidecarDebug: sidecarNone},
		{Endpoint: "http://d", SidecarDebug: closed.URL}, {Endpoint: "http://e", SidecarDebug: gossiping}, {Endpoint: "http://f"}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ms := c.metrics(ctx, fleet)
	if len(ms) != 6 { // the picker, then each sidecar once; none for an unknown debug URL
		t.Fatalf("%d metrics facts: %+v", len(ms), ms)
	}
	checks := verify.JudgeMetrics(ms, want)
	byURL := map[string]verify.Check{}
	for _, ck := range checks {
		if ck.Name != "metrics served" {
			t.Errorf("check %q", ck.Name)
		}
		byURL[ck.Endpoint] = ck
	}
	for _, ok := range []string{picker, sidecarOK} {
		if ck := byURL[ok]; !ck.OK {
			t.Errorf("%s failed: %+v", ok, ck)
		}
	}
	if ck := byURL[sidecarLacking]; ck.OK || !strings.Contains(ck.Detail, lacking) || strings.Count(ck.Detail, "kvroute_") != 1 {
		t.Errorf("a sidecar lacking %s: %+v", lacking, ck)
	}
	if ck := byURL[sidecarNone]; ck.OK || !strings.Contains(ck.Detail, "does not serve /metrics") || !strings.Contains(ck.Detail, "status 404") {
		t.Errorf("a sidecar not serving /metrics: %+v", ck)
	}
	if ck := byURL[closed.URL]; ck.OK || !strings.Contains(ck.Detail, "does not serve /metrics") {
		t.Errorf("a sidecar not answering: %+v", ck)
	}
	if ck := byURL[gossiping]; ck.OK || !strings.Contains(ck.Detail, want[monitoring.Gossip][0]) {
		t.Errorf("a gossiping sidecar without gossip's series: %+v", ck)
	}
}

// TestSeriesNames reads a page's sample names, each once, sorted.
func TestSeriesNames(t *testing.T) {
	page := "# HELP b_total B.\n# TYPE b_total counter\nb_total{x=\"1 2\"} 3\nb_total{x=\"2\"} 1\n\na 1 1700000000\nc_bucket{le=\"1\"} 2\n  d{} 0\n"
	got, err := seriesNames(strings.NewReader(page))
	if err != nil || strings.Join(got, ",") != "a,b_total,c_bucket,d" {
		t.Fatalf("%v %v", got, err)
	}
}
