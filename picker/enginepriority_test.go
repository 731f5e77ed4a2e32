package picker_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/picker"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/metrictest"
)

// proxied posts a completion of n repeated words through the picker's
// proxy as tenant (x-kvroute-tenant), in band (x-kvroute-priority, ""
// none), and returns the status and the engine priority the answer says
// the engine ran it with ("" none).
func (f *fleet) proxied(t *testing.T, tenantName, band string, n int) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"Qwen/Qwen3-0.6B","prompt":%q,"max_tokens":1}`, strings.Repeat("tenant "+tenantName+" asks ", n))
	req, _ := http.NewRequest(http.MethodPost, f.api.URL+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Kvroute-Tenant", tenantName)
	if band != "" {
		req.Header.Set(picker.PriorityHeader, band)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Logf("%s", raw)
	}
	return resp.StatusCode, resp.Header.Get("X-Kvroute-Engine-Priority")
}

// TestEnginePriorityAssignment: with --engine-priority every forwarded
// request carries vLLM's priority, on a table of tenant loads: a tenant
// alone runs at 0; beside a tenant sending a tenth of its load it is
// beyond its share (1) and the light one within (0); the band
// (x-kvroute-priority, higher first) outranks the standing (−2 per band);
// a new tenant starts within. The engine (--scheduling-policy priority)
// accepts them all.
func TestEnginePriorityAssignment(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.EnginePriority = true
	f := startFleetWith(t, 1, cfg, "", func(c *enginesim.Config) { c.SchedulingPolicy = "priority" })
	for i, step := range []struct {
		tenant, band string
		times        int
		want         string
	}{
		{"heavy", "", 10, "0"},  // alone: within, whatever it sends
		{"light", "", 1, "0"},   // first request: within
		{"heavy", "", 3, "1"},   // 10+ to 1: beyond
		{"light", "", 1, "0"},   // within
		{"heavy", "1", 1, "-1"}, // band 1 beyond: −2+1
		{"light", "-1", 1, "2"}, // band −1 within: +2
		{"newco", "", 1, "0"},   // a new tenant: within
		{"heavy", "-1", 1, "3"}, // band −1 beyond
		{"light", "2", 1, "-4"}, // band 2 within
	} {
		for n := 0; n < step.times; n++ {
			code, got := f.proxied(t, step.tenant, step.band, 40)
			if code != http.StatusOK || got != step.want {
				t.Fatalf("step %d (%s, band %q, #%d): %d, engine priority %q, want 200, %q", i, step.tenant, step.band, n, code, got, step.want)
			}
		}
	}
	if n := metrictest.Gathered(t, f.reg, "kvroute_picker_engine_priority_total", map[string]string{"standing": "beyond"}); n != 5 {
		t.Fatalf("%v requests counted beyond their share, want 5", n)
	}
}

// TestEnginePriorityRefused: an engine started without
// --scheduling-policy priority refuses a non-zero priority (vLLM's 400):
// the picker resends the request without one, so the client gets its
// answer (no engine priority on it), and the refusal is counted. Without
// --engine-priority nothing is set.
func TestEnginePriorityRefused(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.EnginePriority = true
	f := startFleet(t, 1, cfg, "") // fcfs engines
	if code, got := f.proxied(t, "acme", "", 20); code != http.StatusOK || got != "0" {
		t.Fatalf("priority 0 on an fcfs engine: %d %q, want 200 \"0\"", code, got)
	}
	for i := 0; i < 3; i++ {
		if code, got := f.proxied(t, "acme", "1", 20); code != http.StatusOK || got != "" {
			t.Fatalf("band 1 on an fcfs engine: %d, engine priority %q; want 200 without one", code, got)
		}
	}
	if n := metrictest.Gathered(t, f.reg, "kvroute_picker_engine_priority_refused_total", map[string]string{"engine": "all"}); n != 3 {
		t.Fatalf("%v refusals counted, want 3", n)
	}
	// /debug/endpoints names the engine (kvroute verify fails on it).
	resp, err := http.Get(f.admin.URL + "/debug/endpoints")
	if err != nil {
		t.Fatal(err)
	}
	var doc debugapi.Document
	err = json.NewDecoder(resp.Body).Decode(&doc)
	resp.Body.Close()
	if err != nil || doc.Picker.EnginePriority == nil || !slices.Equal(doc.Picker.EnginePriority.RefusedBy, []string{f.engines[0].URL()}) {
		t.Fatalf("/debug/endpoints: %v %+v, want engine_priority.refused_by [%s]", err, doc.Picker, f.engines[0].URL())
	}
	off := startFleet(t, 1, picker.DefaultConfig(), "")
	if code, got := off.proxied(t, "acme", "1", 20); code != http.StatusOK || got != "" {
		t.Fatalf("without --engine-priority: %d %q", code, got)
	}
}

// TestEnginePriorityDecisions: the decision API's answer carries the
// engine priority (HTTP priority, gRPC priority and has_priority), keyed
// by the request's tenant and band as the proxy's are; without
// --engine-priority none.
func TestEnginePriorityDecisions(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.EnginePriority = true
	f := startFleetWith(t, 1, cfg, "", func(c *enginesim.Config) { c.SchedulingPolicy = "priority" })
	body := fmt.Sprintf(`{"model":"Qwen/Qwen3-0.6B","prompt":%q}`, strings.Repeat("decide this ", 40))
	hdr := http.Header{"X-Kvroute-Tenant": {"acme"}, picker.PriorityHeader: {"3"}}
	code, a, raw := f.pick(t, body, hdr, "")
	if code != http.StatusOK || a.Priority == nil || *a.Priority != -6 {
		t.Fatalf("HTTP: %d %s, want priority -6 (band 3)", code, raw)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-kvroute-tenant", "acme", "x-kvroute-priority", "-1")
	got, err := f.grpcClient(t, "").Pick(ctx, &pb.PickRequest{Body: []byte(body)})
	if err != nil || !got.GetHasPriority() || got.GetPriority() != 2 {
		t.Fatalf("gRPC: %v %v, want priority 2 (band -1)", got, err)
	}
	off := startFleet(t, 1, picker.DefaultConfig(), "")
	if code, a, raw := off.pick(t, body, hdr, ""); code != http.StatusOK || a.Priority != nil || strings.Contains(string(raw), `"priority"`) {
		t.Fatalf("without --engine-priority: %d %s", code, raw)
	}
}
