package fleetview

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// Config configures a view.
//
// One rule for defaults: DefaultConfig returns every documented default,
// and a zero value is never a default but invalid — Validate rejects it and
// New does not fill it in. Start from DefaultConfig and set Params, which
// has no default.
type Config struct {
	// Params are the fleet-wide summary parameters; sidecars advertising
	// others are refused. No default: the summaries' size is the fleet's
	// choice (the picker derives it from --capacity) and must be set.
	Params summary.Params
	// Slots bounds the endpoints of one identity group, 1..fleet.MaxSlots
	// (--max-group-endpoints). Default fleet.DefaultSlots (1,024).
	Slots int
	// Retry is the wait before re-dialling a sidecar whose stream ended;
	// positive. Default 500 ms.
	Retry time.Duration
	// TLS, when set, is used to dial sidecars; nil (the default) dials in
	// plaintext.
	TLS credentials.TransportCredentials
	// Health holds the limits endpoint health is judged by (see
	// fleet.HealthConfig); the view judges every HealthEvery, logs each
	// transition once and probes the engines it must. Defaults
	// fleet.DefaultHealthConfig() and 100 ms.
	Health      fleet.HealthConfig
	HealthEvery time.Duration
	// Models, when set, are the only models the view follows (picker
	// replicas sharded by model): a sidecar whose gossip metadata
	// advertises models, none of them followed, is never dialled; a
	// sidecar's endpoints of other models are listed as not followed
	// (ReasonModelNotFollowed) and a sidecar serving none of them has its
	// summaries never streamed. Each entry is a model name as the
	// sidecars report it; none empty. Default none: every model.
	Models []string
	// AllowRemote are the networks whose endpoints any sidecar may
	// advertise (--allow-remote-endpoints, as trust.ParseAllow returns
	// them). Default none: a sidecar's endpoints are taken only on its
	// own host (package picker/trust); the others are refused, counted
	// and listed (Refused).
	AllowRemote []netip.Prefix
	// Lookup resolves the host names the trust check meets, each bounded
	// by LookupTimeout; answers are kept 30 s, failures 5 s. Defaults
	// SystemLookup and 2 s.
	Lookup        Lookup
	LookupTimeout time.Duration
	// PerEndpointMetrics exports kvroute_picker_endpoint_state with a
	// series for every state of every endpoint (1 for its current one, 0
	// for the others: four an endpoint), as the picker's
	// --per-endpoint-metrics asks. Default false: only each endpoint's
	// current state (one series, at 1), which alerts and dashboards read
	// the same way.
	PerEndpointMetrics bool
}

// DefaultConfig returns the defaults: Slots 1,024, Retry 500 ms, plaintext;
// Params unset.
func DefaultConfig() Config {
	return Config{Slots: fleet.DefaultConfig().Slots, Retry: 500 * time.Millisecond, Health: fleet.DefaultHealthConfig(),
		HealthEvery: 100 * time.Millisecond, Lookup: SystemLookup, LookupTimeout: 2 * time.Second}
}

// Validate checks c: Params valid, Slots in 1..fleet.MaxSlots, Retry positive.
func (c *Config) Validate() error {
	if err := c.fleet().Validate(); err != nil {
		return err
	}
	if c.Retry <= 0 {
		return errors.New("fleetview: retry interval must be positive")
	}
	if c.HealthEvery <= 0 {
		return errors.New("fleetview: health interval must be positive")
	}
	for _, m := range c.Models {
		if strings.TrimSpace(m) == "" {
			return errors.New("fleetview: an empty model name in the models followed")
		}
	}
	if err := c.validateTrust(); err != nil {
		return err
	}
	return c.Health.Validate()
}

// fleet is the fleet state's part of c.
func (c *Config) fleet() fleet.Config { return fleet.Config{Params: c.Params, Slots: c.Slots} }

