package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/gossip/secretfile"
	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/identity"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/sidecar/index"
)

// Sidecar serves one vLLM pod: an endpoint per data-parallel rank.
type Sidecar struct {
	cfg       Config
	debugURL  string // the debug server as others reach it ("" unknown)
	log       *zap.Logger
	reg       *prometheus.Registry
	metrics   *metrics
	endpoints []*endpoint
	srv       *http.Server
	ln        net.Listener
	boot      *boot                        // what the starting admin surface shows
	admin     atomic.Pointer[http.Handler] // the admin surface served: starting, then full
	hub       *hub
	stopping  <-chan struct{} // closed when Close begins: summary streams end at once
	grpc      *grpc.Server
	grpcLn    net.Listener
	tls       *grpcTLS            // the gRPC server's TLS files (nil: plaintext)
	secrets   *secretfile.Metrics // reloads of the TLS files and the gossip keyring
	members   *gossip.Members
	partition *gossip.Partitionable  // the cuttable gossip transport, with fault injection on
	drain     atomic.Pointer[string] // the drain announced (Drain); nil while none is
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// Start opens the admin listener, identifies every rank's engine, opens
// the event sockets and starts following the events. reg receives the
// sidecar's metrics (and is served on /metrics). While the engines are
// waited for, the admin listener already serves: /healthz and /metrics
// answer, /readyz fails naming what is awaited, the rest answers 503; the
// full surface takes over once everything started. When Start fails, the
// admin listener is closed before it returns.
func Start(ctx context.Context, cfg Config, log *zap.Logger, reg *prometheus.Registry) (*Sidecar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s := &Sidecar{cfg: cfg, log: log, reg: reg, metrics: newMetrics(reg), secrets: secretfile.NewMetrics(reg, "sidecar")}
	// TLS files first: a bad one fails the start at once, not after the
	// engine has answered.
	tlsFiles, err := openGRPCTLS(&cfg, s.secrets, log.Named("secrets"))
	if err != nil {
		return nil, err
	}
	s.tls = tlsFiles
	s.hub = newHub(func() { s.metrics.watchersCut.Inc() })
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel, s.stopping = cancel, runCtx.Done()
	if err := s.openAdmin(); err != nil {
		cancel()
		return nil, err
	}
	if err := s.start(ctx, runCtx); err != nil {
		s.Close() // the admin listener among the rest
		return nil, err
	}
	return s, nil
}

// openAdmin opens the admin listener and serves the starting surface on
// it; the per-engine series exist from here on, engine_down 1 until the
// rank's engine answers.
func (s *Sidecar) openAdmin() error {
	cfg := &s.cfg
	b, err := newBoot(cfg)
	if err != nil {
		return err
	}
	s.boot = b
	for _, rk := range b.ranks { // the label is the engine URL, as after identification
		s.metrics.initEndpoint(rk.Engine)
		s.metrics.engineDown.WithLabelValues(rk.Engine).Set(1)
	}
	ln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("--admin-listen %s: %w", cfg.AdminListen, err)
	}
	s.ln = ln
	s.debugURL = debugURL(*cfg, ln.Addr().String())
	starting := s.startingHandler()
	s.admin.Store(&starting)
	serve := func(w http.ResponseWriter, r *http.Request) { (*s.admin.Load()).ServeHTTP(w, r) }
	s.srv = &http.Server{Handler: http.HandlerFunc(serve), ReadHeaderTimeout: 10 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server", zap.Error(err))
		}
	}()
	s.log.Info("admin listener open; waiting for the engines", zap.String("admin", ln.Addr().String()), zap.Int("ranks", len(b.ranks)))
	return nil
}

