package fleetview_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestConfig: DefaultConfig holds the documented defaults, Params has
// none, and zero values are invalid: New fills nothing in.
func TestConfig(t *testing.T) {
	d := fleetview.DefaultConfig()
	if d.Slots != 1024 || d.Retry != 500*time.Millisecond || d.TLS != nil || d.Params != (summary.Params{}) ||
		d.AllowRemote != nil || d.Lookup == nil || d.LookupTimeout != 2*time.Second {
		t.Fatalf("defaults %+v", d)
	}
	ok := d
	ok.Params = summary.ForCapacity(capacity)
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, adjust := range map[string]func(*fleetview.Config){
		"no params":               func(c *fleetview.Config) { c.Params = summary.Params{} },
		"zero slots":              func(c *fleetview.Config) { c.Slots = 0 },
		"too many slots":          func(c *fleetview.Config) { c.Slots = 16385 },
		"zero retry":              func(c *fleetview.Config) { c.Retry = 0 },
		"negative retry":          func(c *fleetview.Config) { c.Retry = -time.Second },
		"no lookup":               func(c *fleetview.Config) { c.Lookup = nil },
		"zero lookup timeout":     func(c *fleetview.Config) { c.LookupTimeout = 0 },
		"invalid allowed network": func(c *fleetview.Config) { c.AllowRemote = []netip.Prefix{{}} },
	} {
		c := ok
		adjust(&c)
		if c.Validate() == nil {
			t.Errorf("%s: valid", name)
		}
		if v, err := fleetview.New(c, zap.NewNop(), nil); err == nil {
			v.Close()
			t.Errorf("%s: New accepted it", name)
		}
	}
	if _, err := fleetview.New(fleetview.Config{Params: summary.ForCapacity(capacity)}, zap.NewNop(), nil); err == nil {
		t.Error("New filled in zero Slots and Retry")
	}
}

// TestFullGroupIsRefused: a sidecar offering more endpoints of one
// identity group than the view has slots gets the rest refused, counted
// and listed; the others are taken.
func TestFullGroupIsRefused(t *testing.T) {
	p := summary.ForCapacity(capacity)
	info := &pb.InfoResponse{}
	for _, url := range []string{"http://127.0.0.1:8000", "http://127.0.0.1:8001", "http://127.0.0.1:8002"} {
		info.Endpoints = append(info.Endpoints, &pb.EndpointInfo{Endpoint: url, Model: "m", BlockSize: 16,
			KeyFormat: blockkey.FormatV1, SummaryParams: p.String(), Epoch: 1})
	}
	addr := serveScripted(t, &scriptedSidecar{info: info, scripts: [][]*pb.SummaryUpdate{{}}})
	cfg := viewConfig(p, 20*time.Millisecond)
	cfg.Slots = 2
	reg := prometheus.NewRegistry()
	v, err := fleetview.New(cfg, zap.NewNop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch(addr)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !(len(v.Refused()) > 0) {
			return errors.New("not yet an endpoint refused")
		}
		return nil
	})
	r, eps := v.Refused(), v.Endpoints()
	if len(r) != 1 || r[0].Reason != "group_full" || r[0].Info.Endpoint != "http://127.0.0.1:8002" || r[0].Sidecar != addr {
		t.Fatalf("refused %+v", r)
	}
	if len(eps) != 2 || eps[0].URL != "http://127.0.0.1:8000" || eps[1].URL != "http://127.0.0.1:8001" || eps[0].Group != fleetview.GroupID(info.Endpoints[0]) {
		t.Fatalf("endpoints %+v", eps)
	}
	if n := metrictest.Gathered(t, reg, "kvroute_picker_endpoints_refused_total", nil); n != 1 {
		t.Fatalf("refused counter %v", n)
	}
	v.Forget(addr)
	if len(v.Refused()) != 0 {
		t.Fatalf("after Forget: refused %+v", v.Refused())
	}
	for _, e := range v.Endpoints() { // kept for the grace period, the sidecar lost
		if e.SidecarLost.IsZero() {
			t.Fatalf("after Forget: %s not marked as having lost its sidecar", e.URL)
		}
	}
}