// View is the picker's fleet view: the shell around a fleet.State.
type View struct {
	cfg Config
	log *zap.Logger

	// mu serialises access to state (Match, Endpoints, GroupEndpoints,
	// Roster and Refused under the read lock, everything else under the write lock) and guards
	// streams and closed.
	mu    sync.RWMutex
	state *fleet.State
	// rosterMu serialises Roster calls (under mu's read lock): the core
	// keeps the rosters it builds.
	rosterMu sync.Mutex
	streams  map[string]*streamRef // by sidecar address
	closed   bool
	// models are cfg.Models as a set (nil: every model); unfollowed the
	// endpoints of other models, by sidecar address, as last offered.
	models     map[string]bool
	unfollowed map[string][]Refused
	skips      *modelSkips // gossip members not dialled for their models
	trust      *trustState // the trust check's name cache and refusals

	wg        sync.WaitGroup
	refused   prometheus.Counter
	conflict  prometheus.Counter
	resyncs   prometheus.Counter
	malformed prometheus.Counter
	applied   *prometheus.CounterVec
	lag       prometheus.Histogram
	batches   prometheus.Histogram
	health    healthMetrics
	probe     *http.Client // the picker's own health probes of engines
	loader    *loader      // writes the snapshot loads, batched
	snapshots atomic.Int64 // snapshots received whose load began (Sync)
	closeCtx  context.Context
	close     context.CancelFunc
}

// New returns an empty view. cfg must be valid (see Config).
func New(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*View, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	state, err := fleet.New(cfg.fleet())
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	v := &View{cfg: cfg, log: log, state: state, streams: map[string]*streamRef{}, unfollowed: map[string][]Refused{},
		refused:   prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_picker_endpoints_refused_total", Help: "Endpoints refused (other summary parameters, no free slot, not trusted from their sidecar)."}),
		conflict:  prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_picker_endpoint_conflicts_total", Help: "Endpoints claimed by a second sidecar while the first still streams them (ignored)."}),
		resyncs:   prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_picker_summary_resyncs_total", Help: "Streams restarted to take a snapshot after a delta that did not follow."}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_picker_summary_malformed_total", Help: "Updates refused as malformed (undecodable summary, unknown feed number); the stream restarts."}),
		applied:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_picker_summary_updates_total", Help: "Summary updates applied, by kind."}, []string{"kind"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_picker_event_to_routable_seconds",
			Help:    "From the engine stamping a batch to its blocks being routable here (engine and picker clocks).",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 5}}),
		batches: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_picker_snapshot_batch_loads",
			Help:    "Snapshot loads written together in one lap over an index: those that joined it between two moments it had none to write.",
			Buckets: []float64{1, 4, 16, 64, 256, 1024}}),
	}
	if len(cfg.Models) > 0 {
		v.models = map[string]bool{}
		for _, m := range cfg.Models {
			v.models[m] = true
		}
	}
	v.health = newHealthMetrics(v)
	v.skips = newModelSkips(log)
	v.trust = newTrustState(&cfg, log)
	v.probe = &http.Client{Timeout: probeTimeout}
	if reg != nil {
		reg.MustRegister(v.refused, v.conflict, v.resyncs, v.malformed, v.applied, v.lag, v.batches, staleness{v}, notFollowed{v}, failingGauge{v},
			trustGauge{v}, v.trust.refused)
		v.health.register(reg)
	}
	if reg != nil {
		reg.MustRegister(v.skips)
	}
	v.closeCtx, v.close = context.WithCancel(context.Background())
	v.loader = newLoader(&v.mu, func(n int) { v.batches.Observe(float64(n)) })
	if reg != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvroute_picker_snapshot_loads_waiting",
			Help: "Snapshots received and not yet written into the index (a sync in progress; those endpoints read as absent until then)."},
			func() float64 { return float64(v.loader.waiting.Load()) }))
	}
	v.wg.Add(2)
	go func() {
		defer v.wg.Done()
		v.watchHealth(v.closeCtx)
	}()
	go func() {
		defer v.wg.Done()
		v.loader.run(v.closeCtx)
	}()
	return v, nil
}

// GroupID names an endpoint's identity group.
func GroupID(info *pb.EndpointInfo) string { return identityOf(info).Group() }

