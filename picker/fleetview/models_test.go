package fleetview_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestModelsFollowed: a view following only model a (Config.Models,
// issue 21) takes a's endpoints and streams their summaries; a sidecar of
// model b is asked what it serves and nothing more — its summaries are
// never streamed — and its endpoint is listed as not followed, counted.
func TestModelsFollowed(t *testing.T) {
	params := summary.ForCapacity(1024)
	a := simsidecar.Start(t, simsidecar.Config{Index: 0, Params: params, Model: "a"})
	b := simsidecar.Start(t, simsidecar.Config{Index: 1, Params: params, Model: "b"})
	cfg := viewConfig(params, 20*time.Millisecond)
	cfg.Models = []string{"a"}
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(cfg, zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch(a.Addr())
	v.Watch(b.Addr())
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		if len(v.Endpoints()) < 1 || len(v.Refused()) < 1 || a.Watches() < 1 {
			return fmt.Errorf("endpoints %v, refused %v, a's streams %d", v.Endpoints(), v.Refused(), a.Watches())
		}
		return nil
	})
	eps := v.Endpoints()
	if len(eps) != 1 || eps[0].URL != a.Endpoint() || eps[0].Info.Model != "a" {
		t.Errorf("endpoints %+v, want a's only", eps)
	}
	rf := v.Refused()
	if len(rf) != 1 || rf[0].Info.Endpoint != b.Endpoint() || rf[0].Reason != fleetview.ReasonModelNotFollowed || rf[0].Sidecar != b.Addr() {
		t.Errorf("refused %+v, want b's endpoint, not followed", rf)
	}
	if b.Infos() < 1 || b.Watches() != 0 {
		t.Errorf("b: %d Info calls, %d summary streams; want its identity asked, no stream", b.Infos(), b.Watches())
	}
	if got := gaugeValue(t, reg, "kvroute_picker_endpoints_not_followed"); got != 1 {
		t.Errorf("not followed gauge %v, want 1", got)
	}
	// Forgetting b drops its listing.
	v.Forget(b.Addr())
	if rf := v.Refused(); len(rf) != 0 {
		t.Errorf("refused after Forget: %+v", rf)
	}
	if b.Watches() != 0 {
		t.Errorf("b streamed %d times", b.Watches())
	}
}

// TestModelsConfig: an empty model name is refused; none means every
// model.
func TestModelsConfig(t *testing.T) {
	cfg := viewConfig(summary.ForCapacity(1024), time.Second)
	if err := cfg.Validate(); err != nil || len(cfg.Models) != 0 {
		t.Fatalf("default: %v, %q", err, cfg.Models)
	}
	for _, bad := range [][]string{{""}, {"a", " "}} {
		cfg.Models = bad
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "model") {
			t.Errorf("models %q: %v", bad, err)
		}
	}
	cfg.Models = []string{"a", "b"}
	if err := cfg.Validate(); err != nil {
		t.Error(err)
	}
}

// gaugeValue reads the gauge name (summed over its series), failing the
// test when it is not exported.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if metrictest.Series(families, name, nil) == 0 {
		t.Fatalf("no metric %s", name)
	}
	return metrictest.Sum(families, name, nil)
}
