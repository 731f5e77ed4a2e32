package picker_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/picker"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestDecisionTokenRotation: a picker started with --decision-token-file
// and --engine-api-key-file takes the token from the file; a rotated file
// is re-read without a restart (the old token refused, the new taken);
// and neither secret appears in the logs, /metrics, /debug/endpoints or
// an error body.
func TestDecisionTokenRotation(t *testing.T) {
	pod := testpod.Start(t, testpod.Options{Capacity: capacity, Scrape: 50 * time.Millisecond})
	dir := t.TempDir()
	tokenFile, keyFile := filepath.Join(dir, "token"), filepath.Join(dir, "engine-key")
	const old, rotated, engineKey = "old-token-3f9a1c", "rotated-token-77b2e0c", "engine-key-5d1e9b"
	for path, v := range map[string]string{tokenFile: old, keyFile: engineKey} {
		if err := os.WriteFile(path, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, logs, reg := startObserved(t, pod, func(cfg *picker.ServerConfig) {
		cfg.DecisionTokenFile, cfg.EngineAPIKeyFile = tokenFile, keyFile
	})
	base := "http://" + s.Addr()
	var bodies []string
	pick := func(token string) int {
		req, _ := http.NewRequest(http.MethodPost, base+"/routing/v1/pick", strings.NewReader(chatBody("s", "hello")))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		bodies = append(bodies, string(raw))
		return resp.StatusCode
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if code := pick(old); code != http.StatusOK {
			return fmt.Errorf("the file's token: %d", code)
		}
		return nil
	})
	if code := pick("wrong"); code != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d", code)
	}
	if err := os.WriteFile(tokenFile, []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testnet.Await(t, 10*time.Second, 50*time.Millisecond, func() error {
		if code := pick(rotated); code != http.StatusOK {
			return fmt.Errorf("the rotated token: %d", code)
		}
		return nil
	})
	if code := pick(old); code != http.StatusUnauthorized {
		t.Fatalf("the old token after the rotation: %d", code)
	}
	for _, path := range []string{"/metrics", "/debug/endpoints", "/debug/admission", "/readyz"} {
		resp, err := http.Get("http://" + s.AdminAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		bodies = append(bodies, string(raw))
	}
	var lines []string
	for _, e := range logs.All() {
		lines = append(lines, e.Message+fmt.Sprint(e.ContextMap()))
	}
	for _, secret := range []string{old, rotated, engineKey} {
		for _, b := range bodies {
			if strings.Contains(b, secret) {
				t.Errorf("a secret in an answer: %s", b)
			}
		}
		for _, l := range lines {
			if strings.Contains(l, secret) {
				t.Errorf("a secret in the log: %s", l)
			}
		}
	}
	if got, _ := series(t, reg, "kvroute_picker_secret_reloads_total", map[string]string{"secret": "decision_token", "result": "ok"}); got != 1 {
		t.Errorf("%v token reloads counted, want 1", got)
	}
}

// startObserved starts a picker server following pod's sidecar, its
// configuration adjusted, logging to an observer at debug; it returns the
// server, the logs and the registry, and stops the server when the test
// ends.
func startObserved(t *testing.T, pod *testpod.Pod, adjust func(*picker.ServerConfig)) (*picker.Server, *observer.ObservedLogs, *prometheus.Registry) {
	t.Helper()
	cfg := picker.DefaultServerConfig()
	cfg.Listen, cfg.AdminListen, cfg.GRPCListen = "127.0.0.1:0", "127.0.0.1:0", ""
	cfg.Sidecars, cfg.Capacity, cfg.DrainDelay = []string{pod.Sidecar.GRPCAddr()}, capacity, 0
	adjust(&cfg)
	core, logs := observer.New(zap.DebugLevel)
	reg := prometheus.NewRegistry()
	s, err := picker.Start(context.Background(), cfg, zap.New(core), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, logs, reg
}