// identityOf is kvroute's own copy of what a sidecar says of an endpoint.
// Its KV source is taken only when KVSourceOf accepts it.
func identityOf(info *pb.EndpointInfo) fleet.Identity {
	src, _ := KVSourceOf(info.Endpoint, info.KvSource)
	return fleet.Identity{Endpoint: info.Endpoint, Rank: int(info.Rank), Model: info.Model, BlockSize: int(info.BlockSize),
		NumGPUBlocks: int(info.NumGpuBlocks), HashAlgo: info.HashAlgo, KeyFormat: info.KeyFormat, SummaryParams: info.SummaryParams,
		TokenizerFingerprint: info.TokenizerFingerprint, Epoch: info.Epoch, Partial: info.Partial, DebugURL: info.DebugUrl,
		StreamState: info.StreamState, StreamReason: info.StreamReason, KVSource: src}
}

// clip is s cut to at most n bytes, for a log line of something a sidecar
// sent.
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// maxKVSource bounds an advertised KV source address.
const maxKVSource = 300

// KVSourceOf is the KV source a sidecar advertises for endpoint (the
// engine URL), as the picker takes it: host:port with a port in 1..65535
// and the host of endpoint itself — the host the trust check judges — so
// that a sidecar can only name a port of its own engine's host, never
// send engines to pull from elsewhere. "" (and nil) when none is
// advertised; "" and why when one is refused.
func KVSourceOf(endpoint, advertised string) (string, error) {
	if advertised == "" {
		return "", nil
	}
	if len(advertised) > maxKVSource {
		return "", fmt.Errorf("%d bytes, more than %d", len(advertised), maxKVSource)
	}
	host, port, err := net.SplitHostPort(advertised)
	if err != nil {
		return "", fmt.Errorf("not host:port: %v", err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || port != strconv.Itoa(n) {
		return "", fmt.Errorf("port %q: want 1..65535", port)
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Hostname() == "" || !strings.EqualFold(u.Hostname(), host) {
		return "", fmt.Errorf("host %q is not the engine URL's", host)
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// loadOf is kvroute's own copy of a load report.
func loadOf(l *pb.LoadReport) fleet.Load {
	return fleet.Load{Waiting: l.GetWaiting(), Running: l.GetRunning(), KVCacheUsage: l.GetKvCacheUsage(),
		EngineDown: l.GetEngineDown(), EngineError: l.GetEngineError(), StreamState: l.GetStreamState(), StreamReason: l.GetStreamReason(),
		Draining: l.GetDraining(), DrainReason: l.GetDrainReason(), Engine: engineStatsOf(l.GetEngine())}
}

// engineStatsOf is kvroute's own copy of the engine's request figures; a
// report without them (an older sidecar) has none (Have false).
func engineStatsOf(s *pb.EngineStats) fleet.EngineStats {
	if !s.GetHave() {
		return fleet.EngineStats{}
	}
	return fleet.EngineStats{Have: true, QueueSeconds: s.GetQueueSeconds(), QueueCount: s.GetQueueCount(),
		PrefillSeconds: s.GetPrefillSeconds(), PrefillCount: s.GetPrefillCount(), TTFTSeconds: s.GetTtftSeconds(), TTFTCount: s.GetTtftCount(),
		PromptTokens: s.GetPromptTokens(), CachedTokens: s.GetCachedTokens()}
}

// streamRef is one follow goroutine, and its stream's failure while it
// fails (guarded by View.mu).
type streamRef struct {
	cancel  context.CancelFunc
	failure *SidecarFailure
	static  bool // configured (WatchStatic): gossip's reconciliation leaves it
}

// Watch makes sure a stream follows the sidecar at addr.
func (v *View) Watch(addr string) { v.watch(addr, false) }

// WatchStatic is Watch for a sidecar the operator listed (--sidecars):
// following gossip (FollowGossip) never forgets it, whether or not a
// member advertises it; only Forget does.
func (v *View) WatchStatic(addr string) { v.watch(addr, true) }

func (v *View) watch(addr string, static bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ref, ok := v.streams[addr]; ok || v.closed {
		if ok && static {
			ref.static = true
		}
		return
	}
	ctx, cancel := context.WithCancel(v.closeCtx)
	ref := &streamRef{cancel: cancel, static: static}
	v.streams[addr] = ref
	v.log.Info("sidecar joined: following its summary stream", zap.String("sidecar", addr))
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		v.follow(ctx, ref, addr)
		v.mu.Lock()
		if v.streams[addr] == ref { // still ours: let a later Watch start anew
			delete(v.streams, addr)
		}
		v.mu.Unlock()
	}()
}

// Forget stops following a sidecar: it left, or gossip declared it dead.
// Its endpoints stay, routed by load only while their engines answer the
// view's health probe, for the sidecar grace period (fleet.State.
// LoseSidecar). Cancelling under the lock makes it exact: a stream checks
// its context under the same lock before touching the state.
func (v *View) Forget(addr string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dropStream(addr) {
		v.log.Warn("sidecar left: its endpoints go by load only while their engines answer",
			zap.String("sidecar", addr), zap.Duration("grace", v.cfg.Health.SidecarGrace))
	}
	v.state.LoseSidecar(addr, time.Now())
}

// dropStream ends the stream to addr and forgets what the view knows of
// the sidecar's connection, reporting whether there was one. Called with
// v.mu held.
func (v *View) dropStream(addr string) bool {
	ref, ok := v.streams[addr]
	if !ok {
		return false
	}
	ref.cancel()
	delete(v.streams, addr)
	delete(v.unfollowed, addr)
	delete(v.trust.byAddr, addr)
	return true
}

// Refused is an endpoint a sidecar offered that the view did not take.
type Refused = fleet.Refused

// ReasonModelNotFollowed is why an endpoint is not taken when its model
// is not among Config.Models: another picker shard serves it.
const ReasonModelNotFollowed = "model_not_followed"

// Refused lists the endpoints offered but not taken, sorted by URL: those
// the state refused and those of models not followed.
func (v *View) Refused() []Refused {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := v.state.Refused()
	if len(v.trust.byAddr) > 0 {
		out = v.appendUntrustedLocked(out)
	}
	if len(v.unfollowed) == 0 {
		return out
	}
	for _, rs := range v.unfollowed {
		out = append(out, rs...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Info.Endpoint < out[j].Info.Endpoint })
	return out
}

// Models returns the models the view follows (Config.Models); none:
// every model.
func (v *View) Models() []string { return slices.Clone(v.cfg.Models) }

// errNotFollowed ends a stream to a sidecar serving no model followed
// before its summaries are asked for.
var errNotFollowed = errors.New("fleetview: the sidecar serves no model this view follows")

// notFollowedRecheck is how often the view asks a sidecar serving no model
// it follows what it serves now (a sidecar restarted for another model).
const notFollowedRecheck = 30 * time.Second

// notFollowedDesc describes kvroute_picker_endpoints_not_followed.
var notFollowedDesc = prometheus.NewDesc("kvroute_picker_endpoints_not_followed",
	"Endpoints offered whose model this picker does not follow (--models): another picker shard serves them.", nil, nil)

// notFollowed counts the endpoints not followed when scraped.
type notFollowed struct{ v *View }

func (n notFollowed) Describe(ch chan<- *prometheus.Desc) { ch <- notFollowedDesc }

func (n notFollowed) Collect(ch chan<- prometheus.Metric) {
	n.v.mu.RLock()
	c := 0
	for _, rs := range n.v.unfollowed {
		c += len(rs)
	}
	n.v.mu.RUnlock()
	ch <- prometheus.MustNewConstMetric(notFollowedDesc, prometheus.GaugeValue, float64(c))
}

// FollowGossip watches every sidecar that gossip reports and forgets those
// that leave, until ctx ends. Besides the events it reconciles with the
// member list every reconcile interval, so lost events (a full buffer), an
// address change, or a late Leave for a reused address all settle. With
// Config.Models, a sidecar whose metadata advertises models none of which
// is followed is never dialled (followsMeta; counted in
// kvroute_picker_sidecars_skipped_for_model, logged at debug), and one
// followed until its metadata says so is no longer (unfollowModels); one
// that advertises no models is dialled and asked, as before.
func (v *View) FollowGossip(ctx context.Context, m *gossip.Members) {
	const reconcile = 2 * time.Second
	t := time.NewTicker(reconcile)
	defer t.Stop()
	v.reconcile(m)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			v.reconcile(m)
		case ev := <-m.Events():
			mb := ev.Member
			if mb.MetaErr != nil || mb.Meta.Role != gossip.RoleSidecar || mb.Meta.GRPC == "" {
				continue
			}
			sk := skippedMember{addr: mb.Meta.GRPC, models: mb.Meta.Models}
			switch {
			case ev.Type == gossip.Leave:
				v.reconcile(m) // forget it unless a live member still advertises it
			case v.followsMeta(mb.Meta):
				v.skips.note(mb.Name, sk, false)
				v.Watch(mb.Meta.GRPC)
			default:
				v.skips.note(mb.Name, sk, true)
				if v.streamingGossiped(mb.Meta.GRPC) {
					v.reconcile(m) // its models changed: stop unless another member still wants it followed
				}
			}
		}
	}
}

// reconcile follows exactly the sidecars gossip lists as alive whose
// advertised models it follows (followsMeta), besides the static ones
// (WatchStatic).
func (v *View) reconcile(m *gossip.Members) {
	live := map[string]bool{}
	skipped := map[string]skippedMember{}
	for _, mb := range m.Members() {
		if mb.MetaErr == nil && mb.Meta.Role == gossip.RoleSidecar && mb.Meta.GRPC != "" {
			if v.followsMeta(mb.Meta) {
				live[mb.Meta.GRPC] = true
			} else {
				skipped[mb.Name] = skippedMember{addr: mb.Meta.GRPC, models: mb.Meta.Models}
			}
		}
	}
	v.skips.reset(skipped)
	v.mu.Lock()
	var gone []string
	for addr, ref := range v.streams {
		if !live[addr] && !ref.static {
			gone = append(gone, addr)
		}
	}
	v.mu.Unlock()
	for _, addr := range gone {
		if models, ok := v.skips.skippedAddr(addr); ok {
			v.unfollowModels(addr, models)
		} else {
			v.Forget(addr)
		}
	}
	for addr := range live {
		v.Watch(addr)
	}
}

// follow keeps a stream to one sidecar until ctx ends.
func (v *View) follow(ctx context.Context, ref *streamRef, addr string) {
	creds := v.cfg.TLS
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	// A raw snapshot is m/8 bytes: above gRPC's default 4 MiB receive
	// limit once summaries are sized for more than ~2M blocks.
	maxMsg := int(v.cfg.Params.M/8) + 1<<16
	win := streamWindow(v.cfg.Params)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithInitialWindowSize(win), grpc.WithInitialConnWindowSize(win),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(max(maxMsg, 4<<20))))
	if err != nil {
		v.log.Error("sidecar address", zap.String("sidecar", addr), zap.Error(err))
		return
	}
	defer conn.Close()
	client := pb.NewSidecarClient(conn)
	failing := "" // the failure's reason: one log line per transition, not per retry
	up := func() {
		if failing != "" {
			failing = ""
			v.setFailure(ref, nil)
			v.log.Info("summary stream recovered", zap.String("sidecar", addr))
		}
	}
	for ctx.Err() == nil {
		err := v.stream(ctx, client, addr, up)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNotFollowed) || errors.Is(err, errUntrusted) {
			select { // no summaries wanted: only look again, now and then
			case <-ctx.Done():
				return
			case <-time.After(max(v.cfg.Retry, notFollowedRecheck)):
			}
			continue
		}
		if status.Code(err) == codes.Unavailable {
			// The sidecar cannot be reached (dead, or cut off): its
			// endpoints go by load only at once while their engines
			// answer, rather than after the summary goes stale; a stream
			// that comes back takes them back.
			v.mu.Lock()
			if ctx.Err() == nil {
				v.state.LoseSidecar(addr, time.Now())
			}
			v.mu.Unlock()
		}
		reason := failureReason(err)
		v.setFailure(ref, &SidecarFailure{Sidecar: addr, Reason: reason, Error: err.Error(), Since: time.Now()})
		if failing != reason {
			failing = reason
			fields := []zap.Field{zap.String("sidecar", addr), zap.String("reason", reason), zap.Error(err), zap.Duration("retry", v.cfg.Retry)}
			if hint := failureHint(reason); hint != "" {
				fields = append(fields, zap.String("hint", hint))
			}
			v.log.Warn("summary stream failed; retrying", fields...)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(v.cfg.Retry):
		}
	}
}

