package sidecar_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/sidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// pendingStart is a sidecar.Start running in a goroutine.
type pendingStart struct {
	done chan startResult
}

type startResult struct {
	s   *sidecar.Sidecar
	err error
}

// startAsync runs sidecar.Start in a goroutine; the test's cleanup stops a
// start still waiting and closes a started sidecar, bounded.
func startAsync(t *testing.T, cfg sidecar.Config) *pendingStart {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &pendingStart{done: make(chan startResult, 1)}
	go func() {
		s, err := sidecar.Start(ctx, cfg, zaptest.NewLogger(t), nil)
		p.done <- startResult{s, err}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case r := <-p.done:
			if r.s != nil {
				r.s.Close()
			}
		case <-time.After(30 * time.Second):
			t.Error("sidecar.Start did not return after its context ended")
		}
	})
	return p
}

// wait returns Start's result, failing t after timeout. The result goes
// back into the channel, so the cleanup still closes the sidecar.
func (p *pendingStart) wait(t *testing.T, timeout time.Duration) (*sidecar.Sidecar, error) {
	t.Helper()
	select {
	case r := <-p.done:
		p.done <- r
		return r.s, r.err
	case <-time.After(timeout):
		t.Fatalf("sidecar.Start did not return within %v", timeout)
		return nil, nil
	}
}

// returned reports whether Start has returned.
func (p *pendingStart) returned() bool {
	select {
	case r := <-p.done:
		p.done <- r
		return true
	default:
		return false
	}
}

// fetch GETs url: the status and the body.
func fetch(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// expect checks url answers status with a body containing every one of
// want.
func expect(url string, status int, want ...string) error {
	code, body, err := fetch(url)
	if err != nil {
		return err
	}
	if code != status {
		return fmt.Errorf("%s: %d %q, want %d", url, code, body, status)
	}
	for _, w := range want {
		if !strings.Contains(body, w) {
			return fmt.Errorf("%s: %q lacks %q", url, body, w)
		}
	}
	return nil
}

// TestAdminServesWhileWaitingForTheEngine: while Start waits for an engine
// that does not answer yet (a vLLM loading its model), the admin listener
// already serves: /healthz 200, /readyz 503 naming the engine and the
// error, /metrics with the engine down, Go's profiles (/debug/pprof/),
// the other debug paths 503 (unknown ones 404). Once the engine answers,
// the full surface takes over on the same address.
func TestAdminServesWhileWaitingForTheEngine(t *testing.T) {
	httpPort, events, replay := testnet.FreePort(t), testnet.FreePort(t), testnet.FreePort(t)
	engineURL := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	cfg := sidecar.DefaultConfig()
	cfg.EngineURL = engineURL
	cfg.KVEvents, cfg.Bind = fmt.Sprintf("tcp://127.0.0.1:%d", events), true // the engine's PUB connects
	cfg.Replay = fmt.Sprintf("tcp://127.0.0.1:%d", replay)
	cfg.AdminListen, cfg.GRPCListen = admin, "127.0.0.1:0"
	cfg.Capacity, cfg.ReplayTimeout = 4096, time.Second
	cfg.StartupTimeout = 2 * time.Minute // the test starts the engine well before
	p := startAsync(t, cfg)
	base := "http://" + admin

	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if err := expect(base+"/healthz", http.StatusOK); err != nil {
			return err
		}
		// The first attempt's error, once it failed (before: "no answer yet").
		return expect(base+"/readyz", http.StatusServiceUnavailable, `"ready":false`,
			"rank 0: waiting for the engine at "+engineURL+": ", "refused")
	})
	down := fmt.Sprintf(`kvroute_sidecar_engine_down{engine=%q} `, engineURL)
	for _, c := range []struct {
		path   string
		status int
		want   []string
	}{
		{"/metrics", http.StatusOK, []string{down + "1\n", fmt.Sprintf(`kvroute_sidecar_scrape_errors_total{engine=%q} 0`, engineURL)}},
		{"/debug/state", http.StatusServiceUnavailable, []string{`"starting":true`, `"engine":"` + engineURL + `"`}},
		{"/debug/keys?canonical=0000000000000001", http.StatusServiceUnavailable, []string{`"starting":true`}},
		{"/debug/events", http.StatusServiceUnavailable, []string{`"starting":true`}},
		{"/debug/nothing-here", http.StatusNotFound, nil},
		{"/debug/pprof/", http.StatusOK, []string{"href='heap?debug=1'"}}, // Go's profiles: the index, a profile
		{"/debug/pprof/heap", http.StatusOK, []string{"\x1f\x8b"}},
	} {
		if err := expect(base+c.path, c.status, c.want...); err != nil {
			t.Error(err)
		}
	}
	if p.returned() {
		t.Fatal("Start returned before the engine answered")
	}

	ecfg := engineConfig()
	ecfg.Port = httpPort
	ecfg.KVEvents.Endpoint = cfg.KVEvents
	ecfg.KVEvents.ReplayEndpoint = &cfg.Replay
	startEngine(t, ecfg)
	s, err := p.wait(t, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if s.DebugAddr() != admin {
		t.Fatalf("DebugAddr %s, want the listener opened at the start, %s", s.DebugAddr(), admin)
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		return expect(base+"/readyz", http.StatusOK, `"ready":true`)
	})
	if err := expect(base+"/metrics", http.StatusOK, down+"0\n"); err != nil {
		t.Error(err)
	}
	var state []sidecar.EndpointState
	if code := getJSON(t, base+"/debug/state", &state); code != http.StatusOK || len(state) != 1 || state[0].Identity.Endpoint != engineURL {
		t.Fatalf("/debug/state %d %+v", code, state)
	}
	if err := expect(base+"/debug/nothing-here", http.StatusNotFound); err != nil {
		t.Error(err)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1"} {
		if err := expect(base+path, http.StatusOK); err != nil {
			t.Error(err)
		}
	}
}