// start identifies every rank's engine, then opens the gRPC listener,
// follows the event streams, joins gossip and serves: pickers never see
// a sidecar whose engines have not answered. runCtx bounds the loops.
func (s *Sidecar) start(ctx, runCtx context.Context) error {
	began := time.Now()
	hc := &http.Client{Timeout: 5 * time.Second}
	deps := endpointDeps{cfg: newEndpointConfig(&s.cfg), log: s.log, metrics: s.metrics, hub: s.hub,
		drainReason: s.drainReason, answered: s.boot.answered, waiting: s.boot.waiting}
	for r := 0; r < s.cfg.DataParallelSize; r++ {
		ep, err := newEndpoint(ctx, hc, &s.cfg, r, deps)
		if err != nil {
			return err
		}
		s.endpoints = append(s.endpoints, ep)
	}
	if err := s.listenGRPC(); err != nil {
		return err
	}
	s.watchTLS(runCtx)
	for _, ep := range s.endpoints {
		if err := s.follow(runCtx, hc, ep); err != nil {
			return err
		}
	}
	if s.cfg.Gossip != nil { // before serving: handleReady reads s.members
		if err := s.startGossip(runCtx); err != nil {
			return err
		}
	}
	s.serve()
	s.log.Info("engines answered; serving", zap.Int("ranks", len(s.endpoints)),
		zap.String("admin", s.ln.Addr().String()), zap.Duration("waited", time.Since(began).Round(time.Millisecond)))
	return nil
}

// listenGRPC opens the gRPC listener and server, when configured.
func (s *Sidecar) listenGRPC() error {
	cfg := &s.cfg
	if cfg.GRPCListen == "" {
		return nil
	}
	ln, err := net.Listen("tcp", cfg.GRPCListen)
	if err != nil {
		return fmt.Errorf("--grpc-listen %s: %w", cfg.GRPCListen, err)
	}
	s.grpcLn = ln // closed by Close, as the server
	s.grpc, err = s.newGRPCServer()
	return err
}

// follow starts ep's intake and scraper, and waits for its intake socket
// to open.
func (s *Sidecar) follow(ctx context.Context, hc *http.Client, ep *endpoint) error {
	ready := make(chan error, 1)
	s.wg.Add(2)
	go func() { defer s.wg.Done(); ep.run(ctx, ready) }()
	go func() { defer s.wg.Done(); ep.scrapeLoop(ctx, hc) }()
	if err := <-ready; err != nil {
		return fmt.Errorf("rank %d: %w", ep.rank, err)
	}
	ep.log.Info("following kv events", zap.String("events", ep.events), zap.Bool("bind", s.cfg.Bind),
		zap.String("replay", ep.replay), zap.String("model", ep.identity.Model), zap.String("tokenizer", ep.identity.TokenizerFingerprint))
	return nil
}

// serve hands the admin listener to the full surface and starts the gRPC
// server, when configured.
func (s *Sidecar) serve() {
	full := s.handler()
	s.admin.Store(&full)
	if s.grpc != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.grpc.Serve(s.grpcLn); err != nil {
				s.log.Error("grpc server", zap.Error(err))
			}
		}()
		s.log.Info("serving summaries over gRPC", zap.String("addr", s.grpcLn.Addr().String()), zap.Bool("tls", s.cfg.GRPCTLSCert != ""), zap.Bool("client_certificates_required", s.cfg.GRPCClientCA != ""))
	}
}

// Registry returns the registry the sidecar's metrics are in.
func (s *Sidecar) Registry() *prometheus.Registry { return s.reg }

// DebugAddr returns the debug server's address.
func (s *Sidecar) DebugAddr() string { return s.ln.Addr().String() }

// EventsEndpoint returns rank r's event endpoint (bound ports resolved).
func (s *Sidecar) EventsEndpoint(rank int) string {
	ep := s.endpoints[rank]
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.events
}

// GRPCAddr returns the gRPC server's address ("" when off).
func (s *Sidecar) GRPCAddr() string {
	if s.grpcLn == nil {
		return ""
	}
	return s.grpcLn.Addr().String()
}

// Members returns the gossip membership (nil without gossip).
func (s *Sidecar) Members() *gossip.Members { return s.members }

// meta describes the sidecar for gossip: its gRPC address, identity group,
// the models its endpoints serve (all or none: gossip.AdvertisedModels)
// and each endpoint's GPU summary position.
func (s *Sidecar) meta(grpcAddr string) gossip.Meta {
	m := gossip.Meta{Role: gossip.RoleSidecar, GRPC: grpcAddr}
	var models []string
	for _, ep := range s.endpoints {
		ep.mu.Lock()
		id := ep.identity
		m.Group = identity.Group{Model: id.Model, BlockSize: id.BlockSize, KeyFormat: id.KeyFormat,
			SummaryParams: id.SummaryParams, TokenizerFingerprint: id.TokenizerFingerprint}.ID()
		m.Endpoints = append(m.Endpoints, gossip.Digest{Endpoint: id.Endpoint, Epoch: ep.epoch, Seq: ep.deltaSeq[tier.GPU]})
		models = append(models, id.Model)
		ep.mu.Unlock()
	}
	m.Models = gossip.AdvertisedModels(models)
	return m
}