// streamWindow is the flow-control window of a summary stream (and of its
// connection): room for a whole snapshot (m/8 bytes, and some), so that a
// sidecar sends one without waiting on window updates, at most 16 MiB.
// Setting it also makes the window static: gRPC's bandwidth probe, which
// answers each burst of data with a window update and a ping (two frames
// written, and their ack read, for nearly every delta and load report on
// each of a thousand streams), is off. What a stream may hold unread is
// bounded by the window.
func streamWindow(p summary.Params) int32 {
	return int32(min(max(int(p.M/8)+1<<16, 1<<16), 16<<20))
}

func (v *View) stream(ctx context.Context, client pb.SidecarClient, addr string, up func()) error {
	info, err := client.Info(ctx, &pb.InfoRequest{})
	if err != nil {
		return err
	}
	known, err := v.register(ctx, addr, info)
	if err != nil {
		return err
	}
	ws, err := client.WatchSummaries(ctx, &pb.WatchRequest{Known: known})
	if err != nil {
		return err
	}
	up()
	var feeds pb.Feeds
	for {
		u, err := ws.Recv()
		if err != nil {
			return err
		}
		if err := feeds.Resolve(u); err != nil {
			v.malformed.Inc()
			return fmt.Errorf("fleetview: %w", err)
		}
		if err := v.apply(ctx, addr, u); err != nil {
			if resync(err) {
				v.resyncs.Inc()
			} else if ctx.Err() == nil {
				v.malformed.Inc()
			}
			return err
		}
	}
}

