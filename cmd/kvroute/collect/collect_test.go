package collect

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/deploy/monitoring"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/verify"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/pickapi"
	testpod "github.com/kvroute/kvroute/test/pod"
)

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig()
	ok.Picker = "http://127.0.0.1:8080"
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		picker  string
		timeout time.Duration
		flag    string
	}{
		{"", time.Second, "--picker URL is required"},
		{"kvroute-picker:8080", time.Second, "--picker"},
		{"ftp://picker", time.Second, "--picker"},
		{"http://", time.Second, "--picker"},
		{"http://picker:8080", 0, "--timeout"},
		{"http://picker:8080", -1, "--timeout"},
	} {
		cfg := DefaultConfig()
		cfg.Picker, cfg.Timeout = tc.picker, tc.timeout
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%+v: %v, want the flag %s named", cfg, err, tc.flag)
		}
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
	ok.MaxLag = 0
	if err := ok.Validate(); err == nil || !strings.Contains(err.Error(), "--max-lag") {
		t.Errorf("no lag: %v, want --max-lag named", err)
	}
	bad := DefaultConfig()
	bad.Picker, bad.Admin = "http://picker:8080", "picker:8081"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "--picker-admin") {
		t.Errorf("a bad admin URL: %v, want --picker-admin named", err)
	}
}

// TestAdminURL: the admin surface is --picker-admin when given, else the
// picker's host at the picker's default admin port.
func TestAdminURL(t *testing.T) {
	for _, tc := range []struct{ picker, admin, want string }{
		{"http://kvroute-picker:8080", "", "http://kvroute-picker:8081"},
		{"http://127.0.0.1:8080/", "", "http://127.0.0.1:8081"},
		{"https://picker.example", "", "https://picker.example:8081"},
		{"http://[::1]:8080", "", "http://[::1]:8081"},
		{"http://picker:8080", "http://picker-admin:9999", "http://picker-admin:9999"},
	} {
		if got := AdminURL(Config{Picker: tc.picker, Admin: tc.admin}); got != tc.want {
			t.Errorf("AdminURL(%q, %q) = %q, want %q", tc.picker, tc.admin, got, tc.want)
		}
	}
}

