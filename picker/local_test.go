package picker_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	fleetpkg "github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/localfleet"
	"github.com/kvroute/kvroute/test/enginesim"
)

// loadReportEvery is how often the in-process fleet's load reporter gives
// it each engine's figures: the pods' sidecars scrape every 50 ms here.
const loadReportEvery = 50 * time.Millisecond

// startLocalWith is startFleetWith without the sockets between the
// engines and the picker's fleet: n simulated engines in this process
// (their HTTP API on loopback, which the router renders and proxies
// through), whose KV events go straight to an in-process fleet
// (picker/localfleet, the sidecar's own cores) through the engine's event
// sink — no ZMQ, no sidecar, no gRPC stream, no gossip — and a load
// reporter giving the fleet each engine's waiting, running and KV usage
// every loadReportEvery, as a sidecar's scrape would. An engine answers
// only after its step's events reached the fleet, so what an answer
// cached is matched by the next request, without waiting.
func startLocalWith(t testing.TB, n int, cfg picker.Config, token string, adjust func(*enginesim.Config)) *fleet {
	t.Helper()
	lcfg := localfleet.DefaultConfig()
	lcfg.Params, lcfg.Health = summary.ForCapacity(capacity), cfg.Health
	lf, err := localfleet.New(lcfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{view: lf, local: lf, down: map[string]*atomic.Bool{}}
	for i := 0; i < n; i++ {
		f.startLocalEngine(t, lf, adjust)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(loadReportEvery)
		defer tick.Stop()
		for {
			f.reportLoads()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
	f.serve(t, cfg, token)
	return f
}

// startLocalEngine starts one engine process (every data-parallel rank an
// endpoint) feeding lf.
func (f *fleet) startLocalEngine(t testing.TB, lf *localfleet.Fleet, adjust func(*enginesim.Config)) {
	t.Helper()
	ecfg := enginesim.DefaultConfig()
	ecfg.Host, ecfg.Port = "127.0.0.1", 0
	ecfg.NumGPUBlocks, ecfg.MaxModelLen = 2048, 8192
	ecfg.Sim.TimeScale = 0
	ecfg.EnableScaleOutEndpoints, ecfg.EnablePromptTokensDetails = true, true
	if adjust != nil {
		adjust(&ecfg)
	}
	ecfg.KVEvents.EnableKVCacheEvents = false // the sink instead of ZMQ
	var urls atomic.Pointer[[]string]         // by rank, once started
	ecfg.EventSink = func(b kvevents.Batch) {
		u := *urls.Load()
		rank := 0
		if b.DataParallelRank.Valid {
			rank = int(b.DataParallelRank.Value)
		}
		if err := lf.Update(u[rank], &b, time.Now()); err != nil {
			t.Errorf("in-process fleet: %s: %v", u[rank], err)
		}
	}
	p, err := enginesim.Start(ecfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	var u []string
	for _, e := range p.Engines() {
		u = append(u, e.URL())
		id := fleetpkg.Identity{Endpoint: e.URL(), Rank: e.Rank(), Model: servedName(&ecfg), BlockSize: ecfg.BlockSize,
			NumGPUBlocks: ecfg.NumGPUBlocks, HashAlgo: ecfg.HashAlgo, KeyFormat: blockkey.FormatV1, TokenizerFingerprint: "inproc"}
		if err := lf.Add(id, time.Now()); err != nil {
			t.Fatal(err)
		}
		f.engines = append(f.engines, e)
		f.procs = append(f.procs, p)
		f.down[e.URL()] = &atomic.Bool{}
	}
	urls.Store(&u)
}

// reportLoads gives the in-process fleet every engine's load figures, or
// engine_down for one the test stopped, as a sidecar's scrape would.
func (f *fleet) reportLoads() {
	now := time.Now()
	for _, e := range f.engines {
		l := fleetpkg.Load{EngineDown: f.down[e.URL()].Load()}
		if l.EngineDown {
			l.EngineError = "connection refused"
		} else {
			el := e.Load()
			l.Waiting, l.Running, l.KVCacheUsage = float64(el.Waiting), float64(el.Running), el.KVUsage
		}
		f.local.SetLoad(e.URL(), l, now)
	}
}

// servedName is the model name an engine serves under, as a sidecar
// learns it from /v1/models: the first --served-model-name, else --model.
func servedName(c *enginesim.Config) string {
	if len(c.ServedModelNames) > 0 {
		return c.ServedModelNames[0]
	}
	return c.Model
}