// resync reports whether a stream ended by err should restart to take
// snapshots (rather than having met a malformed update): a delta that did
// not follow, or a snapshot load overtaken by a change to its endpoint.
func resync(err error) bool {
	return fleet.FaultOf(err) == fleet.Resync || errors.Is(err, summary.ErrAbandoned)
}

// register hands a sidecar's endpoints to the state, counts and logs its
// refusals, and returns the positions the state holds for them.
func (v *View) register(ctx context.Context, addr string, info *pb.InfoResponse) (map[string]*pb.Position, error) {
	var ids []fleet.Identity
	var skipped []Refused
	for _, ei := range info.Endpoints {
		id := identityOf(ei)
		if _, err := KVSourceOf(ei.Endpoint, ei.KvSource); err != nil {
			v.log.Warn("KV source refused: the endpoint is never named as one", zap.String("sidecar", addr), zap.String("endpoint", ei.Endpoint),
				zap.String("kv_source", clip(ei.KvSource, 64)), zap.Error(err))
		}
		if v.models != nil && !v.models[id.Model] {
			skipped = append(skipped, Refused{Info: id, Sidecar: addr, Reason: ReasonModelNotFollowed})
			continue
		}
		ids = append(ids, id)
	}
	ids, notTrusted := v.trust.judge(ctx, addr, ids) // names resolved outside the lock
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err // forgotten meanwhile
	}
	v.noteUntrustedLocked(addr, ids, notTrusted, time.Now())
	if len(skipped) > 0 {
		if len(v.unfollowed[addr]) != len(skipped) {
			v.log.Info("endpoints not followed: their model is not among --models", zap.String("sidecar", addr),
				zap.Int("endpoints", len(skipped)), zap.String("model", skipped[0].Info.Model))
		}
		v.unfollowed[addr] = skipped
	} else {
		delete(v.unfollowed, addr)
	}
	reg, err := v.state.Register(addr, ids, v.liveLocked, time.Now())
	for _, r := range reg.Refused {
		switch r.Reason {
		case fleet.ReasonSummaryParams:
			v.refused.Inc()
			v.log.Warn("endpoint refused: summary parameters differ", zap.String("endpoint", r.Info.Endpoint),
				zap.String("theirs", r.Info.SummaryParams), zap.String("ours", v.cfg.Params.String()))
		case fleet.ReasonGroupFull:
			v.refused.Inc()
			v.log.Warn("endpoint refused: identity group full", zap.String("endpoint", r.Info.Endpoint))
		case fleet.ReasonOtherOwner:
			v.conflict.Inc() // another sidecar streams it: the first owner keeps it
		}
	}
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 && len(notTrusted) > 0 {
		return nil, errUntrusted // none trusted: no stream, asked again later
	}
	if len(ids) == 0 && len(skipped) > 0 {
		return nil, errNotFollowed // its endpoints dropped (Register with none): no stream
	}
	known := map[string]*pb.Position{}
	for _, p := range reg.Positions {
		known[p.Endpoint+"|"+p.Tier.String()] = &pb.Position{Epoch: p.Epoch, Seq: p.Seq}
	}
	return known, nil
}