// fakePicker answers /debug/endpoints with endpoints and the decision API
// with status (and an OpenAI error body when not 200).
func fakePicker(t *testing.T, endpoints []debugapi.Endpoint, status int) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc(debugapi.Path, func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(debugapi.Document{Endpoints: endpoints, Refused: []debugapi.Refusal{}})
	})
	mux.HandleFunc(pickapi.Path, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(status)
		if status != http.StatusOK {
			_, _ = w.Write([]byte(`{"error":{"message":"no","type":"invalid_request_error","code":"invalid_api_key"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"endpoint":"http://e","matched_tokens":0}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestFactsCannotRun: what stops verify before any check, and the error
// that says why.
func TestFactsCannotRun(t *testing.T) {
	one := []debugapi.Endpoint{{Endpoint: "http://127.0.0.1:1", Model: "m"}}
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadGateway) }))
	t.Cleanup(broken.Close)
	for _, tc := range []struct {
		name, picker, model string
		want                string
		status              int // the StatusError found in the chain (0: none)
	}{
		{"endpoints fail", broken.URL, "", "the picker's endpoints, on its admin port: " + broken.URL + "/debug/endpoints: status 502", 502},
		{"no endpoint", fakePicker(t, nil, 200), "", "knows no endpoint", 0},
		{"no endpoint of the model", fakePicker(t, one, 200), "other/model", "knows no endpoint serving other/model", 0},
		{"decision API wants a token", fakePicker(t, one, 401), "", "the picker's decision API wants a token: --decision-token-file", 0},
		{"decision API refuses otherwise", fakePicker(t, one, 403), "", `the picker's decision API: status 403: {"error":{"message":"no"`, 403},
	} {
		cfg := DefaultConfig()
		cfg.Picker, cfg.Admin, cfg.Model, cfg.Timeout = tc.picker+"/", tc.picker, tc.model, 5*time.Second
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Facts(context.Background())
		c.Close()
		var se *openai.StatusError
		switch {
		case err == nil || !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		case tc.status != 0 && (!errors.As(err, &se) || se.Status != tc.status):
			t.Errorf("%s: %v carries no StatusError %d", tc.name, err, tc.status)
		case tc.status == 0 && errors.As(err, &se):
			t.Errorf("%s: %v carries %+v", tc.name, err, se)
		}
	}
}

// healthyFleet starts a real fleet in process: two engines with their
// sidecars and a picker whose decision API wants token. It returns the
// picker's public and admin URLs once the picker knows both endpoints.
func healthyFleet(t *testing.T, token string) (string, string) {
	t.Helper()
	u, admin, _ := healthyFleetWith(t, token, nil)
	return u, admin
}

// healthyFleetWith is healthyFleet with the picker's configuration
// adjusted, returning the picker too.
func healthyFleetWith(t *testing.T, token string, adjust func(*picker.ServerConfig)) (string, string, *picker.Server) {
	t.Helper()
	cfg := picker.DefaultServerConfig()
	cfg.Listen, cfg.AdminListen, cfg.GRPCListen, cfg.Capacity, cfg.DecisionToken = "127.0.0.1:0", "127.0.0.1:0", "", 4096, token
	if adjust != nil {
		adjust(&cfg)
	}
	for i := 0; i < 2; i++ {
		cfg.Sidecars = append(cfg.Sidecars, testpod.Start(t, testpod.Options{GPUBlocks: 1024}).Sidecar.GRPCAddr())
	}
	pk, err := picker.Start(context.Background(), cfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pk.Close)
	updated := func() bool { // both known, and each has sent something (verify fails one that has not)
		eps := pk.View().Endpoints()
		for _, e := range eps {
			if e.LastUpdate.IsZero() {
				return false
			}
		}
		return len(eps) == 2
	}
	tick, deadline := time.NewTicker(10*time.Millisecond), time.After(10*time.Second)
	defer tick.Stop()
	for !updated() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("the picker never found the endpoints, or never heard from their sidecars")
		}
	}
	return "http://" + pk.Addr(), "http://" + pk.AdminAddr(), pk
}

// gather collects the facts of the fleet behind the picker at pickerURL
// (its admin surface at adminURL).
func gather(t *testing.T, pickerURL, adminURL, token string) (verify.Facts, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := DefaultConfig()
	cfg.Picker, cfg.Admin, cfg.Token, cfg.Timeout = pickerURL, adminURL, token, 5*time.Second
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.Facts(ctx)
}

