package fleetview

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// Config configures a view.
type Config struct {
	// Params are the fleet-wide summary parameters; sidecars advertising
	// others are refused.
	Params summary.Params
	// Slots bounds the endpoints of one identity group. Default 256.
	Slots int
	// Retry is the wait before re-dialling a sidecar whose stream ended.
	// Default 500 ms.
	Retry time.Duration
	// TLS, when set, is used to dial sidecars; nil dials in plaintext.
	TLS credentials.TransportCredentials
}

// Validate checks c.
func (c *Config) Validate() error {
	if err := c.Params.Validate(); err != nil {
		return err
	}
	if c.Slots < 1 || c.Slots > 256 {
		return fmt.Errorf("fleetview: %d slots per group: want 1..256", c.Slots)
	}
	if c.Retry <= 0 {
		return errors.New("fleetview: retry interval must be positive")
	}
	return nil
}

// endpoint is one engine rank as the view holds it.
type endpoint struct {
	fleet.Endpoint
	slot int
}

type group struct {
	tiers map[string]*summary.Fleet
	slots []string // slot → endpoint URL ("" free)
}

// View is the picker's fleet view.
type View struct {
	cfg Config
	log *zap.Logger

	mu        sync.RWMutex
	groups    map[string]*group
	endpoints map[string]*endpoint // by URL
	// refusedEps are endpoints a sidecar offered that the view could not
	// take, by URL, until they are taken or their sidecar is forgotten.
	refusedEps map[string]Refused
	streams    map[string]*streamRef
	closed     bool

	wg        sync.WaitGroup
	refused   prometheus.Counter
	conflict  prometheus.Counter
	resyncs   prometheus.Counter
	malformed prometheus.Counter
	applied   *prometheus.CounterVec
	lag       prometheus.Histogram
	closeCtx  context.Context
	close     context.CancelFunc
}

// New returns an empty view.
func New(cfg Config, log *zap.Logger, reg prometheus.Registerer) (*View, error) {
	if cfg.Slots == 0 {
		cfg.Slots = 256
	}
	if cfg.Retry == 0 {
		cfg.Retry = 500 * time.Millisecond
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	v := &View{cfg: cfg, log: log, groups: map[string]*group{}, endpoints: map[string]*endpoint{}, refusedEps: map[string]Refused{}, streams: map[string]*streamRef{},
		refused:   prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_picker_endpoints_refused_total", Help: "Endpoints refused (other summary parameters, no free slot)."}),
		conflict:  prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_picker_endpoint_conflicts_total", Help: "Endpoints claimed by a second sidecar while the first still streams them (ignored)."}),
		resyncs:   prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_picker_summary_resyncs_total", Help: "Streams restarted to take a snapshot after a delta that did not follow."}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_picker_summary_malformed_total", Help: "Updates refused as malformed (undecodable summary, unknown feed number); the stream restarts."}),
		applied:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_picker_summary_updates_total", Help: "Summary updates applied, by kind."}, []string{"kind"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvroute_picker_event_to_routable_seconds",
			Help:    "From the engine stamping a batch to its blocks being routable here (engine and picker clocks).",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 5}}),
	}
	if reg != nil {
		reg.MustRegister(v.refused, v.conflict, v.resyncs, v.malformed, v.applied, v.lag, staleness{v})
	}
	v.closeCtx, v.close = context.WithCancel(context.Background())
	return v, nil
}

// GroupID names an endpoint's identity group.
func GroupID(info *pb.EndpointInfo) string { return identityOf(info).Group() }

// identityOf is kvroute's own copy of what a sidecar says of an endpoint.
func identityOf(info *pb.EndpointInfo) fleet.Identity {
	return fleet.Identity{Endpoint: info.Endpoint, Rank: int(info.Rank), Model: info.Model, BlockSize: int(info.BlockSize),
		NumGPUBlocks: int(info.NumGpuBlocks), HashAlgo: info.HashAlgo, KeyFormat: info.KeyFormat, SummaryParams: info.SummaryParams,
		TokenizerFingerprint: info.TokenizerFingerprint, Epoch: info.Epoch, Partial: info.Partial, DebugURL: info.DebugUrl}
}

