package sidecar_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestGossipFaultSwitch: with fault injection on, POST /debug/fault/gossip
// validates its body, cuts the sidecar off gossip (another member sees it
// leave) and heals it (the member sees it again); without fault injection
// the path does not exist.
func TestGossipFaultSwitch(t *testing.T) {
	e := startEngine(t, engineConfig()).Engines()[0]
	cfg := sidecarConfig(e)
	g := gossip.LocalConfig("fault-sidecar")
	g.BindPort = testnet.FreePort(t)
	cfg.Gossip, cfg.FaultInjection = &g, true
	s := startSidecar(t, cfg)
	seed := fmt.Sprintf("127.0.0.1:%d", g.BindPort)
	og := gossip.LocalConfig("fault-observer")
	og.Join = []string{seed}
	obs, err := gossip.New(og, gossip.Meta{Role: gossip.RolePicker}, zaptest.NewLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.Close() })
	sees := func(want bool) func() error {
		return func() error {
			got := false
			for _, m := range obs.Members() {
				got = got || m.Name == "fault-sidecar"
			}
			if got != want {
				return fmt.Errorf("the observer sees the sidecar: %v, want %v (%d members)", got, want, len(obs.Members()))
			}
			return nil
		}
	}
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, sees(true))
	url := "http://" + s.DebugAddr() + "/debug/fault/gossip"
	postCode := func(body string) int {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, bad := range []string{``, `{}`, `{"partitioned":"yes"}`, `{"partitioned":1}`, `{"partitioned":true,"extra":1}`,
		`{"partitioned":true}{"partitioned":false}`, `[true]`, `{"partitioned":true` + strings.Repeat(" ", 2048) + `}`} {
		if code := postCode(bad); code != http.StatusBadRequest && code != http.StatusRequestEntityTooLarge {
			t.Errorf("body %.40q: %d, want 400 (or 413)", bad, code)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	testnet.Await(t, 2*time.Second, 20*time.Millisecond, sees(true)) // no bad body cut it
	if code := postCode(`{"partitioned": true}`); code != http.StatusOK {
		t.Fatalf("partition: %d", code)
	}
	testnet.Await(t, 20*time.Second, 50*time.Millisecond, sees(false))
	if code := postCode(`{"partitioned": false}`); code != http.StatusOK {
		t.Fatalf("heal: %d", code)
	}
	testnet.Await(t, 20*time.Second, 50*time.Millisecond, sees(true))

	// Off by default: no such path.
	plain := startSidecar(t, sidecarConfig(e))
	resp, err := http.Post("http://"+plain.DebugAddr()+"/debug/fault/gossip", "application/json", strings.NewReader(`{"partitioned":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("without fault injection: %d, want 404 or 405", resp.StatusCode)
	}
}