// TestFactsOfAFleet gathers the facts of a real fleet in process. Without
// the decision token verify cannot run; with it, every fact is in, the
// lag probe measures both endpoints well within --max-lag (the figure is
// logged), and every check is judged healthy — all but the sidecar
// stream, which TestFactsOfAFleetStreamLive covers.
func TestFactsOfAFleet(t *testing.T) {
	u, admin := healthyFleet(t, "s3cret")
	if _, err := gather(t, u, admin, ""); err == nil || !strings.Contains(err.Error(), "wants a token") {
		t.Fatalf("without the token: %v", err)
	}
	f, err := gather(t, u, admin, "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Fleet) != 2 || len(f.Endpoints) != 2 || len(f.Probes) != 3 || len(f.Lags) != 2 {
		t.Fatalf("%d endpoints, %d endpoint facts, %d probes, %d lag probes", len(f.Fleet), len(f.Endpoints), len(f.Probes), len(f.Lags))
	}
	for i, e := range f.Endpoints {
		if s := e.Sidecar; s.Endpoint != f.Fleet[i].Endpoint || s.DebugURL == "" || s.Err != "" || len(s.Follows) != 1 || s.Follows[0] != s.Endpoint {
			t.Errorf("sidecar facts %+v", s)
		}
		if d := e.Details; !d.Details || d.CachedTokens == 0 || d.PromptTokens <= d.CachedTokens {
			t.Errorf("details facts %+v", d)
		}
		if s := e.Stream; s.Endpoint != f.Fleet[i].Endpoint || s.DebugURL == "" || s.Err != "" || !s.Found || !s.Served {
			t.Errorf("stream facts %+v", s)
		}
	}
	for _, p := range f.Probes {
		if r := p.Result; r.Err != "" || r.Keys == 0 || r.KeysIndexed != r.Keys || r.EngineCached == 0 {
			t.Errorf("probe %+v", r)
		}
		if len(p.Tokens) != 2 {
			t.Errorf("%s: token facts of %d endpoints", p.Result.Name, len(p.Tokens))
		}
		for _, tf := range p.Tokens {
			if tf.Probe != p.Result.Name || tf.RenderErr != "" || len(tf.EngineKeys) == 0 || tf.Via == "" {
				t.Errorf("token facts %+v", tf)
			}
		}
	}
	for i, l := range f.Lags {
		if l.Endpoint != f.Fleet[i].Endpoint || l.Err != "" || !l.Predicted || l.FullTokens == 0 || l.MostPredicted < l.FullTokens ||
			l.LagSecs > verify.DefaultMaxLag.Seconds() || l.Polls == 0 {
			t.Errorf("lag probe %+v", l)
		}
		t.Logf("lag probe of %s: predicted %d tokens %s after the engine answered (%d decisions)", l.Endpoint, l.FullTokens, verify.LagFigure(l.LagSecs), l.Polls)
	}
	r := verify.Judge(f, verify.DefaultLimits())
	for _, c := range verify.Failed(r.Checks) {
		if c.Name != "sidecar stream" {
			t.Errorf("failed: %+v", c)
		}
	}
}

// TestFactsOfAFleetStreamLive: on a healthy fleet every sidecar judges its
// stream live, and everything passes. It needs the sidecar's stream state
// (issue 15's sidecar work): a sidecar without it fails here.
func TestFactsOfAFleetStreamLive(t *testing.T) {
	u, admin, pk := healthyFleetWith(t, "", func(c *picker.ServerConfig) { c.ExtProcListen = "127.0.0.1:0" })
	f, err := gather(t, u, admin, "")
	if err != nil {
		t.Fatal(err)
	}
	// Its endpoint picker answers SERVING, at the address it reports.
	if e := f.Self.ExtProc; e.Listen != pk.ExtProcAddr() || e.Address != pk.ExtProcAddr() || e.Status != "SERVING" || e.Err != "" {
		t.Errorf("endpoint picker facts %+v (it listens on %s)", e, pk.ExtProcAddr())
	}
	if c := checkNamed(verify.Judge(f, verify.DefaultLimits()).Checks, "endpoint picker health"); c == nil || !c.OK {
		t.Errorf("endpoint picker health: %+v", c)
	}
	for _, e := range f.Endpoints {
		if s := e.Stream; !s.Reported || s.State != verify.StreamLive || s.EngineDown {
			t.Errorf("stream facts %+v", s)
		}
	}
	// /metrics of the picker's admin port and of both sidecars'.
	if len(f.Metrics) != 3 || f.Metrics[0].Component != verify.ComponentPicker || f.Metrics[0].URL != admin ||
		f.Metrics[1].Component != verify.ComponentSidecar || f.Metrics[1].URL != f.Fleet[0].SidecarDebug ||
		f.Metrics[2].Component != verify.ComponentSidecar || f.Metrics[2].URL != f.Fleet[1].SidecarDebug {
		t.Fatalf("metrics facts %+v", f.Metrics)
	}
	lim := verify.DefaultLimits()
	var err2 error
	if lim.Series, err2 = monitoring.Series(); err2 != nil {
		t.Fatal(err2)
	}
	r := verify.Judge(f, lim)
	if !r.OK {
		t.Fatalf("failed: %+v", verify.Failed(r.Checks))
	}
	served := 0
	for _, c := range r.Checks {
		if c.Name == "metrics served" {
			served++
			t.Logf("%s %s: %s", c.Name, c.Endpoint, c.Detail)
		}
	}
	if served != 3 {
		t.Errorf("%d metrics served checks, want 3 (the picker, two sidecars)", served)
	}
}

