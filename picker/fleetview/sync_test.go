package fleetview_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker/fleetview"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestSyncCountsLoadedSummaries: Sync counts the endpoints held and,
// among them, those whose sidecar's first state is applied (reported)
// and those whose summary is loaded: an endpoint whose sidecar sends
// nothing is held, neither reported nor loaded, and the view not synced;
// the snapshots received are counted, none left waiting once written.
func TestSyncCountsLoadedSummaries(t *testing.T) {
	p := summary.ForCapacity(1024)
	sim := simsidecar.Start(t, simsidecar.Config{Index: 0, Params: p, Still: true})
	silent := serveScripted(t, &scriptedSidecar{info: offer(p, "http://127.0.0.1:8001"), scripts: [][]*pb.SummaryUpdate{{}}})
	v, err := fleetview.New(viewConfig(p, 20*time.Millisecond), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if s := v.Sync(); s != (fleetview.Sync{}) {
		t.Fatalf("an empty view's sync: %+v", s)
	}
	v.Watch(sim.Addr())
	v.Watch(silent)
	want := fleetview.Sync{Endpoints: 2, Reported: 1, Loaded: 1, Snapshots: 1}
	testnet.Await(t, 10*time.Second, 5*time.Millisecond, func() error {
		if s := v.Sync(); s != want {
			return fmt.Errorf("sync %+v, want %+v", s, want)
		}
		return nil
	})
	if v.Sync().Synced() {
		t.Error("synced with an endpoint that never reported")
	}
	v.Forget(silent) // its endpoint stays, for the grace period, unreported
	if v.Sync().Synced() {
		t.Error("synced with an endpoint that never reported, its sidecar lost")
	}
}

// TestSynced: a view is synced once it holds an endpoint and every one
// has reported, with no snapshot waiting.
func TestSynced(t *testing.T) {
	for _, c := range []struct {
		s    fleetview.Sync
		want bool
	}{
		{fleetview.Sync{}, false},
		{fleetview.Sync{Endpoints: 2, Reported: 2, Loaded: 1}, true}, // one engine with nothing cached: no summary to load
		{fleetview.Sync{Endpoints: 2, Reported: 1, Loaded: 2}, false},
		{fleetview.Sync{Endpoints: 2, Reported: 2, Loaded: 2, Snapshots: 3, Waiting: 1}, false}, // a reload under way
	} {
		if got := c.s.Synced(); got != c.want {
			t.Errorf("%+v: synced %v, want %v", c.s, got, c.want)
		}
	}
}