// loadOf is kvroute's own copy of a load report.
func loadOf(l *pb.LoadReport) fleet.Load {
	return fleet.Load{Waiting: l.GetWaiting(), Running: l.GetRunning(), KVCacheUsage: l.GetKvCacheUsage()}
}

// streamRef is one follow goroutine.
type streamRef struct{ cancel context.CancelFunc }

// Watch makes sure a stream follows the sidecar at addr.
func (v *View) Watch(addr string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.streams[addr]; ok || v.closed {
		return
	}
	ctx, cancel := context.WithCancel(v.closeCtx)
	ref := &streamRef{cancel: cancel}
	v.streams[addr] = ref
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		v.follow(ctx, addr)
		v.mu.Lock()
		if v.streams[addr] == ref { // still ours: let a later Watch start anew
			delete(v.streams, addr)
		}
		v.mu.Unlock()
	}()
}

// Forget stops following a sidecar and drops its endpoints. Cancelling
// under the lock makes it exact: a stream checks its context under the
// same lock before touching the view.
func (v *View) Forget(addr string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if ref, ok := v.streams[addr]; ok {
		ref.cancel()
		delete(v.streams, addr)
	}
	for url, ep := range v.endpoints {
		if ep.Sidecar == addr {
			v.removeLocked(url)
		}
	}
	for url, r := range v.refusedEps {
		if r.Sidecar == addr {
			delete(v.refusedEps, url)
		}
	}
}

// Refused is an endpoint a sidecar offered that the view did not take.
type Refused = fleet.Refused

// Refused lists the endpoints offered but not taken, sorted by URL.
func (v *View) Refused() []Refused {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]Refused, 0, len(v.refusedEps))
	for _, r := range v.refusedEps {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Info.Endpoint < out[j].Info.Endpoint })
	return out
}

func (v *View) removeLocked(url string) {
	ep := v.endpoints[url]
	if ep == nil {
		return
	}
	if g := v.groups[ep.Group]; g != nil {
		for _, f := range g.tiers {
			f.Remove(ep.slot)
		}
		g.slots[ep.slot] = ""
		empty := true
		for _, u := range g.slots {
			empty = empty && u == ""
		}
		if empty {
			delete(v.groups, ep.Group) // its fleets' memory goes with it
		}
	}
	delete(v.endpoints, url)
}

// FollowGossip watches every sidecar that gossip reports and forgets those
// that leave, until ctx ends. Besides the events it reconciles with the
// member list every reconcile interval, so lost events (a full buffer), an
// address change, or a late Leave for a reused address all settle.
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
			if ev.Type == gossip.Leave {
				v.reconcile(m) // forget it unless a live member still advertises it
			} else {
				v.Watch(mb.Meta.GRPC)
			}
		}
	}
}

// reconcile follows exactly the sidecars gossip lists as alive.
func (v *View) reconcile(m *gossip.Members) {
	live := map[string]bool{}
	for _, mb := range m.Members() {
		if mb.MetaErr == nil && mb.Meta.Role == gossip.RoleSidecar && mb.Meta.GRPC != "" {
			live[mb.Meta.GRPC] = true
		}
	}
	v.mu.Lock()
	var gone []string
	for addr := range v.streams {
		if !live[addr] {
			gone = append(gone, addr)
		}
	}
	v.mu.Unlock()
	for _, addr := range gone {
		v.Forget(addr)
	}
	for addr := range live {
		v.Watch(addr)
	}
}