// liveLocked reports whether a stream follows the sidecar at addr: its
// endpoints are not for another sidecar to take. Callers hold v.mu.
func (v *View) liveLocked(addr string) bool {
	_, ok := v.streams[addr]
	return ok
}

// tierOf reads an update's wire tier. A name that is no tier (or none)
// yields an invalid Tier, which the state refuses as malformed once it
// knows the update is for an endpoint it holds.
func tierOf(name string) tier.Tier {
	if t, ok := tier.Parse(name); ok {
		return t
	}
	return tier.Tier(tier.Count)
}

// apply decodes u (outside the lock: snapshots are large) and hands it to
// the state. Each step under the lock first checks ctx: a forgotten
// sidecar's stream never touches the state again.
func (v *View) apply(ctx context.Context, addr string, u *pb.SummaryUpdate) error {
	switch b := u.Body.(type) {
	case *pb.SummaryUpdate_Load:
		v.mu.Lock()
		if err := ctx.Err(); err != nil {
			v.mu.Unlock()
			return err // forgotten meanwhile
		}
		ok := v.state.ApplyLoad(addr, u.Endpoint, loadOf(b.Load), time.Now())
		v.mu.Unlock()
		if ok {
			v.applied.WithLabelValues("load").Inc()
		}
		return nil
	case *pb.SummaryUpdate_Snapshot:
		snap, err := summary.DecodeSnapshot(b.Snapshot.GetData(), v.cfg.Params)
		if err != nil {
			return err
		}
		snap.Seq = b.Snapshot.GetSeq()
		// The wire bytes are garbage from here: let them go while the load
		// waits its turn (a thousand streams' snapshots arrive together).
		b.Snapshot.Data = nil
		v.mu.Lock()
		if err := ctx.Err(); err != nil {
			v.mu.Unlock()
			return err
		}
		load, err := v.state.StartSnapshot(addr, u.Endpoint, tierOf(u.Tier), u.Epoch, snap, time.Now())
		v.mu.Unlock()
		if load == nil || err != nil {
			return err // ignored (not this sidecar's endpoint here), or malformed
		}
		v.applied.WithLabelValues("snapshot").Inc()
		v.snapshots.Add(1)
		return v.loader.load(ctx, load) // written with the others of its index, a step at a time, the lock held for each step's writes; a change to the endpoint meanwhile abandons it (the stream restarts)
	case *pb.SummaryUpdate_Delta:
		d, err := summary.DecodeDelta(b.Delta.GetData(), b.Delta.GetSeq(), v.cfg.Params)
		if err != nil {
			return err
		}
		v.mu.Lock()
		if err := ctx.Err(); err != nil {
			v.mu.Unlock()
			return err
		}
		ok, err := v.state.ApplyDelta(addr, u.Endpoint, tierOf(u.Tier), u.Epoch, d, time.Now())
		v.mu.Unlock()
		if !ok || err != nil {
			return err
		}
		v.applied.WithLabelValues("delta").Inc()
		if ns := b.Delta.GetOldestEventUnixNanos(); ns > 0 {
			lag := max(0, time.Since(time.Unix(0, ns)))
			v.lag.Observe(lag.Seconds())
			v.mu.Lock()
			v.state.RecordLag(u.Endpoint, lag)
			v.mu.Unlock()
		}
		return nil
	}
	v.mu.Lock() // an update without a body: nothing to apply, but heard
	defer v.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	v.state.Touch(addr, u.Endpoint, time.Now())
	return nil
}

