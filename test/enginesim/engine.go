package enginesim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/test/enginesim/kvcache"
	"github.com/kvroute/kvroute/test/enginesim/p2p"
	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// Engine is one data-parallel rank: the shell around an engine core
// (package sched: the queues and the KV cache), its event publisher and
// its HTTP server.
type Engine struct {
	cfg     *Config
	rank    int
	log     *zap.Logger
	reg     *prometheus.Registry
	metrics *metrics

	// The scheduler goroutine's own state.
	core   *sched.Scheduler
	pub    *publisher            // nil: events over ZMQ off
	live   map[sched.ID]*request // submitted, not yet finished or dropped
	simNow time.Duration         // simulated time: the sum of step durations
	// simSec is simNow as the float sum of the steps' seconds, the clock
	// the TTFT histogram has always been observed on (kept so that its
	// buckets do not move by a rounding).
	simSec float64

	submitCh chan *request
	ctrl     chan func()
	quit     chan struct{}
	done     chan struct{}
	closed   atomic.Bool
	started  atomic.Int64 // simulated process start, unix nanoseconds
	restarts atomic.Int64
	nextID   atomic.Uint64 // request ids, for the core and the answers
	// runnerHinted: the log has said once which --runner serves a route
	// this engine's runner does not register.
	runnerHinted atomic.Bool

	cancelMu sync.Mutex
	cancels  []sched.ID // cancelled by handlers, for the next step

	loadMu sync.Mutex
	load   sched.Load // as the core last reported it

	eventsEndpoint, replayEndpoint atomic.Pointer[string]

	// node is the rank's P2P side channel; nil without the P2P tier.
	node *p2p.Node
	// pulls carries pulls' outcomes to the scheduler goroutine; the pulls
	// run under pullCtx (ended at close), at most maxPulls at once.
	pulls      chan pullDone
	pullCtx    context.Context
	pullCancel context.CancelFunc
	pullSem    chan struct{}
	pullWG     sync.WaitGroup
	// wake tells a loop parked for KV (parkKV) that a handler cancelled.
	wake chan struct{}

	srv      *http.Server
	listener net.Listener
}

// maxEventDelay caps the event-delay fault.
const maxEventDelay = time.Minute

// ErrClosed is returned for requests to an engine that is shutting down.
var ErrClosed = errors.New("the engine is shutting down")

// schedConfig is the core's configuration from the engine's flags.
func schedConfig(cfg *Config) sched.Config {
	c := sched.Config{
		Cache: kvcache.Config{
			NumBlocks:  cfg.NumGPUBlocks,
			BlockSize:  cfg.BlockSize,
			Seed:       cfg.HashSeed,
			RawHashes:  !cfg.IntBlockHashes,
			EmitEvents: cfg.KVEvents.Enabled() || cfg.EventSink != nil,
		},
		MaxModelLen:         cfg.MaxModelLen,
		MaxNumSeqs:          cfg.MaxNumSeqs,
		MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
		Latency:             cfg.Sim.Profile(),
		Policy:              cfg.SchedulingPolicy,
	}
	offloadCache(&c.Cache, cfg)
	return c
}

func newEngine(cfg *Config, rank int, log *zap.Logger) (*Engine, error) {
	e := &Engine{
		cfg:      cfg,
		rank:     rank,
		log:      log.With(zap.Int("rank", rank)),
		reg:      prometheus.NewRegistry(),
		live:     map[sched.ID]*request{},
		submitCh: make(chan *request, 1024),
		ctrl:     make(chan func()),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		pulls:    make(chan pullDone, 1024),
		wake:     make(chan struct{}, 1),
		pullSem:  make(chan struct{}, maxPulls),
	}
	e.pullCtx, e.pullCancel = context.WithCancel(context.Background())
	e.metrics = newMetrics(e.reg, cfg, rank)
	var err error
	if e.core, err = sched.New(schedConfig(cfg)); err != nil {
		return nil, err
	}
	if err := e.openNode(); err != nil {
		return nil, err
	}
	if err := e.openPublisher(); err != nil {
		if e.node != nil {
			e.node.Close()
		}
		return nil, err
	}
	e.markStarted()
	return e, nil
}

