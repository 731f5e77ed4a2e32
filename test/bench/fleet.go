package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/sidecar"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/enginesim/profile"
)

// FleetConfig shapes a benchmark fleet.
type FleetConfig struct {
	Engines   int // default 2
	GPUBlocks int // KV blocks per engine; default 2048
	BlockSize int // default 16
	// MaxModelLen is the engines' context length; default the cache's
	// size less a block, at most 32768.
	MaxModelLen int
	TimeScale   float64       // engine time scale: 1 real time, 0 no waiting
	Policy      score.Policy  // the picker's policy
	Log         *zap.Logger   // nil: quiet
	Ready       time.Duration // bound on the fleet coming up; default 30 s
	// PickerListen is the (first) picker's HTTP address; default
	// 127.0.0.1:0.
	PickerListen string
	// Pickers is how many pickers share the fleet (default 1). With more
	// than one, each has its own HTTP, admin, gRPC and bookings
	// (picker.ServerConfig.PeerListen) listeners on free 127.0.0.1 ports,
	// its own metrics registry and its own state (peer policies keep one
	// per replica, as in their own systems), and is told every picker's
	// bookings address (PeerPickers) to exchange bookings with. One
	// picker runs without gRPC, as before.
	Pickers int
	// LoadEpsilon, when set, is the picker's bounded-load factor ε
	// (default the picker's, 0.25).
	LoadEpsilon *float64
	// SaturationPrefillTokens, when set, is the picker's admission limit
	// on prefill tokens in flight per endpoint (default the picker's).
	SaturationPrefillTokens *float64
	// PolicySeed seeds a peer policy's random tie-breaks (the run's seed).
	PolicySeed uint64
	// EnginePriority runs the engines with --scheduling-policy priority
	// and, for kvroute's own policies, the pickers with --engine-priority.
	// A peer policy's picker sets no priority (its own system does not),
	// so its requests all run at vLLM's default 0: first come, first
	// served, as without.
	EnginePriority bool
	// Profile names the engines' latency profile (package
	// test/enginesim/profile; "" is sim-default): their step, prefill
	// and decode costs, chunk budget and context length cap. Their KV
	// capacity stays GPUBlocks; the picker is told nothing of it.
	Profile string
	// CPUBlocks, when positive, gives every engine vLLM's OffloadingConnector
	// with a CPU tier of that many blocks (cpu_bytes_to_use at the
	// profile's KV bytes a token) and its P2P tier on a free port, which
	// its sidecar advertises (--p2p-port).
	CPUBlocks int
}

// Fleet is a running benchmark fleet.
type Fleet struct {
	cfg      FleetConfig
	procs    []*enginesim.Process
	engines  []*enginesim.Engine
	sidecars []*sidecar.Sidecar
	pickers  []*picker.Server
	regs     []*prometheus.Registry // each picker's metrics
}

// PickerStats are figures read from the pickers' metrics, summed over
// the pickers (the overhead histogram merged).
type PickerStats struct {
	Overhead       PickOverhead // arrival → dispatch, per attempt
	Outcomes       map[string]float64
	Decisions      map[string]float64 // by reason
	LoadOverrides  float64            // best-cached endpoint skipped at the load cap
	OverrideTokens float64            // cached tokens given up by them
}

// PickerStats reads the pickers' metrics and sums them.
func (f *Fleet) PickerStats() (PickerStats, error) {
	st := PickerStats{Outcomes: map[string]float64{}, Decisions: map[string]float64{}}
	var overhead *dto.Histogram
	for _, reg := range f.regs {
		families, err := reg.Gather()
		if err != nil {
			return st, err
		}
		for _, fam := range families {
			if fam.GetName() == "kvroute_picker_proxy_overhead_seconds" {
				overhead = mergeHistogram(overhead, fam.Metric[0].GetHistogram())
				continue
			}
			addPickerFamily(&st, fam)
		}
	}
	if overhead != nil {
		st.Overhead = overheadOf(overhead)
	}
	return st, nil
}