// Match returns, for every endpoint of the group that may hold a prefix of
// chain in tier t, its matched length in blocks, the leaders verified
// (fleet.State.Match).
func (v *View) Match(groupID string, t tier.Tier, chain []blockkey.Key) map[string]int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.state.Match(groupID, t, chain)
}

// staleDesc describes kvroute_picker_endpoint_staleness_seconds.
var staleDesc = prometheus.NewDesc("kvroute_picker_endpoint_staleness_seconds",
	"Time since the last update (delta, snapshot or load report) from an endpoint's sidecar, by engine (its URL).", []string{"engine"}, nil)

// staleness computes each endpoint's staleness when scraped.
type staleness struct{ v *View }

func (s staleness) Describe(ch chan<- *prometheus.Desc) { ch <- staleDesc }

func (s staleness) Collect(ch chan<- prometheus.Metric) {
	for _, ep := range s.v.Endpoints() {
		if !ep.LastUpdate.IsZero() {
			ch <- prometheus.MustNewConstMetric(staleDesc, prometheus.GaugeValue, time.Since(ep.LastUpdate).Seconds(), ep.URL)
		}
	}
}

// Sync is how far the view is from holding what every endpoint's sidecar
// has to tell: a restarted picker has synced when every endpoint held has
// reported, with no snapshot waiting.
type Sync struct {
	// Endpoints are the endpoints held (followed and taken). Reported are
	// those whose sidecar's first state has been applied: a load report,
	// which a sidecar sends after the endpoint's snapshots (one a tier it
	// has) and which the view applies only once those are written.
	// Loaded are those with a complete summary in the index, in some tier
	// (an engine that has cached nothing yet may have none).
	Endpoints, Reported, Loaded int
	// Snapshots is how many the view has received since it started (each
	// one's load begun); Waiting how many of those are not yet written
	// into the index.
	Snapshots, Waiting int64
}