// follow keeps a stream to one sidecar until ctx ends.
func (v *View) follow(ctx context.Context, addr string) {
	creds := v.cfg.TLS
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	// A raw snapshot is m/8 bytes: above gRPC's default 4 MiB receive
	// limit once summaries are sized for more than ~2M blocks.
	maxMsg := int(v.cfg.Params.M/8) + 1<<16
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(max(maxMsg, 4<<20))))
	if err != nil {
		v.log.Error("sidecar address", zap.String("sidecar", addr), zap.Error(err))
		return
	}
	defer conn.Close()
	client := pb.NewSidecarClient(conn)
	for ctx.Err() == nil {
		err := v.stream(ctx, client, addr)
		if ctx.Err() != nil {
			return
		}
		v.log.Debug("summary stream ended", zap.String("sidecar", addr), zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(v.cfg.Retry):
		}
	}
}

// errResync ends a stream so that the next one starts from snapshots.
var errResync = errors.New("fleetview: delta out of order; resynchronising")

func (v *View) stream(ctx context.Context, client pb.SidecarClient, addr string) error {
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
			if errors.Is(err, errResync) {
				v.resyncs.Inc()
			} else if ctx.Err() == nil {
				v.malformed.Inc()
			}
			return err
		}
	}
}

// register records a sidecar's endpoints (assigning slots) and returns the
// positions the view holds for them.
func (v *View) register(ctx context.Context, addr string, info *pb.InfoResponse) (map[string]*pb.Position, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err // forgotten meanwhile
	}
	listed := map[string]bool{}
	for _, ei := range info.Endpoints {
		listed[ei.Endpoint] = true
	}
	for url, ep := range v.endpoints { // endpoints the sidecar no longer serves
		if ep.Sidecar == addr && !listed[url] {
			v.removeLocked(url)
		}
	}
	for url, r := range v.refusedEps {
		if r.Sidecar == addr && !listed[url] {
			delete(v.refusedEps, url)
		}
	}
	known := map[string]*pb.Position{}
	for _, ei := range info.Endpoints {
		if ei.SummaryParams != v.cfg.Params.String() {
			v.refused.Inc()
			v.refusedEps[ei.Endpoint] = Refused{Info: identityOf(ei), Sidecar: addr, Reason: "summary_params"}
			v.log.Warn("endpoint refused: summary parameters differ", zap.String("endpoint", ei.Endpoint),
				zap.String("theirs", ei.SummaryParams), zap.String("ours", v.cfg.Params.String()))
			continue
		}
		gid := GroupID(ei)
		ep := v.endpoints[ei.Endpoint]
		if ep != nil && ep.Sidecar != addr {
			if _, live := v.streams[ep.Sidecar]; live {
				v.conflict.Inc() // another sidecar streams it: keep the first owner
				v.refusedEps[ei.Endpoint] = Refused{Info: identityOf(ei), Sidecar: addr, Reason: "other_owner"}
				continue
			}
		}
		if ep != nil && (ep.Group != gid || ep.Sidecar != addr) {
			v.removeLocked(ei.Endpoint) // identity or owner changed
			ep = nil
		}
		if ep == nil {
			g := v.groups[gid]
			if g == nil {
				g = &group{tiers: map[string]*summary.Fleet{}, slots: make([]string, v.cfg.Slots)}
				v.groups[gid] = g
			}
			slot := -1
			for i, u := range g.slots {
				if u == "" {
					slot = i
					break
				}
			}
			if slot < 0 {
				v.refused.Inc()
				v.refusedEps[ei.Endpoint] = Refused{Info: identityOf(ei), Sidecar: addr, Reason: "group_full"}
				v.log.Warn("endpoint refused: identity group full", zap.String("endpoint", ei.Endpoint))
				continue
			}
			// Fleets hold 64 slots per row word; grow them as endpoints come.
			for _, f := range g.tiers {
				if err := f.Grow(slot + 1); err != nil {
					return nil, err
				}
			}
			g.slots[slot] = ei.Endpoint
			ep = &endpoint{Endpoint: fleet.Endpoint{URL: ei.Endpoint, Sidecar: addr, Group: gid}, slot: slot}
			v.endpoints[ei.Endpoint] = ep
		}
		ep.Info = identityOf(ei)
		delete(v.refusedEps, ei.Endpoint)
		for tier, f := range v.groups[gid].tiers {
			if epoch, seq, ok := f.Position(ep.slot); ok {
				known[ei.Endpoint+"|"+tier] = &pb.Position{Epoch: epoch, Seq: seq}
			}
		}
	}
	return known, nil
}