func (e *Engine) openPublisher() error {
	if !e.cfg.KVEvents.Enabled() {
		empty := ""
		e.eventsEndpoint.Store(&empty)
		e.replayEndpoint.Store(&empty)
		return nil
	}
	var pubAt, replayAt string
	if e.restarts.Load() > 0 { // keep the ports the first process resolved
		pubAt, replayAt = e.EventsEndpoint(), e.ReplayEndpoint()
	}
	p, err := newPublisher(e.cfg, e.rank, e.log, e.metrics, e.cfg.Sim.Seed+uint64(e.restarts.Load()), pubAt, replayAt)
	if err != nil {
		return err
	}
	e.pub = p
	e.eventsEndpoint.Store(&p.pubEndpoint)
	e.replayEndpoint.Store(&p.replayEndpoint)
	return nil
}

func (e *Engine) markStarted() {
	now := time.Now()
	e.started.Store(now.UnixNano())
	e.metrics.startTime.Set(float64(now.UnixNano()) / 1e9)
}

// Rank returns the data-parallel rank.
func (e *Engine) Rank() int { return e.rank }

// URL returns the rank's HTTP base URL.
func (e *Engine) URL() string { return "http://" + e.listener.Addr().String() }

// Addr returns the rank's HTTP listen address.
func (e *Engine) Addr() string { return e.listener.Addr().String() }

// EventsEndpoint returns the PUB endpoint (ephemeral ports resolved); ""
// when events are off.
func (e *Engine) EventsEndpoint() string { return *e.eventsEndpoint.Load() }

// ReplayEndpoint returns the replay ROUTER endpoint; "" when replay is off.
func (e *Engine) ReplayEndpoint() string { return *e.replayEndpoint.Load() }

// StartTime returns the simulated process start time; it changes on Restart.
func (e *Engine) StartTime() time.Time { return time.Unix(0, e.started.Load()) }

// Registry returns the rank's metrics registry.
func (e *Engine) Registry() *prometheus.Registry { return e.reg }

// Load is an engine's load: requests waiting and running, and the KV
// cache's usage (0 to 1), as vLLM's /metrics reports them.
type Load = sched.Load

// Load returns the engine's load figures as the core last reported them,
// which are the values of /metrics' vllm:num_requests_waiting,
// vllm:num_requests_running and vllm:kv_cache_usage_perc. It does not wait
// for the scheduler goroutine.
func (e *Engine) Load() Load {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	return e.load
}

// setLoad records the core's load figures and sets the gauges.
func (e *Engine) setLoad(l sched.Load) {
	e.loadMu.Lock()
	e.load = l
	e.loadMu.Unlock()
	e.metrics.observe(l)
}

// do runs f on the scheduler goroutine and waits for it.
func (e *Engine) do(f func()) error {
	ran := make(chan struct{})
	select {
	case e.ctrl <- func() { f(); close(ran) }:
	case <-e.quit:
		return ErrClosed
	}
	select {
	case <-ran:
		return nil
	case <-e.done:
		return ErrClosed
	}
}

// ResetPrefixCache drops every cached block (AllBlocksCleared). Like vLLM
// it fails while requests hold blocks, unless resetRunning, which preempts
// them first (they recompute when readmitted).
func (e *Engine) ResetPrefixCache(resetRunning bool) error {
	var err error
	if derr := e.do(func() {
		var res sched.Reset
		res, err = e.core.ResetPrefixCache(resetRunning)
		e.metrics.preemptions.Add(float64(res.Preemptions))
		if len(res.Events) > 0 {
			e.emit(res.Events)
		}
	}); derr != nil {
		return derr
	}
	return err
}

// ResetConnectorCache empties the KV connector's CPU tier without events,
// as vLLM's reset_prefix_cache with reset_external does; a no-op without
// a connector.
func (e *Engine) ResetConnectorCache() error {
	return e.do(e.resetConnector)
}

// Restart simulates a process restart: requests in flight fail, the cache
// is emptied without events, the publisher restarts at seq 0 with an empty
// replay ring, and the start time changes.
func (e *Engine) Restart() error {
	var err error
	if derr := e.do(func() {
		e.abortAll(errRestarted)
		if e.pub != nil {
			e.pub.close()
			e.pub = nil
		}
		e.restarts.Add(1)
		err = e.openPublisher()
		// A new process: at least a tick later than the last one.
		for time.Now().UnixNano() <= e.started.Load() {
			time.Sleep(time.Millisecond)
		}
		e.markStarted()
		e.simNow, e.simSec = 0, 0
		e.setLoad(e.core.Load())
		e.log.Info("simulated engine restart", zap.Int64("restarts", e.restarts.Load()))
	}); derr != nil {
		return derr
	}
	return err
}

