package fleetview_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	fleetpkg "github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestEngineStatsReachTheView: the engine's own request figures, scraped
// by its sidecar, reach the view's fleet state with every load report:
// cumulative counts of the requests served, their prompt and cached
// tokens, and sums on the engine's clock (queue + prefill = TTFT).
func TestEngineStatsReachTheView(t *testing.T) {
	p := startPodWith(t, 0, "", podOptions{gpuBlocks: 2048, capacity: capacity, scrape: 20 * time.Millisecond})
	v, err := fleetview.New(viewConfig(summary.ForCapacity(capacity), 50*time.Millisecond), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.WatchStatic(p.sidecar.GRPCAddr())
	// The second prompt repeats the first: its 4 full blocks of 16 are cached.
	for _, toks := range [][]uint32{tokens(80, 21000), tokens(80, 21000), tokens(40, 23000)} {
		complete(t, p.engine, toks)
	}
	testnet.Await(t, 15*time.Second, 20*time.Millisecond, func() error {
		eps := v.Endpoints()
		if len(eps) != 1 {
			return fmt.Errorf("%d endpoints known", len(eps))
		}
		g := eps[0].Load.Engine
		if !g.Have || g.TTFTCount != 3 || g.QueueCount != 3 || g.PrefillCount != 3 || g.PromptTokens != 200 || g.CachedTokens != 64 {
			return fmt.Errorf("engine figures %+v; want have, 3 requests, 200 prompt tokens, 64 cached", g)
		}
		if g.TTFTSeconds <= 0 || math.Abs(g.QueueSeconds+g.PrefillSeconds-g.TTFTSeconds) > 1e-9 {
			return fmt.Errorf("sums %+v; want queue + prefill = TTFT > 0", g)
		}
		return nil
	})
}

// TestSimulatedSidecarReportsAnIdleEngine: a simulated sidecar's load
// reports are an idle current vLLM's: request figures present (have),
// every one 0.
func TestSimulatedSidecarReportsAnIdleEngine(t *testing.T) {
	params := summary.ForCapacity(1024)
	s := simsidecar.Start(t, simsidecar.Config{Index: 0, Params: params})
	v, err := fleetview.New(viewConfig(params, 20*time.Millisecond), zap.NewNop(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.Watch(s.Addr())
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		eps := v.Endpoints()
		if len(eps) != 1 || !eps[0].HasLoad() {
			return fmt.Errorf("endpoints %v: want one, with a load report", eps)
		}
		if g := eps[0].Load.Engine; g != (fleetpkg.EngineStats{Have: true}) {
			return fmt.Errorf("engine figures %+v, want have and zeros", g)
		}
		return nil
	})
}