func (v *View) apply(ctx context.Context, addr string, u *pb.SummaryUpdate) error {
	// Decode before taking the lock: snapshots are large.
	var dec decoded
	switch b := u.Body.(type) {
	case *pb.SummaryUpdate_Snapshot:
		snap, err := summary.DecodeSnapshot(b.Snapshot.GetData(), v.cfg.Params)
		if err != nil {
			return err
		}
		dec.snap = &snap
	case *pb.SummaryUpdate_Delta:
		d, err := summary.DecodeDelta(b.Delta.GetData(), b.Delta.GetSeq(), v.cfg.Params)
		if err != nil {
			return err
		}
		dec.delta = &d
	}
	v.mu.Lock()
	load, err := v.applyLocked(ctx, addr, u, dec)
	v.mu.Unlock()
	if load == nil || err != nil {
		return err
	}
	// A snapshot is written a part at a time, the lock released between
	// parts so that lookups never wait for a whole summary's rewrite; the
	// endpoint reads as absent in that tier until the last part.
	for {
		v.mu.Lock()
		if err := ctx.Err(); err != nil {
			v.mu.Unlock()
			return err
		}
		done, err := load.Step(snapshotStepWords)
		v.mu.Unlock()
		if errors.Is(err, summary.ErrAbandoned) {
			return errResync // the slot changed under the load: start over
		}
		if err != nil || done {
			return err
		}
	}
}

// snapshotStepWords is how much of a snapshot one locked step writes:
// 64Ki rows, well under a millisecond.
const snapshotStepWords = 1024

// applyLocked applies u to its endpoint, or starts the load of a snapshot
// (returned for the caller to step). Callers hold v.mu.
func (v *View) applyLocked(ctx context.Context, addr string, u *pb.SummaryUpdate, dec decoded) (*summary.SnapshotLoad, error) {
	if err := ctx.Err(); err != nil {
		return nil, err // forgotten meanwhile
	}
	ep := v.endpoints[u.Endpoint]
	if ep == nil || ep.Sidecar != addr {
		return nil, nil // refused, forgotten, or another sidecar's
	}
	load, err := v.applyEndpointLocked(ep, u, dec)
	if err != nil && !errors.Is(err, errResync) {
		// A bad update: drop the slot so nothing routes on a broken base;
		// the stream restarts and takes a snapshot.
		if g := v.groups[ep.Group]; g != nil && g.tiers[u.Tier] != nil {
			g.tiers[u.Tier].Remove(ep.slot)
		}
	}
	return load, err
}

// decoded is an update's payload, decoded outside the view's lock.
type decoded struct {
	snap  *summary.Snapshot
	delta *summary.Delta
}