// SetEventFaults changes the event fault switches at run time.
func (e *Engine) SetEventFaults(dropPercent float64, delay time.Duration) error {
	if dropPercent < 0 || dropPercent > 100 || delay < 0 || delay > maxEventDelay {
		return fmt.Errorf("drop %v%% delay %v: want 0..100 and a non-negative delay", dropPercent, delay)
	}
	return e.do(func() {
		if e.pub != nil {
			e.pub.setFaults(dropPercent, delay)
		}
	})
}

// Stats is a snapshot of the engine core for tests and benchmarks.
type Stats struct {
	Running, Waiting int
	CachedBlocks     int
	FreeBlocks       int
	Usage            float64
	NextSeq          uint64
}

// Stats returns a consistent snapshot taken on the scheduler goroutine.
func (e *Engine) Stats() (Stats, error) {
	var st Stats
	err := e.do(func() {
		l := e.core.Load()
		st = Stats{Running: l.Running, Waiting: l.Waiting, CachedBlocks: e.core.NumCachedBlocks(),
			FreeBlocks: e.core.NumFreeBlocks(), Usage: l.KVUsage}
		if e.pub != nil {
			st.NextSeq = e.pub.nextSeq
		}
	})
	return st, err
}

func (e *Engine) close() {
	if e.closed.Swap(true) {
		return
	}
	if e.node != nil { // first: peers' lookups stop waiting on the loop
		e.node.Close()
	}
	e.pullCancel()
	close(e.quit)
	<-e.done
	e.pullWG.Wait()
	if e.pub != nil {
		e.pub.close()
	}
}

// Process is a simulated `vllm serve`: one Engine per data-parallel rank,
// rank r serving HTTP on port+r.
type Process struct {
	cfg     Config
	log     *zap.Logger
	engines []*Engine
	wg      sync.WaitGroup
}

// Start validates cfg, opens every rank's sockets and starts serving.
func Start(cfg Config, log *zap.Logger) (*Process, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if need := (cfg.MaxModelLen + cfg.BlockSize - 1) / cfg.BlockSize; cfg.NumGPUBlocks-1 < need {
		return nil, fmt.Errorf("--max-model-len %d needs %d KV blocks of %d tokens, but --num-gpu-blocks %d leaves %d; lower --max-model-len or raise --num-gpu-blocks",
			cfg.MaxModelLen, need, cfg.BlockSize, cfg.NumGPUBlocks, cfg.NumGPUBlocks-1)
	}
	if log == nil {
		log = zap.NewNop()
	}
	for _, w := range cfg.KVTransfer.Warnings {
		log.Warn(w)
	}
	p := &Process{cfg: cfg, log: log}
	for rank := 0; rank < cfg.DataParallelSize; rank++ {
		e, err := newEngine(&p.cfg, rank, log)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
		go e.run()
		port := 0
		if cfg.Port != 0 {
			port = cfg.Port + rank
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(port)))
		if err != nil {
			e.close()
			p.Close()
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
		e.listener = ln
		e.srv = &http.Server{Handler: e.handler(), ReadHeaderTimeout: 10 * time.Second}
		p.engines = append(p.engines, e)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if err := e.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("http server", zap.Int("rank", e.rank), zap.Error(err))
			}
		}()
		log.Info("simulated vLLM engine serving",
			zap.Int("rank", rank), zap.String("http", ln.Addr().String()),
			zap.String("kv_events", e.EventsEndpoint()), zap.String("replay", e.ReplayEndpoint()),
			zap.String("p2p", e.P2PID()))
	}
	return p, nil
}

// Engines returns the ranks, in order.
func (p *Process) Engines() []*Engine { return p.engines }

// Close stops serving and releases every socket.
func (p *Process) Close() {
	// Stop the engines first: requests in flight fail fast with 503, so
	// the servers' graceful shutdown does not wait on long generations.
	for _, e := range p.engines {
		e.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, e := range p.engines {
		if e.srv != nil {
			_ = e.srv.Shutdown(ctx)
		}
	}
	p.wg.Wait()
}