// sameButSeqs reports whether a and b differ at most in digest seqs.
func sameButSeqs(a, b gossip.Meta) bool {
	if a.Role != b.Role || a.GRPC != b.GRPC || a.Group != b.Group || !slices.Equal(a.Models, b.Models) || len(a.Endpoints) != len(b.Endpoints) {
		return false
	}
	for i := range a.Endpoints {
		if a.Endpoints[i].Endpoint != b.Endpoints[i].Endpoint || a.Endpoints[i].Epoch != b.Endpoints[i].Epoch {
			return false
		}
	}
	return true
}

// debugURL is the debug server's URL as others reach it: the advertised
// address, else the listen address with the gossip host in place of an
// unspecified one; "" when only an unspecified host is known.
func debugURL(cfg Config, listen string) string {
	if cfg.AdminAdvertise != "" {
		return "http://" + cfg.AdminAdvertise
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = ""
		if g := cfg.Gossip; g != nil {
			for _, h := range []string{g.AdvertiseAddr, g.BindAddr} {
				if ip := net.ParseIP(h); ip != nil && !ip.IsUnspecified() {
					host = h
					break
				}
			}
		}
		if host == "" {
			return ""
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}

// startGossip joins the cluster and keeps the metadata current.
func (s *Sidecar) startGossip(ctx context.Context) error {
	advertise := s.cfg.GRPCAdvertise
	host, port, err := net.SplitHostPort(s.grpcLn.Addr().String())
	if err != nil {
		return err
	}
	if err := s.faultTransport(); err != nil {
		return err
	}
	gcfg := *s.cfg.Gossip
	gcfg.Secrets = s.secrets // the keyring's reloads, counted with the TLS files'
	m, err := gossip.New(gcfg, gossip.Meta{Role: gossip.RoleSidecar}, s.log.Named("gossip"), s.reg)
	if err != nil {
		if s.partition != nil {
			_ = s.partition.Shutdown()
		}
		return err
	}
	s.members = m
	if advertise == "" {
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			host, _, _ = net.SplitHostPort(m.LocalAddr())
		}
		advertise = net.JoinHostPort(host, port)
	}
	// Publish when anything but the seq digests changes, and the digests
	// every few seconds: each update costs every member a broadcast.
	var last gossip.Meta
	var lastAt time.Time
	publish := func() {
		meta := s.meta(advertise)
		if sameButSeqs(meta, last) && time.Since(lastAt) < 5*time.Second {
			return
		}
		err := m.SetMeta(meta)
		if errors.Is(err, gossip.ErrMetaTooLarge) {
			meta.Endpoints = nil // too many endpoints to fit: advertise the address and models alone
			err = m.SetMeta(meta)
		}
		if errors.Is(err, gossip.ErrMetaTooLarge) {
			meta.Models = nil // model names too long to fit: unknown, so pickers dial and ask
			err = m.SetMeta(meta)
		}
		switch {
		case errors.Is(err, gossip.ErrShutdown):
			return
		case err != nil && !errors.Is(err, gossip.ErrMetaTooLarge):
			// A broadcast timeout: the update still spreads; try again later.
			s.log.Debug("gossip metadata update", zap.Error(err))
		case err != nil:
			s.log.Warn("gossip metadata", zap.Error(err))
		}
		last, lastAt = meta, time.Now()
	}
	publish()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				publish()
			}
		}
	}()
	s.log.Info("gossip member", zap.String("addr", m.LocalAddr()), zap.String("grpc_advertise", advertise))
	return nil
}

// Close stops everything.
func (s *Sidecar) Close() {
	s.cancel() // stops the loops first, the gossip publisher among them
	if s.members != nil {
		_ = s.members.Close()
	}
	if s.grpc != nil {
		done := make(chan struct{})
		go func() { s.grpc.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			s.grpc.Stop()
		}
	}
	s.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
	s.wg.Wait()
	_ = s.ln.Close() // when Start failed before serving
	if s.grpcLn != nil {
		_ = s.grpcLn.Close()
	}
}

