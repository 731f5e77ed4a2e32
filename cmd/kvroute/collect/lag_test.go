package collect

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/verify"
	"github.com/kvroute/kvroute/picker/pickapi"
)

// fakeEngine answers completions (status 200 with usage, or status) and
// remembers when it last answered.
type fakeEngine struct {
	srv    *httptest.Server
	mu     sync.Mutex
	served time.Time
}

func newFakeEngine(t *testing.T, status int) *fakeEngine {
	t.Helper()
	e := &fakeEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status != http.StatusOK {
			w.WriteHeader(status)
			return
		}
		_, _ = w.Write([]byte(`{"usage":{"prompt_tokens":130,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`))
		e.mu.Lock()
		e.served = time.Now()
		e.mu.Unlock()
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// since is how long ago the engine answered (0: never).
func (e *fakeEngine) since() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.served.IsZero() {
		return 0
	}
	return time.Since(e.served)
}

// TestLagProbe runs a lag probe against a fake picker over fake engines:
// one the picker predicts 100 ms after its engine answered, one it never
// predicts (routed by load only), one whose engine fails, one in another
// identity group (no result) and one of the routed group the decision
// leaves out.
func TestLagProbe(t *testing.T) {
	t.Parallel()
	fast, never, broken := newFakeEngine(t, 200), newFakeEngine(t, 200), newFakeEngine(t, 500)
	const other, missing = "http://10.9.9.1:8000", "http://10.9.9.2:8000"
	ep := func(url, group string) debugapi.Endpoint {
		return debugapi.Endpoint{Endpoint: url, Model: "m", BlockSize: 16, Group: group}
	}
	fleet := []debugapi.Endpoint{ep(fast.srv.URL, "g"), ep(never.srv.URL, "g"), ep(broken.srv.URL, "g"), ep(other, "h"), ep(missing, "g"),
		{Endpoint: "http://10.9.9.3:8000", Model: "another", BlockSize: 16, Group: "g"}}
	var polls sync.Map // salt → decisions asked
	mux := http.NewServeMux()
	mux.HandleFunc(pickapi.Path, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		n, _ := polls.LoadOrStore(body["cache_salt"], new(int))
		*n.(*int)++
		matched := 0
		if d := fast.since(); d >= 100*time.Millisecond {
			matched = 128
		}
		_ = json.NewEncoder(w).Encode(pickapi.Answer{Endpoint: fast.srv.URL, PromptTokens: 130, Candidates: []pickapi.Candidate{
			{Endpoint: fast.srv.URL, MatchedTokens: matched}, {Endpoint: never.srv.URL, MatchedTokens: 16}, {Endpoint: broken.srv.URL}}})
	})
	mux.HandleFunc(debugapi.Path, func(w http.ResponseWriter, _ *http.Request) {
		eps := []debugapi.Endpoint{ep(fast.srv.URL, "g"), ep(never.srv.URL, "g")}
		eps[1].State, eps[1].StateReason = "load_only", "the sidecar reports its stream silent"
		_ = json.NewEncoder(w).Encode(debugapi.Document{Endpoints: eps})
	})
	pk := httptest.NewServer(mux)
	t.Cleanup(pk.Close)
	cfg := DefaultConfig()
	cfg.Picker, cfg.Admin, cfg.Timeout = pk.URL, pk.URL, 5*time.Second
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	lags := c.lag(context.Background(), "m", fleet)
	took := time.Since(start)
	byEndpoint := map[string]verify.LagResult{}
	for _, l := range lags {
		byEndpoint[l.Endpoint] = l
		if l.Model != "m" || l.PromptTokens != 130 || l.FullTokens != 128 || l.BlockSize != 16 {
			t.Errorf("%+v", l)
		}
	}
	if len(lags) != 4 {
		t.Fatalf("%d results: %+v", len(lags), lags)
	}
	// The picker predicts 100 ms after the engine answered, less the time
	// the answer took to come back.
	if l := byEndpoint[fast.srv.URL]; !l.Predicted || l.Err != "" || l.LagSecs < 0.05 || l.LagSecs > 0.5 || l.MostPredicted != 128 || l.Polls < 3 {
		t.Errorf("fast: %+v", l)
	}
	if l := byEndpoint[never.srv.URL]; l.Predicted || l.Err != "" || l.MostPredicted != 16 || l.WaitedSecs < 5 ||
		l.PickerState != "load_only" || !strings.Contains(l.PickerReason, "silent") {
		t.Errorf("never: %+v", l)
	}
	if l := byEndpoint[broken.srv.URL]; l.Predicted || !strings.Contains(l.Err, "sent to the engine: ") || !strings.Contains(l.Err, "status 500") || l.Polls != 0 {
		t.Errorf("broken: %+v", l)
	}
	if l, ok := byEndpoint[missing]; !ok || !strings.Contains(l.Err, "does not consider the endpoint") {
		t.Errorf("missing: %+v", l)
	}
	if _, ok := byEndpoint[other]; ok {
		t.Errorf("a result for another group's endpoint")
	}
	// Bounded: given up at 5 s, polled at a modest rate (one decision
	// before the sends, then at most one per 15 ms).
	if took > 7*time.Second {
		t.Errorf("took %v", took)
	}
	n := 0
	polls.Range(func(_, v any) bool { n += *v.(*int); return true })
	if limit := int(took/lagPoll) + 2; n > limit {
		t.Errorf("%d decisions in %v, more than %d", n, took, limit)
	}
	// Judged: the fast endpoint passes with its figure, the others fail.
	for _, l := range lags {
		ch := verify.JudgeLag(l, time.Second)
		if ch.OK != (l.Endpoint == fast.srv.URL) || ch.Figure == "" {
			t.Errorf("%+v", ch)
		}
	}
}