func (v *View) applyEndpointLocked(ep *endpoint, u *pb.SummaryUpdate, dec decoded) (*summary.SnapshotLoad, error) {
	ep.LastUpdate = time.Now()
	g := v.groups[ep.Group]
	switch b := u.Body.(type) {
	case *pb.SummaryUpdate_Load:
		ep.Load, ep.LoadAt = loadOf(b.Load), ep.LastUpdate
		v.applied.WithLabelValues("load").Inc()
		return nil, nil
	case *pb.SummaryUpdate_Snapshot:
		snap := *dec.snap
		snap.Seq = b.Snapshot.GetSeq()
		f, err := v.fleetLocked(g, u.Tier)
		if err != nil {
			return nil, err
		}
		v.applied.WithLabelValues("snapshot").Inc()
		return f.LoadSnapshot(ep.slot, u.Epoch, snap)
	case *pb.SummaryUpdate_Delta:
		d := *dec.delta
		f, err := v.fleetLocked(g, u.Tier)
		if err != nil {
			return nil, err
		}
		if err := f.ApplyDelta(ep.slot, u.Epoch, d); err != nil {
			var se *summary.SeqError
			if errors.As(err, &se) {
				f.Remove(ep.slot) // stale: drop it until the snapshot arrives
				return nil, errResync
			}
			return nil, err
		}
		v.applied.WithLabelValues("delta").Inc()
		if ns := b.Delta.GetOldestEventUnixNanos(); ns > 0 {
			v.lag.Observe(max(0, time.Since(time.Unix(0, ns)).Seconds()))
		}
	}
	return nil, nil
}

func (v *View) fleetLocked(g *group, tier string) (*summary.Fleet, error) {
	if tier == "" {
		return nil, errors.New("fleetview: summary update without a tier")
	}
	f := g.tiers[tier]
	if f == nil {
		var err error
		used := 0
		for i, u := range g.slots {
			if u != "" {
				used = i + 1
			}
		}
		if f, err = summary.NewFleet(v.cfg.Params, max(used, 1)); err != nil {
			return nil, err
		}
		g.tiers[tier] = f
	}
	return f, nil
}

// Match returns, for every endpoint of the group that may hold a prefix of
// chain in tier, its matched length in blocks.
func (v *View) Match(groupID string, t tier.Tier, chain []blockkey.Key) map[string]int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	g := v.groups[groupID]
	if g == nil || g.tiers[t.String()] == nil {
		return nil
	}
	f := g.tiers[t.String()]
	matched := make([]int, f.Slots())
	f.Match(chain, matched)
	matched = matched[:min(len(matched), len(g.slots))]
	// The search assumes prefix-closed caches; walk the leaders' chains to
	// confirm them (DESIGN §6), until the longest match is a verified one.
	verified := make([]bool, len(matched))
	for range matched {
		best, slot := 0, -1
		for s, n := range matched {
			if n > best && !verified[s] {
				best, slot = n, s
			}
		}
		if slot < 0 {
			break
		}
		matched[slot], verified[slot] = f.Verify(chain, slot, best), true
		if matched[slot] == best {
			break // the longest match holds
		}
	}
	out := map[string]int{}
	for slot, url := range g.slots {
		if url != "" && slot < len(matched) {
			out[url] = matched[slot]
		}
	}
	return out
}

// staleDesc describes kvroute_picker_endpoint_staleness_seconds.
var staleDesc = prometheus.NewDesc("kvroute_picker_endpoint_staleness_seconds",
	"Time since the last update (delta, snapshot or load report) from an endpoint's sidecar.", []string{"endpoint"}, nil)

// staleness computes each endpoint's staleness when scraped.
type staleness struct{ v *View }

func (s staleness) Describe(ch chan<- *prometheus.Desc) { ch <- staleDesc }

func (s staleness) Collect(ch chan<- prometheus.Metric) {
	s.v.mu.RLock()
	defer s.v.mu.RUnlock()
	for url, ep := range s.v.endpoints {
		if !ep.LastUpdate.IsZero() {
			ch <- prometheus.MustNewConstMetric(staleDesc, prometheus.GaugeValue, time.Since(ep.LastUpdate).Seconds(), url)
		}
	}
}

// Endpoints returns the endpoints known, sorted by URL.
func (v *View) Endpoints() []fleet.Endpoint {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]fleet.Endpoint, 0, len(v.endpoints))
	for _, ep := range v.endpoints {
		out = append(out, ep.Endpoint)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].URL < out[j].URL })
	return out
}

// Close stops every stream.
func (v *View) Close() {
	v.mu.Lock()
	v.closed = true
	v.close()
	v.mu.Unlock()
	v.wg.Wait()
}
