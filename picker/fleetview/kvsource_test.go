package fleetview_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/sidecar"
	testpod "github.com/kvroute/kvroute/test/pod"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestKVSourceReachesTheView: a sidecar started with --p2p-port advertises
// its engine's P2P side channel (the engine URL's host, the port) and the
// view's endpoint carries it; one without advertises none.
func TestKVSourceReachesTheView(t *testing.T) {
	with := testpod.Start(t, testpod.Options{Capacity: capacity, Sidecar: func(c *sidecar.Config) { c.P2PPort = 5710 }})
	without := testpod.Start(t, testpod.Options{Capacity: capacity})
	v, err := fleetview.New(viewConfig(summary.ForCapacity(capacity), 50*time.Millisecond), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.WatchStatic(with.Sidecar.GRPCAddr())
	v.WatchStatic(without.Sidecar.GRPCAddr())
	want := map[string]string{with.Engine.URL(): "127.0.0.1:5710", without.Engine.URL(): ""}
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		eps := v.Endpoints()
		if len(eps) != 2 {
			return fmt.Errorf("%d endpoints known, want 2", len(eps))
		}
		for _, e := range eps {
			if w, ok := want[e.URL]; !ok || e.Info.KVSource != w {
				return fmt.Errorf("endpoint %s: KV source %q, want %q", e.URL, e.Info.KVSource, w)
			}
		}
		return nil
	})
}

// TestKVSourceOf: an advertised KV source is taken only as host:port on
// the engine URL's own host; anything else is refused (never routed to).
func TestKVSourceOf(t *testing.T) {
	for _, tc := range []struct {
		endpoint, advertised, want string
		ok                         bool
	}{
		{"http://10.0.0.1:8000", "", "", true},
		{"http://10.0.0.1:8000", "10.0.0.1:5710", "10.0.0.1:5710", true},
		{"http://[fd00::7]:8001", "[fd00::7]:5711", "[fd00::7]:5711", true},
		{"http://Engine.Pod:8000", "engine.pod:5710", "Engine.Pod:5710", true},
		{"http://10.0.0.1:8000", "10.0.0.2:5710", "", false}, // another host: an engine would pull from elsewhere
		{"http://10.0.0.1:8000", "10.0.0.1", "", false},
		{"http://10.0.0.1:8000", "10.0.0.1:0", "", false},
		{"http://10.0.0.1:8000", "10.0.0.1:65536", "", false},
		{"http://10.0.0.1:8000", "10.0.0.1:+5710", "", false},
		{"http://10.0.0.1:8000", "10.0.0.1:05710", "", false},
		{"http://10.0.0.1:8000", "10.0.0.1:5710\nx", "", false},
		{"http://10.0.0.1:8000", "10.0.0.1:" + string(make([]byte, 400)), "", false},
		{"not a url", "10.0.0.1:5710", "", false},
	} {
		got, err := fleetview.KVSourceOf(tc.endpoint, tc.advertised)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("KVSourceOf(%q, %q) = %q, %v; want %q, ok=%v", tc.endpoint, tc.advertised, got, err, tc.want, tc.ok)
		}
	}
}

// TestForeignKVSourceIsDropped: a sidecar advertising a KV source on
// another host than its engine's gets its endpoint taken, without one.
func TestForeignKVSourceIsDropped(t *testing.T) {
	p := summary.ForCapacity(capacity)
	const url = "http://127.0.0.1:8000"
	info := &pb.InfoResponse{Endpoints: []*pb.EndpointInfo{{Endpoint: url, Model: "m", BlockSize: 16,
		KeyFormat: blockkey.FormatV1, SummaryParams: p.String(), Epoch: 1, KvSource: "192.0.2.9:5710"}}}
	s := &scriptedSidecar{info: info, scripts: [][]*pb.SummaryUpdate{{{Endpoint: url, Epoch: 1,
		Body: &pb.SummaryUpdate_Load{Load: &pb.LoadReport{}}}}}}
	addr := serveScripted(t, s)
	v, err := fleetview.New(viewConfig(p, 20*time.Millisecond), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch(addr)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		if eps := v.Endpoints(); len(eps) != 1 || !eps[0].HasLoad() {
			return fmt.Errorf("endpoints %v: want one, with a load report", eps)
		}
		return nil
	})
	if got := v.Endpoints()[0].Info.KVSource; got != "" {
		t.Fatalf("the foreign KV source was taken: %q", got)
	}
}
