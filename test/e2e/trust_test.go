package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// pickFor asks a picker's decision API for a token-id prompt of model
// (no render call: nothing dials the endpoint) and returns the status and
// the endpoint chosen.
func pickFor(t *testing.T, picker, model string) (int, string) {
	t.Helper()
	tokens := make([]int, 64)
	for i := range tokens {
		tokens[i] = 100 + i
	}
	body, _ := json.Marshal(map[string]any{"model": model, "token_ids": tokens})
	resp, err := http.Post(picker+"/routing/v1/pick", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a struct {
		Endpoint string `json:"endpoint"`
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &a)
	return resp.StatusCode, a.Endpoint
}

// TestRemoteEndpointRefusedAndListed (issue 22): real processes on
// 127.0.0.1 — an engine with its sidecar and a picker with default flags,
// all in one gossip — plus a rogue gossip member calling itself a sidecar
// (the real summary stream protocol), which the picker dials at
// 127.0.0.1 and which advertises an engine on another host, 203.0.113.7
// (never dialled). The honest
// endpoint is taken and routed; the rogue's is refused: not routed,
// listed on /debug/endpoints with its sidecar, reason, since when and
// why, counted, logged once, and failed by kvroute verify with the
// remedy. A second picker given --allow-remote-endpoints covering it takes
// and routes it.
func TestRemoteEndpointRefusedAndListed(t *testing.T) {
	bin := buildKvroute(t)
	const rogueURL, rogueModel = "http://203.0.113.7:8000", "rogue/model"
	seed := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
	engineArgs := startEngine(t, bin)
	honestURL := engineArgs[1]
	run(t, bin, append([]string{"sidecar", "--admin-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--gossip-bind", seed,
		"--node-name", "honest-sidecar", "--log-level", "warn"}, engineArgs...)...)
	// The rogue: a gossip member (the local fleet's gossip has no keyring)
	// calling itself a sidecar at its gRPC address.
	rogue := simsidecar.Start(t, simsidecar.Config{Params: summary.ForCapacity(4096), Model: rogueModel, Endpoint: rogueURL, Still: true})
	gcfg := gossip.LocalConfig("rogue-sidecar")
	gcfg.Join = []string{seed}
	members, err := gossip.New(gcfg, gossip.Meta{Role: gossip.RoleSidecar, GRPC: rogue.Addr()}, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = members.Close() })
	// startPicker returns the picker's public and admin URLs.
	startPicker := func(name string, extra ...string) (string, string, *output) {
		api, admin := fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t)), fmt.Sprintf("127.0.0.1:%d", testnet.FreePort(t))
		out := run(t, bin, append([]string{"picker", "--listen", api, "--admin-listen", admin, "--grpc-listen", "", "--drain-delay", "0",
			"--gossip-bind", "127.0.0.1:0", "--join", seed, "--node-name", name, "--capacity", "4096", "--log-level", "warn"}, extra...)...)
		return "http://" + api, "http://" + admin, out
	}

	// Default flags: the honest endpoint only.
	picker, admin, out := startPicker("picker-default")
	var dbg debugapi.Document
	testnet.Await(t, 30*time.Second, 100*time.Millisecond, func() error {
		var err error
		if dbg, err = debugEndpoints(admin); err != nil {
			return err
		}
		if len(dbg.Endpoints) != 1 || len(dbg.Refused) != 1 {
			return fmt.Errorf("the picker has not listed the honest endpoint and the refused one: %d endpoints, %d refused", len(dbg.Endpoints), len(dbg.Refused))
		}
		return nil
	})
	if e := dbg.Endpoints[0]; e.Endpoint != honestURL || !strings.HasPrefix(e.Sidecar, "127.0.0.1:") {
		t.Fatalf("endpoint %+v, want %s", e, honestURL)
	}
	r := dbg.Refused[0]
	since, perr := time.Parse(time.RFC3339Nano, r.Since)
	if r.Endpoint != rogueURL || r.Sidecar != rogue.Addr() || r.Reason != "remote_endpoint" || perr != nil || time.Since(since) > time.Minute ||
		!strings.Contains(r.Detail, "203.0.113.7") || !strings.Contains(r.Detail, "127.0.0.1") {
		t.Fatalf("refused %+v (since: %v)", r, perr)
	}
	// Not routed; the honest endpoint is.
	if code, ep := pickFor(t, picker, rogueModel); code == http.StatusOK || ep != "" {
		t.Fatalf("the rogue's model was routed: %d %s", code, ep)
	}
	completion, _ := json.Marshal(map[string]any{"model": "Qwen/Qwen3-0.6B", "prompt": "trusted endpoints only", "max_tokens": 1})
	resp, err := http.Post(picker+"/v1/completions", "application/json", bytes.NewReader(completion))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("x-kvroute-endpoint") != honestURL {
		t.Fatalf("completion: %d from %q, want 200 from %s", resp.StatusCode, resp.Header.Get("x-kvroute-endpoint"), honestURL)
	}
	// Counted, and logged once, however often the rogue is asked again.
	fams := metrictest.Families(t, admin+"/metrics")
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kvroute_picker_endpoints_untrusted", map[string]string{"reason": "remote_endpoint"}, 1},
		{"kvroute_picker_endpoints_untrusted", map[string]string{"reason": "unresolved_endpoint"}, 0},
		{"kvroute_picker_trust_refusals_total", map[string]string{"reason": "remote_endpoint"}, 1},
		{"kvroute_picker_endpoints_refused_total", nil, 1},
	} {
		if v, ok := sample(fams, c.name, c.labels); !ok || v != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if n := strings.Count(out.String(), "endpoint refused: not trusted from this sidecar"); n != 1 {
		t.Errorf("%d refusal log lines, want 1:\n%s", n, out.String())
	}
	// kvroute verify fails the refused endpoint, with the remedy.
	v := runVerify(t, bin, "--picker", picker, "--picker-admin", admin, "--json")
	found := false
	for _, c := range v.Checks {
		if c.Endpoint == rogueURL {
			found = true
			if c.OK || c.Name != "routable" || !strings.Contains(c.Detail, "remote_endpoint") || !strings.Contains(c.Cause, "--allow-remote-endpoints") {
				t.Errorf("verify's check of the rogue endpoint: %+v", c)
			}
		}
	}
	if !found || v.code != 1 || v.OK {
		t.Fatalf("verify: exit %d, ok %v, rogue checked %v\n%s", v.code, v.OK, found, v.raw)
	}

	// --allow-remote-endpoints covering it: taken and routed.
	allowed, allowedAdmin, _ := startPicker("picker-allowed", "--allow-remote-endpoints", "198.51.100.0/24,203.0.113.0/24")
	testnet.Await(t, 30*time.Second, 100*time.Millisecond, func() error {
		var err error
		if dbg, err = debugEndpoints(allowedAdmin); err != nil {
			return err
		}
		if len(dbg.Endpoints) != 2 || len(dbg.Refused) != 0 {
			return fmt.Errorf("the allowing picker has not taken both endpoints: %d endpoints, %d refused", len(dbg.Endpoints), len(dbg.Refused))
		}
		return nil
	})
	testnet.Await(t, 10*time.Second, 100*time.Millisecond, func() error {
		if code, ep := pickFor(t, allowed, rogueModel); code != http.StatusOK || ep != rogueURL {
			return fmt.Errorf("the allowed endpoint is not routed: pick: %d %q", code, ep)
		}
		return nil
	})
	fams = metrictest.Families(t, allowedAdmin+"/metrics")
	if v, ok := sample(fams, "kvroute_picker_endpoints_untrusted", map[string]string{"reason": "remote_endpoint"}); !ok || v != 0 {
		t.Fatalf("untrusted with the network allowed: %v (present %v)", v, ok)
	}
}