// EndpointState is one endpoint's /debug/state entry.
type EndpointState struct {
	Identity Identity `json:"identity"`
	// KVSource is the P2P side channel peers pull the engine's CPU-tier
	// KV from (host:port; --p2p-port), absent without one.
	KVSource string `json:"kv_source,omitempty"`
	// GossipInsecure: the sidecar gossips without a keyring off loopback
	// (--gossip-insecure): anyone reaching its gossip port can join.
	GossipInsecure bool    `json:"gossip_insecure"`
	Epoch          uint64  `json:"epoch"`
	LastSeq        *uint64 `json:"last_seq"`
	Partial        bool    `json:"partial"`
	Live           bool    `json:"live"` // a live batch has ever arrived
	// StreamState is the live event stream's state (unknown, live,
	// replay_only, silent, partial; package sidecar/streamhealth), since
	// StreamSince (absent for the initial unknown), and StreamReason why,
	// with the likely fix.
	StreamState  string     `json:"stream_state"`
	StreamReason string     `json:"stream_reason"`
	StreamSince  *time.Time `json:"stream_since,omitempty"`
	// EngineDown: the last scrape of the engine failed, with EngineError.
	EngineDown  bool   `json:"engine_down"`
	EngineError string `json:"engine_error,omitempty"`
	// Draining: the sidecar announced to its pickers that the engine is
	// going away (Drain), for DrainReason.
	Draining    bool              `json:"draining"`
	DrainReason string            `json:"drain_reason,omitempty"`
	Blocks      map[string]int    `json:"blocks"`
	Summary     map[string]Fill   `json:"summary"`
	Counters    endpointCounters  `json:"counters"`
	Index       index.Stats       `json:"index"`
	Load        Load              `json:"load"`
	DeltaSeq    map[string]uint64 `json:"delta_seq"`
}

// Fill describes a tier's summary.
type Fill struct {
	Keys      int     `json:"keys"`
	Fill      float64 `json:"fill"`
	Saturated int     `json:"saturated_counters"`
}

// State returns every endpoint's state.
func (s *Sidecar) State() []EndpointState {
	var out []EndpointState
	for _, ep := range s.endpoints {
		ep.mu.Lock()
		st := EndpointState{Identity: ep.identity, KVSource: ep.kvSource, GossipInsecure: s.members.Insecure(), Epoch: ep.epoch, Partial: ep.partial, Live: ep.live,
			StreamState: ep.stream.State.String(), StreamReason: ep.stream.Reason,
			EngineDown: ep.load.Error != "", EngineError: ep.load.Error,
			Draining: s.drainReason() != "", DrainReason: s.drainReason(),
			Blocks: map[string]int{}, Summary: map[string]Fill{}, Counters: ep.counters, Index: ep.idx.Stats(),
			Load: ep.load, DeltaSeq: map[string]uint64{}}
		if since := ep.stream.Since; !since.IsZero() {
			st.StreamSince = &since
		}
		if ep.haveSeq {
			seq := ep.lastSeq
			st.LastSeq = &seq
		}
		for _, t := range ep.idx.Tiers() {
			sum, name := ep.idx.Summary(t), t.String()
			st.Blocks[name] = ep.idx.Blocks(t)
			st.Summary[name] = Fill{Keys: sum.Keys(), Fill: sum.Fill(), Saturated: sum.Saturated()}
			st.DeltaSeq[name] = ep.deltaSeq[t]
			s.metrics.fill.WithLabelValues(ep.identity.Endpoint, name).Set(sum.Fill())
		}
		ep.mu.Unlock()
		out = append(out, st)
	}
	return out
}

// handler is the full admin surface, once the sidecar started.
func (s *Sidecar) handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.routes() {
		mux.Handle(rt.pattern, rt.serve)
	}
	return mux
}

