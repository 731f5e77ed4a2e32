package pod

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/sidecar"
	"github.com/kvroute/kvroute/test/enginesim"
)

// Options shape a pod; zero fields take the defaults noted.
type Options struct {
	GPUBlocks   int                     // engine KV blocks; default 2048
	MaxModelLen int                     // default 8192
	Capacity    int                     // summary capacity; default 4096
	Scrape      time.Duration           // sidecar scrape interval; default the sidecar's
	Gossip      *gossip.Config          // the sidecar joins gossip when set
	Engine      func(*enginesim.Config) // adjusts the engine's configuration last
	Sidecar     func(*sidecar.Config)   // adjusts the sidecar's configuration last
	SidecarLog  *zap.Logger             // the sidecar's logger; default none
}

// Pod is a running engine and sidecar.
type Pod struct {
	Process *enginesim.Process
	Engine  *enginesim.Engine
	Sidecar *sidecar.Sidecar
}

// Start runs a pod until the test ends.
func Start(t testing.TB, o Options) *Pod {
	t.Helper()
	ecfg := enginesim.DefaultConfig()
	ecfg.Host, ecfg.Port = "127.0.0.1", 0
	ecfg.NumGPUBlocks, ecfg.MaxModelLen = or(o.GPUBlocks, 2048), or(o.MaxModelLen, 8192)
	ecfg.Sim.TimeScale = 0
	ecfg.EnableScaleOutEndpoints, ecfg.EnablePromptTokensDetails = true, true
	replay := "tcp://127.0.0.1:*"
	ecfg.KVEvents.EnableKVCacheEvents, ecfg.KVEvents.Endpoint, ecfg.KVEvents.ReplayEndpoint = true, "tcp://127.0.0.1:*", &replay
	if o.Engine != nil {
		o.Engine(&ecfg)
	}
	p, err := enginesim.Start(ecfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e := p.Engines()[0]
	scfg := sidecar.DefaultConfig()
	scfg.EngineURL, scfg.KVEvents, scfg.Replay = e.URL(), e.EventsEndpoint(), e.ReplayEndpoint()
	scfg.AdminListen, scfg.GRPCListen, scfg.Capacity = "127.0.0.1:0", "127.0.0.1:0", or(o.Capacity, 4096)
	scfg.StartupTimeout = 10 * time.Second
	if o.Scrape > 0 {
		scfg.ScrapeInterval = o.Scrape
	}
	scfg.Gossip = o.Gossip
	if o.Sidecar != nil {
		o.Sidecar(&scfg)
	}
	log := o.SidecarLog
	if log == nil {
		log = zap.NewNop()
	}
	s, err := sidecar.Start(context.Background(), scfg, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &Pod{Process: p, Engine: e, Sidecar: s}
}

func or(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}
