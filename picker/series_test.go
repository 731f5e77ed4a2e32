package picker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// seriesEndpoints is the fleet TestMetricSeriesPerEndpoint scrapes.
const seriesEndpoints = 50

// maxSeriesPerEndpoint is what one endpoint may add to a scrape by
// default (issue 37).
const maxSeriesPerEndpoint = 3

// TestMetricSeriesPerEndpoint: a picker (Start: its fleet view and router
// on one registry, as kvroute picker runs them) following 50 simulated
// sidecars, whose engines answer completions, serves a streamed
// completion on every endpoint (a pick, an outcome, a first token the TTFT
// model learns from, an in-flight request), a stream cut on every one (an
// abort) and names every one as a KV source (the pull's metrics, recorded
// as the proxy records a pick), with load reports arriving throughout.
// Counting the gathered series that carry an endpoint's address in any
// label: by default every endpoint has at most three, the ones alerts and
// dashboards read per engine (selected_total, endpoint_state,
// endpoint_staleness_seconds); with --per-endpoint-metrics every
// per-endpoint series is back (twelve). The sums over the endpoints are
// the same in both modes.
func TestMetricSeriesPerEndpoint(t *testing.T) {
	byDefault := map[string]int{
		"kvroute_picker_selected_total":             1,
		"kvroute_picker_endpoint_state":             1,
		"kvroute_picker_endpoint_staleness_seconds": 1,
	}
	perEndpoint := map[string]int{
		"kvroute_picker_selected_total":              1,
		"kvroute_picker_endpoint_state":              4,
		"kvroute_picker_endpoint_staleness_seconds":  1,
		"kvroute_picker_endpoint_requests_in_flight": 1,
		"kvroute_picker_stream_aborts_total":         3,
		"kvroute_picker_kv_sources_total":            1,
		"kvroute_picker_ttft_speed_factor":           1,
	}
	sums := map[bool]map[string]float64{}
	for _, per := range []bool{false, true} {
		t.Run(fmt.Sprintf("per-endpoint-metrics=%v", per), func(t *testing.T) {
			fams, urls := seriesFleet(t, seriesEndpoints, per)
			counts := endpointSeries(fams, urls)
			want := byDefault
			if per {
				want = perEndpoint
			}
			total := 0
			for _, u := range urls {
				n := 0
				for _, c := range counts[u] {
					n += c
				}
				total += n
				if !maps.Equal(counts[u], want) {
					t.Errorf("%s: series by metric %v, want %v", u, counts[u], want)
				}
				if !per && n > maxSeriesPerEndpoint {
					t.Errorf("%s: %d series carry it, want at most %d", u, n, maxSeriesPerEndpoint)
				}
			}
			t.Logf("%d endpoints, per-endpoint metrics %v: %d series carry an endpoint, %.2f an endpoint; endpoint 0's: %v",
				len(urls), per, total, float64(total)/float64(len(urls)), counts[urls[0]])
			sums[per] = summed(fams)
		})
	}
	if t.Failed() {
		return
	}
	if !maps.Equal(sums[false], sums[true]) {
		t.Errorf("summed over the endpoints, the series differ:\ndefault   %v\nper endpoint %v", sums[false], sums[true])
	}
	for k, want := range map[string]float64{
		"kvroute_picker_stream_aborts_total{cause=upstream_truncated}": seriesEndpoints,
		"kvroute_picker_kv_sources_total{}":                            seriesEndpoints,
		"kvroute_picker_selected_total{}":                              3 * seriesEndpoints, // a whole stream, a cut one, a source's pick
	} {
		if sums[false][k] != want {
			t.Errorf("%s = %v, want %v", k, sums[false][k], want)
		}
	}
	if v, ok := sums[false]["kvroute_picker_endpoint_requests_in_flight{}"]; !ok || v != 0 {
		t.Errorf("requests in flight after the answers: %v (exported: %v)", v, ok)
	}
}