// TestLagProbeDecisionFails: a decision API that fails before the sends
// gives one failed result for the model, naming no endpoint.
func TestLagProbeDecisionFails(t *testing.T) {
	t.Parallel()
	pk := fakePicker(t, []debugapi.Endpoint{{Endpoint: "http://e", Model: "m"}}, http.StatusBadGateway)
	cfg := DefaultConfig()
	cfg.Picker, cfg.Admin = pk, pk
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lags := c.lag(context.Background(), "m", []debugapi.Endpoint{{Endpoint: "http://e", Model: "m", BlockSize: 16}})
	if len(lags) != 1 || lags[0].Endpoint != "" || !strings.Contains(lags[0].Err, "decision API: ") || !strings.Contains(lags[0].Err, "status 502") {
		t.Fatalf("%+v", lags)
	}
}

// TestStreams reads stream verdicts from fake sidecars: one that judges
// its stream after 300 ms, a silent one with its reason, an older sidecar,
// one down, one following other endpoints, one unknown for an engine that
// served nothing, one unknown for good — which bounds the wait.
func TestStreams(t *testing.T) {
	t.Parallel()
	start := time.Now()
	rank := func(endpoint string, rank int, state, reason string) map[string]any {
		r := map[string]any{"identity": map[string]any{"endpoint": endpoint, "rank": rank}}
		if state != "" {
			r["stream_state"], r["stream_reason"] = state, reason
		}
		return r
	}
	sidecar := func(state func() []map[string]any) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/debug/state" {
				w.WriteHeader(http.StatusNotFound)
				return
			}
			_ = json.NewEncoder(w).Encode(state())
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	const bind = "the engine connects and so does the sidecar: use --kv-events-mode bind"
	late := sidecar(func() []map[string]any {
		if time.Since(start) < 300*time.Millisecond {
			return []map[string]any{rank("http://late", 0, "unknown", "")}
		}
		return []map[string]any{rank("http://late", 0, "live", "")}
	})
	// Two ranks behind one debug URL: each endpoint finds its own.
	silent := sidecar(func() []map[string]any {
		return []map[string]any{rank("http://live", 1, "live", ""), rank("http://silent", 0, "silent", bind), rank("http://live", 0, "silent", bind)}
	})
	older := sidecar(func() []map[string]any { return []map[string]any{rank("http://older", 0, "", "")} })
	down := sidecar(func() []map[string]any {
		r := rank("http://down", 0, "live", "")
		r["engine_down"], r["engine_error"] = true, "connection refused"
		return []map[string]any{r}
	})
	forever := sidecar(func() []map[string]any {
		return []map[string]any{rank("http://idle", 0, "unknown", ""), rank("http://stuck", 0, "unknown", "")}
	})
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	t.Cleanup(broken.Close)
	fleet := []debugapi.Endpoint{
		{Endpoint: "http://late", SidecarDebug: late}, {Endpoint: "http://silent", SidecarDebug: silent},
		{Endpoint: "http://live", Rank: 1, SidecarDebug: silent}, {Endpoint: "http://older", SidecarDebug: older},
		{Endpoint: "http://down", SidecarDebug: down}, {Endpoint: "http://elsewhere", SidecarDebug: older},
		{Endpoint: "http://idle", SidecarDebug: forever}, {Endpoint: "http://stuck", SidecarDebug: forever},
		{Endpoint: "http://unknown-url"}, {Endpoint: "http://broken", SidecarDebug: broken.URL},
	}
	served := map[string]bool{}
	for _, e := range fleet {
		served[e.Endpoint] = e.Endpoint != "http://idle"
	}
	cfg := DefaultConfig()
	cfg.Picker = "http://127.0.0.1:1"
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t0 := time.Now()
	got := c.streams(context.Background(), fleet, served)
	took := time.Since(t0)
	if took < streamSettle || took > streamSettle+2*time.Second {
		t.Errorf("took %v", took)
	}
	want := map[string]struct {
		ok   bool
		text string // in the detail or cause
	}{
		"http://late": {true, "delivers"}, "http://silent": {false, "--kv-events-mode bind"}, "http://live": {true, "delivers"},
		"http://older": {false, "does not report stream_state"}, "http://down": {false, "connection refused"},
		"http://elsewhere": {false, "has no rank 0"}, "http://idle": {true, "no evidence yet"},
		"http://stuck": {false, "saw no event"}, "http://unknown-url": {false, "debug URL is unknown"}, "http://broken": {false, "status 500"},
	}
	if len(got) != len(fleet) {
		t.Fatalf("%d facts", len(got))
	}
	for i, f := range got {
		if f.Endpoint != fleet[i].Endpoint || f.Served != served[f.Endpoint] {
			t.Errorf("%+v", f)
		}
		c := verify.JudgeStream(f)
		w := want[f.Endpoint]
		if c.OK != w.ok || !strings.Contains(c.Detail+" "+c.Cause, w.text) {
			t.Errorf("%s: %+v from %+v, want ok %v and %q", f.Endpoint, c, f, w.ok, w.text)
		}
	}
	if got[0].WaitedSecs < 0.3 || got[0].WaitedSecs > 2 {
		t.Errorf("late: judged after %.1f s: %+v", got[0].WaitedSecs, got[0])
	}
	if got[7].WaitedSecs < streamSettle.Seconds() {
		t.Errorf("stuck: waited %.1f s", got[7].WaitedSecs)
	}
}