// mergeHistogram adds h to sum (nil: none yet; the pickers' histograms
// share their buckets) and returns the sum.
func mergeHistogram(sum, h *dto.Histogram) *dto.Histogram {
	if sum == nil {
		out := &dto.Histogram{SampleCount: proto.Uint64(h.GetSampleCount()), SampleSum: proto.Float64(h.GetSampleSum())}
		for _, b := range h.Bucket {
			out.Bucket = append(out.Bucket, &dto.Bucket{UpperBound: proto.Float64(b.GetUpperBound()), CumulativeCount: proto.Uint64(b.GetCumulativeCount())})
		}
		return out
	}
	sum.SampleCount = proto.Uint64(sum.GetSampleCount() + h.GetSampleCount())
	sum.SampleSum = proto.Float64(sum.GetSampleSum() + h.GetSampleSum())
	for i, b := range sum.Bucket {
		if i < len(h.Bucket) && h.Bucket[i].GetUpperBound() == b.GetUpperBound() {
			b.CumulativeCount = proto.Uint64(b.GetCumulativeCount() + h.Bucket[i].GetCumulativeCount())
		}
	}
	return sum
}

// addPickerFamily adds one picker's metric family to st.
func addPickerFamily(st *PickerStats, fam *dto.MetricFamily) {
	byLabel := func(into map[string]float64, label string) {
		for _, m := range fam.Metric {
			for _, l := range m.Label {
				if l.GetName() == label {
					into[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	switch fam.GetName() {
	case "kvroute_picker_decisions_total":
		byLabel(st.Decisions, "reason")
	case "kvroute_picker_outcomes_total":
		byLabel(st.Outcomes, "outcome")
	case "kvroute_picker_load_overrides_total":
		st.LoadOverrides += fam.Metric[0].GetCounter().GetValue()
	case "kvroute_picker_load_override_tokens_total":
		st.OverrideTokens += fam.Metric[0].GetCounter().GetValue()
	}
}

// overheadOf reads the overhead histogram: the mean exactly (the sum of
// the raw samples ÷ their count), the quantiles as bucket bounds.
func overheadOf(h *dto.Histogram) PickOverhead {
	o := PickOverhead{Note: pickOverheadNote}
	n := h.GetSampleCount()
	if n == 0 {
		return o
	}
	o.Samples, o.Mean = int(n), h.GetSampleSum()/float64(n)*1e6
	// The bucket holding the quantile: its upper bound; past the last
	// finite bound, that bound, marked beyond (JSON has no infinity).
	q := func(p float64) (bound float64, beyond bool) {
		for _, bk := range h.Bucket {
			if math.IsInf(bk.GetUpperBound(), 1) {
				break
			}
			bound = bk.GetUpperBound() * 1e6
			if float64(bk.GetCumulativeCount()) >= p*float64(n) {
				return bound, false
			}
		}
		return bound, true
	}
	o.P50Bound, o.P50Beyond = q(0.5)
	o.P99Bound, o.P99Beyond = q(0.99)
	return o
}

// StartFleet starts engines, sidecars and cfg.Pickers pickers on
// 127.0.0.1.
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	if cfg.Engines == 0 {
		cfg.Engines = 2
	}
	if cfg.Pickers == 0 {
		cfg.Pickers = 1
	}
	if cfg.GPUBlocks == 0 {
		cfg.GPUBlocks = 2048
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.Ready == 0 {
		cfg.Ready = 30 * time.Second
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	f := &Fleet{cfg: cfg}
	fail := func(err error) (*Fleet, error) {
		f.Close()
		return nil, err
	}
	pcfg := picker.DefaultServerConfig()
	pcfg.AdminListen = "127.0.0.1:0"
	// The summaries are sized to the largest tier, as an operator sizes
	// --capacity to the engines' blocks.
	pcfg.Listen, pcfg.GRPCListen, pcfg.Capacity = cmp.Or(cfg.PickerListen, "127.0.0.1:0"), "", max(cfg.GPUBlocks, cfg.CPUBlocks)
	pcfg.Router.Score.Policy = cfg.Policy
	pcfg.Router.PolicySeed = cfg.PolicySeed
	pcfg.Router.EnginePriority = cfg.EnginePriority && !cfg.Policy.IsPeer()
	if cfg.LoadEpsilon != nil {
		pcfg.Router.Score.Epsilon = *cfg.LoadEpsilon
	}
	if cfg.SaturationPrefillTokens != nil {
		pcfg.Router.Admission.MaxPrefillTokens = *cfg.SaturationPrefillTokens
	}
	lat, err := profile.Named(cmp.Or(cfg.Profile, profile.SimDefault))
	if err != nil {
		return fail(err)
	}
	for i := 0; i < cfg.Engines; i++ {
		ecfg := enginesim.DefaultConfig()
		ecfg.Host, ecfg.Port = "127.0.0.1", 0
		ecfg.NumGPUBlocks, ecfg.BlockSize = cfg.GPUBlocks, cfg.BlockSize
		ecfg.MaxModelLen = cmp.Or(cfg.MaxModelLen, min(lat.MaxModelLen, (cfg.GPUBlocks-1)*cfg.BlockSize))
		ecfg.Sim.Latency, ecfg.MaxNumBatchedTokens = lat, lat.MaxNumBatchedTokens
		ecfg.Sim.TimeScale = cfg.TimeScale
		if cfg.EnginePriority {
			ecfg.SchedulingPolicy = "priority"
		}
		ecfg.EnableScaleOutEndpoints, ecfg.EnablePromptTokensDetails = true, true
		replay := "tcp://127.0.0.1:*"
		ecfg.KVEvents.EnableKVCacheEvents, ecfg.KVEvents.Endpoint, ecfg.KVEvents.ReplayEndpoint = true, "tcp://127.0.0.1:*", &replay
		p2pPort := 0
		if cfg.CPUBlocks > 0 {
			if p2pPort, err = freeTCPPort(); err != nil {
				return fail(err)
			}
			if ecfg.KVTransfer, err = enginesim.ParseKVTransferConfig(offloadJSON(cfg.CPUBlocks, cfg.BlockSize, lat.KVBytesPerToken, p2pPort)); err != nil {
				return fail(err)
			}
			ecfg.P2PSideChannelHost, ecfg.P2PSideChannelPort = "127.0.0.1", p2pPort
		}
		p, err := enginesim.Start(ecfg, log.Named(fmt.Sprint("engine-", i)))
		if err != nil {
			return fail(fmt.Errorf("engine %d: %w", i, err))
		}
		f.procs = append(f.procs, p)
		e := p.Engines()[0]
		f.engines = append(f.engines, e)
		scfg := sidecar.DefaultConfig()
		scfg.EngineURL, scfg.KVEvents, scfg.Replay = e.URL(), e.EventsEndpoint(), e.ReplayEndpoint()
		scfg.AdminListen, scfg.GRPCListen, scfg.Capacity = "127.0.0.1:0", "127.0.0.1:0", max(cfg.GPUBlocks, cfg.CPUBlocks)
		scfg.ScrapeInterval = 100 * time.Millisecond
		scfg.P2PPort = p2pPort
		s, err := sidecar.Start(ctx, scfg, log.Named(fmt.Sprint("sidecar-", i)), nil)
		if err != nil {
			return fail(fmt.Errorf("sidecar %d: %w", i, err))
		}
		f.sidecars = append(f.sidecars, s)
		pcfg.Sidecars = append(pcfg.Sidecars, s.GRPCAddr())
	}
	if err := f.startPickers(ctx, pcfg, log); err != nil {
		return fail(err)
	}
	deadline := time.Now().Add(cfg.Ready)
	for i, pk := range f.pickers {
		for len(pk.View().Endpoints()) < cfg.Engines {
			if ctx.Err() != nil {
				return fail(ctx.Err())
			}
			if time.Now().After(deadline) {
				return fail(fmt.Errorf("picker %d knows %d of %d endpoints after %v", i, len(pk.View().Endpoints()), cfg.Engines, cfg.Ready))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return f, nil
}

// startPickers starts f's pickers from pcfg: one as configured, or
// several, each on its own listeners (HTTP, admin, gRPC, and the
// bookings streams' port) and registry, every one told all the pickers'
// bookings addresses (PeerPickers; its own is recognised and skipped).
func (f *Fleet) startPickers(ctx context.Context, pcfg picker.ServerConfig, log *zap.Logger) error {
	n := f.cfg.Pickers
	var peerAddrs []string
	if n > 1 {
		for range n {
			port, err := freeTCPPort()
			if err != nil {
				return err
			}
			peerAddrs = append(peerAddrs, fmt.Sprintf("127.0.0.1:%d", port))
		}
	}
	for i := range n {
		c, name := pcfg, "picker"
		if n > 1 {
			name = fmt.Sprint("picker-", i)
			c.GRPCListen, c.PeerListen, c.PeerPickers = "127.0.0.1:0", peerAddrs[i], peerAddrs
			if i > 0 {
				c.Listen = "127.0.0.1:0"
			}
		}
		reg := prometheus.NewRegistry()
		pk, err := picker.Start(ctx, c, log.Named(name), reg)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		f.pickers, f.regs = append(f.pickers, pk), append(f.regs, reg)
	}
	return nil
}

// offloadJSON is --kv-transfer-config for a CPU tier of blocks GPU
// blocks of blockSize tokens at bytesPerToken, with the P2P tier on
// 127.0.0.1:port, as an operator writes it.
func offloadJSON(blocks, blockSize int, bytesPerToken float64, port int) string {
	cpu := int64(float64(blocks*blockSize) * bytesPerToken)
	return fmt.Sprintf(`{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":`+
		`{"spec_name":"TieringOffloadingSpec","cpu_bytes_to_use":%d,"secondary_tiers":[{"type":"p2p","host":"127.0.0.1","port":%d}]}}`, cpu, port)
}

// freeTCPPort is a port free on 127.0.0.1 now.
func freeTCPPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PickerURL is the (first) picker's HTTP base URL.
func (f *Fleet) PickerURL() string { return "http://" + f.pickers[0].Addr() }

// PickerURLs are every picker's HTTP base URL.
func (f *Fleet) PickerURLs() []string {
	out := make([]string, len(f.pickers))
	for i, p := range f.pickers {
		out[i] = "http://" + p.Addr()
	}
	return out
}

// AdminURL is the (first) picker's admin base URL (/metrics, /debug/*,
// /readyz).
func (f *Fleet) AdminURL() string { return "http://" + f.pickers[0].AdminAddr() }

// Pickers are the fleet's pickers.
func (f *Fleet) Pickers() []*picker.Server { return f.pickers }

// EngineURLs lists the engines' base URLs.
func (f *Fleet) EngineURLs() []string {
	out := make([]string, len(f.engines))
	for i, e := range f.engines {
		out[i] = e.URL()
	}
	return out
}

// MaxModelLen is the engines' context length in tokens.
func (f *Fleet) MaxModelLen() int {
	return cmp.Or(f.cfg.MaxModelLen, min(32768, (f.cfg.GPUBlocks-1)*f.cfg.BlockSize))
}

// EngineStats snapshots every engine (zero values for one that does not
// answer, e.g. while closing).
func (f *Fleet) EngineStats() []enginesim.Stats {
	out := make([]enginesim.Stats, len(f.engines))
	for i, e := range f.engines {
		out[i], _ = e.Stats()
	}
	return out
}

// Close stops everything.
func (f *Fleet) Close() {
	for _, p := range f.pickers {
		p.Close()
	}
	for _, s := range f.sidecars {
		s.Close()
	}
	for _, p := range f.procs {
		p.Close()
	}
}