// routes are the admin surface's paths, started and starting (see
// startingHandler).
func (s *Sidecar) routes() []adminRoute {
	healthz := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	rts := []adminRoute{
		{pattern: "GET /healthz", serve: healthz, starting: healthz},
		{pattern: "GET /readyz", serve: http.HandlerFunc(s.handleReady), starting: http.HandlerFunc(s.boot.handleReady)},
		{pattern: "GET /metrics", serve: metrics, starting: metrics},
		{pattern: "GET /debug/state", serve: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, s.State()) })},
		{pattern: "GET /debug/keys", serve: http.HandlerFunc(s.handleKeys)},
		{pattern: "GET /debug/events", serve: http.HandlerFunc(s.handleEvents)},
	}
	rts = append(rts, pprofRoutes()...)
	if s.cfg.FaultInjection { // fault injection only (Validate: with gossip)
		rts = append(rts, adminRoute{pattern: "POST /debug/fault/gossip", serve: http.HandlerFunc(s.handleGossipFault)})
	}
	return rts
}

// handleReady says whether the sidecar can serve: every rank's engine
// answered its last scrape, its event intake is open, no other gossip
// member claims the sidecar's name, and no drain was announced. The event stream's health is not part
// of it: a silent or replay-only stream still serves load reports (pickers
// route that endpoint by load only), so it is shown here, in "streams",
// and in /debug/state, not as "not ready".
func (s *Sidecar) handleReady(w http.ResponseWriter, r *http.Request) {
	var problems []string
	streams := map[string]string{}
	for _, ep := range s.endpoints {
		ep.mu.Lock()
		open, loadErr, stream := ep.intakeOpen, ep.load.Error, ep.stream.State
		ep.mu.Unlock()
		streams[strconv.Itoa(ep.rank)] = stream.String()
		if loadErr != "" {
			problems = append(problems, fmt.Sprintf("rank %d: engine: %s", ep.rank, loadErr))
		}
		if !open {
			problems = append(problems, fmt.Sprintf("rank %d: kv event intake closed", ep.rank))
		}
	}
	if err := s.members.Conflict(); err != nil {
		problems = append(problems, err.Error())
	}
	if d := s.drainReason(); d != "" {
		problems = append(problems, "draining ("+d+"): the engines are going away")
	}
	if len(problems) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "problems": problems, "streams": streams})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ready": true, "streams": streams})
}

// handleKeys looks a block up: ?canonical=<16 hex> or ?engine=<decimal>,
// optionally &rank= and &tier= (default 0 and GPU). A tier that is not one
// (wrong case, unknown name) holds nothing, and is echoed as given.
func (s *Sidecar) handleKeys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rank, err := strconv.Atoi(q.Get("rank"))
	if q.Get("rank") == "" {
		rank, err = 0, nil
	}
	if err != nil || rank < 0 || rank >= len(s.endpoints) {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "rank out of range"})
		return
	}
	name := q.Get("tier")
	if name == "" {
		name = tier.GPU.String()
	}
	t, known := tier.Parse(name)
	ep := s.endpoints[rank]
	ep.mu.Lock()
	defer ep.mu.Unlock()
	switch {
	case q.Get("canonical") != "":
		k, err := blockkey.ParseKey(q.Get("canonical"))
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		var hashes []uint64
		var sum *summary.Counting
		if known {
			hashes, sum = ep.idx.LookupCanonical(t, k), ep.idx.Summary(t)
		}
		writeJSON(w, http.StatusOK, map[string]any{"canonical": k.String(), "tier": name, "engine_hashes": hashes,
			"indexed": len(hashes) > 0, "summary_may_contain": sum != nil && sum.MayContain(k)})
	case q.Get("engine") != "":
		h, err := strconv.ParseUint(q.Get("engine"), 10, 64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "engine: want a decimal 64-bit hash"})
			return
		}
		var k blockkey.Key
		var refs int
		var ok bool
		if known {
			k, refs, ok = ep.idx.LookupEngine(t, h)
		}
		out := map[string]any{"engine": h, "tier": name, "indexed": ok}
		if ok {
			out["canonical"], out["copies"] = k.String(), refs
		}
		writeJSON(w, http.StatusOK, out)
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "give canonical=<16 hex digits> or engine=<decimal hash>"})
	}
}

// handleEvents shows each endpoint's recent events: hashes and counts only.
func (s *Sidecar) handleEvents(w http.ResponseWriter, r *http.Request) {
	out := map[string][]recentEvent{}
	for _, ep := range s.endpoints {
		ep.mu.Lock()
		out[strconv.Itoa(ep.rank)] = append([]recentEvent(nil), ep.recent...)
		ep.mu.Unlock()
	}
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