// Synced reports whether every endpoint held (one at least) has reported,
// with no snapshot waiting.
func (s Sync) Synced() bool { return s.Endpoints > 0 && s.Reported == s.Endpoints && s.Waiting == 0 }

// Sync reports the view's sync (GET /debug/sync shows it, cheaply enough
// to poll while a picker syncs).
func (v *View) Sync() Sync {
	v.mu.RLock()
	defer v.mu.RUnlock()
	eps := v.state.Endpoints()
	s := Sync{Endpoints: len(eps), Snapshots: v.snapshots.Load(), Waiting: v.loader.waiting.Load()}
	for i := range eps {
		if eps[i].HasLoad() {
			s.Reported++
		}
		if len(v.state.Positions(eps[i].URL)) > 0 {
			s.Loaded++
		}
	}
	return s
}

// Endpoints returns the endpoints known, sorted by URL.
func (v *View) Endpoints() []fleet.Endpoint {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.state.Endpoints()
}

// GroupEndpoints returns the endpoints of one identity group, sorted by
// URL: what a request needs, at a cost bounded by its group, not the
// fleet (fleet.State.GroupEndpoints).
func (v *View) GroupEndpoints(groupID string) []fleet.Endpoint {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.state.GroupEndpoints(groupID)
}

// Roster returns one identity group's endpoints as the core last
// published them (fleet.State.Roster): shared, immutable, rebuilt only
// after a change; nil for a group not held. What a decision reads.
func (v *View) Roster(groupID string) *fleet.Roster {
	v.mu.RLock()
	defer v.mu.RUnlock()
	v.rosterMu.Lock()
	defer v.rosterMu.Unlock()
	return v.state.Roster(groupID)
}

// Close stops every stream.
func (v *View) Close() {
	v.mu.Lock()
	v.closed = true
	v.close()
	v.mu.Unlock()
	v.wg.Wait()
}