// seriesFleet runs a picker over n simulated sidecars whose engines
// answer completions, touches every series an endpoint can have, and
// returns what its registry gathers and the endpoints' URLs.
func seriesFleet(t *testing.T, n int, perEndpoint bool) ([]*dto.MetricFamily, []string) {
	t.Helper()
	const capacity = 1024
	params := summary.ForCapacity(capacity)
	var (
		urls  []string
		sims  []*simsidecar.Sidecar
		addrs []string
		hits  []*atomic.Int64
	)
	for i := range n {
		hit := &atomic.Int64{}
		eng := httptest.NewServer(completionEngine(hit))
		t.Cleanup(eng.Close)
		s := simsidecar.Start(t, simsidecar.Config{Index: i, Params: params, Still: true, Endpoint: eng.URL})
		urls, sims, addrs, hits = append(urls, eng.URL), append(sims, s), append(addrs, s.Addr()), append(hits, hit)
	}
	cfg := DefaultServerConfig()
	cfg.Listen, cfg.AdminListen, cfg.GRPCListen = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.Sidecars, cfg.Capacity = addrs, capacity
	cfg.Router.PerEndpointMetrics = perEndpoint
	reg := prometheus.NewRegistry()
	srv, err := Start(context.Background(), cfg, zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	v := srv.View()

	// Each endpoint holds a prompt of its own, whole.
	prompts := make([][]uint32, n)
	for i := range prompts {
		prompts[i] = make([]uint32, 1024)
		for j := range prompts[i] {
			prompts[i][j] = uint32(1_000_000 + i*10_000 + j)
		}
		sims[i].Hold((&blockkey.Request{Tokens: prompts[i]}).AppendKeys(nil, "sim", 16)...)
	}
	testnet.Await(t, 30*time.Second, 20*time.Millisecond, func() error {
		eps := v.Endpoints()
		if len(eps) < n {
			return fmt.Errorf("the view knows %d of %d endpoints", len(eps), n)
		}
		for i, u := range urls {
			chain := (&blockkey.Request{Tokens: prompts[i]}).AppendKeys(nil, "sim", 16)
			if got := v.Match(eps[0].Group, tier.GPU, chain)[u]; got < len(chain) {
				return fmt.Errorf("%s holds %d of its prompt's %d blocks", u, got, len(chain))
			}
		}
		for _, e := range eps {
			if !e.HasLoad() {
				return fmt.Errorf("no load report from %s", e.URL)
			}
		}
		return nil
	})

	base := "http://" + srv.Addr() + "/v1/completions"
	complete := func(i int, maxTokens int) {
		body, _ := json.Marshal(map[string]any{"model": "sim", "prompt": prompts[i], "stream": true, "max_tokens": maxTokens,
			"stream_options": map[string]any{"include_usage": true}})
		resp, err := http.Post(base, "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body) // a cut stream ends in an error: expected
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("endpoint %d's prompt: %d", i, resp.StatusCode)
		}
	}
	// A whole stream on each endpoint (its prompt is cached there only);
	// then one cut after its first token.
	for i := range n {
		complete(i, 1)
	}
	for i, h := range hits {
		if h.Load() == 0 {
			t.Fatalf("endpoint %d (%s) served none of the streams", i, urls[i])
		}
	}
	for i := range n {
		complete(i, 2)
	}
	// Every endpoint named as the KV source of a pick on the next one.
	m := srv.Router().m
	for i, u := range urls {
		d := decide.Decision{Endpoint: urls[(i+1)%n], Source: u, SourceTokens: 16}
		m.observe(&notes{}, &d, &Pick{source: kvSource{url: u, addr: "127.0.0.1:5710", tokens: 16}})
	}
	// One more load report from every sidecar (their reports go on).
	since := time.Now()
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, e := range v.Endpoints() {
			if !e.LoadAt.After(since) {
				return fmt.Errorf("no new load report from %s", e.URL)
			}
		}
		return nil
	})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return fams, urls
}

// completionEngine answers /v1/models (sim) and streamed completions:
// one token, then the usage and [DONE] when max_tokens is 1, else the
// stream ends after the token without its final event (a cut answer).
func completionEngine(hits *atomic.Int64) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"sim","object":"model","owned_by":"test"}]}`)
	})
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		var req struct {
			Prompt    []uint32 `json:"prompt"`
			MaxTokens int      `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"id":"c","object":"text_completion","model":"sim","choices":[{"index":0,"text":"a","finish_reason":null}]}`+"\n\n")
		w.(http.Flusher).Flush()
		if req.MaxTokens != 1 {
			return
		}
		cached := (len(req.Prompt) - 1) / 16 * 16
		_, _ = fmt.Fprintf(w, `data: {"id":"c","object":"text_completion","model":"sim","choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":null}`+"\n\n"+
			`data: {"id":"c","object":"text_completion","model":"sim","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":1,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`+"\n\n"+
			"data: [DONE]\n\n", len(req.Prompt), len(req.Prompt)+1, cached)
	})
	return mux
}

// endpointSeries counts, for each endpoint URL, the gathered series that
// carry its address (host:port, with or without the scheme) in a label,
// by metric name (a histogram or summary counts as its bucket, sum and
// count series).
func endpointSeries(fams []*dto.MetricFamily, urls []string) map[string]map[string]int {
	out := map[string]map[string]int{}
	hosts := map[string]string{}
	for _, u := range urls {
		out[u] = map[string]int{}
		p, _ := url.Parse(u)
		hosts[p.Host] = u
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			seen := map[string]bool{}
			for _, l := range m.GetLabel() {
				for h, u := range hosts {
					if strings.Contains(l.GetValue(), h) && !seen[u] {
						seen[u] = true
						out[u][f.GetName()] += exposedSeries(f.GetType(), m)
					}
				}
			}
		}
	}
	return out
}

// exposedSeries is how many series m is in a scrape: a histogram's
// buckets (+Inf among them), sum and count; a summary's quantiles, sum
// and count; one otherwise.
func exposedSeries(t dto.MetricType, m *dto.Metric) int {
	switch t {
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		n := len(m.GetHistogram().GetBucket()) + 2
		if bs := m.GetHistogram().GetBucket(); len(bs) == 0 || !math.IsInf(bs[len(bs)-1].GetUpperBound(), 1) {
			n++ // +Inf, which the text format adds
		}
		return n
	case dto.MetricType_SUMMARY:
		return len(m.GetSummary().GetQuantile()) + 2
	}
	return 1
}

// summed is every family's values summed over the engine label (the
// series' other labels kept), for the families that have one in some
// mode and are deterministic here.
func summed(fams []*dto.MetricFamily) map[string]float64 {
	out := map[string]float64{}
	for _, f := range fams {
		switch f.GetName() {
		case "kvroute_picker_selected_total", "kvroute_picker_stream_aborts_total", "kvroute_picker_kv_sources_total",
			"kvroute_picker_endpoint_requests_in_flight":
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				if l.GetName() != "engine" {
					ls = append(ls, l.GetName()+"="+l.GetValue())
				}
			}
			slices.Sort(ls)
			k := f.GetName() + "{" + strings.Join(ls, ",") + "}"
			switch {
			case m.Counter != nil:
				out[k] += m.Counter.GetValue()
			case m.Gauge != nil:
				out[k] += m.Gauge.GetValue()
			}
		}
	}
	return out
}
