package picker_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/picker"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestAdminSurface: a picker serves its admin surface (/healthz, /readyz,
// /metrics, /debug/*, Go's profiles under /debug/pprof/) on the admin
// listener only. The public port answers
// 404 in OpenAI's format for each, saying where they are served, and the
// admin port serves none of the OpenAI endpoints or the decision API.
func TestAdminSurface(t *testing.T) {
	pod := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond})
	s, _, _ := startObserved(t, pod, func(*picker.ServerConfig) {})
	public, admin := "http://"+s.Addr(), "http://"+s.AdminAddr()
	get := func(method, url string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// The admin port is ready once the sidecar's endpoint is known (and
	// /debug/endpoints lists it only from then on).
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if code, body := get(http.MethodGet, admin+"/readyz"); code != http.StatusOK {
			return fmt.Errorf("admin /readyz: %d %s", code, body)
		}
		return nil
	})
	adminPaths := map[string]string{
		"/healthz":             "ok",
		"/readyz":              "",
		"/metrics":             "kvroute_picker_",
		"/debug/endpoints":     pod.Engine.URL(),
		"/debug/admission":     "{",
		"/debug/pprof/":        "href='heap?debug=1'", // the index links each profile
		"/debug/pprof/heap":    "\x1f\x8b",            // a gzipped profile
		"/debug/pprof/cmdline": "picker.test",
		"/debug/sync":          `"endpoints":1,`,
		"/debug/no-such-thing": "",
	}
	for path, want := range adminPaths {
		code, body := get(http.MethodGet, public+path)
		var e struct {
			Error struct{ Message, Code string }
		}
		if code != http.StatusNotFound || json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != "not_found" ||
			!strings.Contains(e.Error.Message, "admin port (--admin-listen") {
			t.Errorf("public GET %s: %d %s; want 404 pointing at the admin port", path, code, body)
		}
		if path == "/debug/no-such-thing" || path == "/readyz" {
			continue // unknown / readiness checked below
		}
		if code, body := get(http.MethodGet, admin+path); code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("admin GET %s: %d, want 200 with %q: %.300s", path, code, want, body)
		}
	}
	// The sync: the endpoint's first state applied (its engine has cached
	// nothing: no summary to load).
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		var s struct {
			Endpoints, Reported, Loaded int
			Waiting                     int `json:"snapshots_waiting"`
			Synced                      bool
		}
		code, body := get(http.MethodGet, admin+"/debug/sync")
		if err := json.Unmarshal([]byte(body), &s); err != nil || code != http.StatusOK || s.Endpoints != 1 || s.Reported != 1 || s.Waiting != 0 || !s.Synced {
			return fmt.Errorf("admin /debug/sync: %d %s (%v)", code, body, err)
		}
		return nil
	})
	if code, body := get(http.MethodGet, admin+"/debug/no-such-thing"); code != http.StatusNotFound || strings.Contains(body, "admin port") {
		t.Errorf("admin GET /debug/no-such-thing: %d %s", code, body)
	}
	for _, path := range []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/routing/v1/pick"} {
		if code, body := get(http.MethodPost, admin+path); code != http.StatusNotFound || !strings.Contains(body, "public one (--listen") {
			t.Errorf("admin POST %s: %d %s, want 404 pointing at the public port", path, code, body)
		}
	}
	if code, body := get(http.MethodGet, public+"/v1/models"); code != http.StatusOK || !strings.Contains(body, "Qwen") {
		t.Errorf("public GET /v1/models: %d %s", code, body)
	}
}

// TestAdminListenConfig: the admin listener is required and needs a port
// of its own.
func TestAdminListenConfig(t *testing.T) {
	for _, tc := range []struct {
		name          string
		listen, admin string
		want          string
	}{
		{"defaults", ":8080", ":8081", ""},
		{"no admin listener", ":8080", "", "--admin-listen is required"},
		{"the public port", ":8080", ":8080", "a port of its own"},
		{"both pick a free port", "127.0.0.1:0", "127.0.0.1:0", ""},
	} {
		cfg := picker.DefaultServerConfig()
		cfg.Sidecars = []string{"127.0.0.1:1"}
		cfg.Listen, cfg.AdminListen = tc.listen, tc.admin
		err := cfg.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