// TestFailedStartClosesTheAdminListener: a start that fails — the engine
// never answers within StartupTimeout, or the gRPC address is taken once
// it does — served the admin listener while it waited, and closed it
// before returning the error.
func TestFailedStartClosesTheAdminListener(t *testing.T) {
	t.Run("startup timeout", func(t *testing.T) {
		cfg := sidecar.DefaultConfig()
		cfg.EngineURL = fmt.Sprintf("http://127.0.0.1:%d", testnet.FreePort(t)) // nothing listens
		cfg.KVEvents = fmt.Sprintf("tcp://127.0.0.1:%d", testnet.FreePort(t))
		cfg.AdminListen, cfg.GRPCListen = fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), "127.0.0.1:0"
		cfg.StartupTimeout = 3 * time.Second
		failedStart(t, cfg, "did not answer", true)
	})
	t.Run("grpc listen", func(t *testing.T) {
		e := startEngine(t, engineConfig()).Engines()[0]
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		cfg := sidecarConfig(e)
		cfg.AdminListen, cfg.GRPCListen = fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), taken.Addr().String()
		failedStart(t, cfg, "--grpc-listen", false)
	})
}

// failedStart starts a sidecar with cfg, sees its admin listener answer
// (mustServe; else Start may fail first, the engine answering at once),
// waits for Start to fail with an error containing want, and checks the
// admin address refuses connections.
func failedStart(t *testing.T, cfg sidecar.Config, want string, mustServe bool) {
	t.Helper()
	p := startAsync(t, cfg)
	base := "http://" + cfg.AdminListen
	served := false
	testnet.Await(t, cfg.StartupTimeout+10*time.Second, 10*time.Millisecond, func() error {
		if p.returned() {
			return nil
		}
		code, _, err := fetch(base + "/healthz")
		if err == nil && code == http.StatusOK {
			served = true
			return nil
		}
		return fmt.Errorf("/healthz %d %v", code, err)
	})
	s, err := p.wait(t, cfg.StartupTimeout+30*time.Second)
	if err == nil || s != nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start: %v, %v; want an error containing %q", s, err, want)
	}
	if mustServe && !served {
		t.Fatal("Start failed before its admin listener answered /healthz")
	}
	c, err := net.DialTimeout("tcp", cfg.AdminListen, 2*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("the admin address %s still accepts connections after Start failed", cfg.AdminListen)
	}
}