// checkNamed is the first check of that name (nil: none).
func checkNamed(checks []verify.Check, name string) *verify.Check {
	for i := range checks {
		if checks[i].Name == name {
			return &checks[i]
		}
	}
	return nil
}

// TestExtProcHealth: verify probes the endpoint picker's grpc.health.v1
// for the ext_proc service: NOT_SERVING fails naming the address and the
// status, an address nothing answers on fails naming it and why, and one
// requiring client certificates is said not probed. (A picker's SERVING
// endpoint picker: TestFactsOfAFleetStreamLive.)
func TestExtProcHealth(t *testing.T) {
	hs := health.NewServer()
	hs.SetServingStatus(verify.ExtProcService, healthpb.HealthCheckResponse_NOT_SERVING)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().String()
	_ = closed.Close()

	cfg := DefaultConfig()
	cfg.Picker, cfg.Timeout = "http://127.0.0.1:1", 5*time.Second
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		ep   debugapi.ExtProc
		want string // in the failing check's detail; "" passes
	}{
		{"not serving", debugapi.ExtProc{Address: ln.Addr().String()}, "health at " + ln.Addr().String() + " answers NOT_SERVING"},
		{"unreachable", debugapi.ExtProc{Address: gone}, "health at " + gone + " did not answer"},
		{"mutual TLS", debugapi.ExtProc{Address: gone, TLS: true, ClientCert: true}, ""},
	} {
		var f verify.Facts
		c.extProc(ctx, &tc.ep, &f.Self.ExtProc)
		got := checkNamed(verify.JudgePicker(f.Self), "endpoint picker health")
		switch {
		case got == nil:
			t.Errorf("%s: no endpoint picker check (facts %+v)", tc.name, f.Self.ExtProc)
		case tc.want == "" && (!got.OK || !strings.Contains(got.Detail, "not probed")):
			t.Errorf("%s: %+v, want a pass saying it was not probed", tc.name, got)
		case tc.want != "" && (got.OK || !strings.Contains(got.Detail, tc.want) || got.Endpoint != tc.ep.Address):
			t.Errorf("%s: %+v, want a failure with %q", tc.name, got, tc.want)
		}
	}
	hs.SetServingStatus(verify.ExtProcService, healthpb.HealthCheckResponse_SERVING)
	var f verify.Facts
	c.extProc(ctx, &debugapi.ExtProc{Address: ln.Addr().String()}, &f.Self.ExtProc)
	if got := checkNamed(verify.JudgePicker(f.Self), "endpoint picker health"); got == nil || !got.OK {
		t.Errorf("serving: %+v", got)
	}
	// None served, none named: no check.
	var none verify.Facts
	c.extProc(ctx, nil, &none.Self.ExtProc)
	if got := checkNamed(verify.JudgePicker(none.Self), "endpoint picker health"); got != nil {
		t.Errorf("no endpoint picker: %+v", got)
	}
}

// TestExtProcTarget: the endpoint picker is dialled where it listens, on
// the picker's host when it listens on every interface, or at --ext-proc.
func TestExtProcTarget(t *testing.T) {
	for _, tc := range []struct{ listen, picker, override, want string }{
		{"127.0.0.1:9002", "http://127.0.0.1:8080", "", "127.0.0.1:9002"},
		{"[::]:9002", "http://kvroute-picker:8080", "", "kvroute-picker:9002"},
		{"0.0.0.0:9002", "http://10.0.0.9:8080", "", "10.0.0.9:9002"},
		{":9002", "http://[fd00::1]:8080", "", "[fd00::1]:9002"},
		{"[::]:9002", "http://kvroute-picker:8080", "epp.example:443", "epp.example:443"},
	} {
		if got := extProcTarget(tc.listen, tc.picker, tc.override); got != tc.want {
			t.Errorf("extProcTarget(%q, %q, %q) = %q, want %q", tc.listen, tc.picker, tc.override, got, tc.want)
		}
	}
}
