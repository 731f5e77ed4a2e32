package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/sidecar/index"
	"github.com/kvroute/kvroute/sidecar/sequence"
	"github.com/kvroute/kvroute/sidecar/streamhealth"
)

// recentEvent is one line of the recent-events view: hashes and counts,
// never token ids or text.
type recentEvent struct {
	Seq        uint64   `json:"seq"`
	Type       string   `json:"type"`
	Tier       string   `json:"tier,omitempty"`
	Blocks     int      `json:"blocks"`
	Hashes     []uint64 `json:"hashes,omitempty"` // at most 4
	HasParent  bool     `json:"has_parent,omitempty"`
	Error      string   `json:"error,omitempty"`
	AppliedAgo string   `json:"-"`
}

const recentCap = 128

// endpointConfig is the sidecar's configuration as a running endpoint
// reads it (the fields are Config's, of the same names).
type endpointConfig struct {
	Topic          string
	Bind           bool
	DeltaInterval  time.Duration
	IdleCheck      time.Duration
	ScrapeInterval time.Duration
	ScrapeTimeout  time.Duration
	ReplayTimeout  time.Duration
	StartupTimeout time.Duration
}

func newEndpointConfig(cfg *Config) endpointConfig {
	return endpointConfig{Topic: cfg.Topic, Bind: cfg.Bind, DeltaInterval: cfg.DeltaInterval, IdleCheck: cfg.IdleCheck,
		ScrapeInterval: cfg.ScrapeInterval, ScrapeTimeout: cfg.ScrapeTimeout, ReplayTimeout: cfg.ReplayTimeout,
		StartupTimeout: cfg.StartupTimeout}
}

// endpointDeps is what the sidecar that owns an endpoint gives it, and
// all the endpoint reaches of its owner: no path leads from an endpoint
// back to the Sidecar.
type endpointDeps struct {
	cfg     endpointConfig
	log     *zap.Logger // the owner's; the endpoint names its rank and engine
	metrics *metrics    // the owner's series, which the endpoint's label selects
	hub     *hub        // takes the endpoint's snapshots, deltas and load reports
	// drainReason is the drain the owner announced, "" while none is.
	drainReason func() string
	// answered and waiting tell the starting admin surface how the
	// identification of the endpoint's engine goes.
	answered func(rank int)
	waiting  func(rank int, err error)
}

// endpoint is one rank. Its intake goroutine owns the sockets and the
// sequencer, and carries out the sequencer's actions; the state below mu
// shows what it has carried out, to the debug server, the stream and the
// scraper.
type endpoint struct {
	// Given by the owner (endpointDeps), and fixed.
	cfg         endpointConfig
	metrics     *metrics
	hub         *hub
	drainReason func() string
	answered    func(rank int)
	waiting     func(rank int, err error)

	rank      int
	engineURL string
	events    string
	replay    string
	kvSource  string // the P2P side channel peers pull from, host:port ("" none: Config.P2PPort)
	log       *zap.Logger
	restartCh chan float64 // new engine start time, from the scraper

	seq *sequence.Sequencer // intake goroutine only: decides the ordering

	oldestPending float64 // engine ts of the oldest batch applied since the last delta (under mu)

	mu         sync.Mutex
	idx        *index.Index
	epoch      uint64
	lastSeq    uint64
	haveSeq    bool
	partial    bool
	live       bool
	intakeOpen bool
	judge      *streamhealth.Judge // the live stream's health, from the intake's batches and the scraper's counters
	stream     streamhealth.Status // as the scraper last judged it
	counters   endpointCounters
	recent     []recentEvent
	deltaSeq   [tier.Count]uint64
	identity   Identity
	load       Load
}

type endpointCounters struct {
	Batches        uint64 `json:"batches"`
	Malformed      uint64 `json:"malformed_payloads"`
	Gaps           uint64 `json:"seq_gaps"`
	Replays        uint64 `json:"replays"`
	ReplayFailures uint64 `json:"replay_failures"`
	Restarts       uint64 `json:"engine_restarts"`
	WrongTopic     uint64 `json:"wrong_topic"`
}

// newEndpoint identifies rank r's engine and prepares its endpoint: its
// addresses, index and sequencer, and what its owner gives it (d).
func newEndpoint(ctx context.Context, hc *http.Client, cfg *Config, r int, d endpointDeps) (*endpoint, error) {
	// Epochs start from the clock, so positions a picker holds from an
	// earlier sidecar process never match this one's.
	epoch := uint64(time.Now().UnixNano())
	ep := &endpoint{cfg: d.cfg, metrics: d.metrics, hub: d.hub, drainReason: d.drainReason, answered: d.answered, waiting: d.waiting,
		rank: r, restartCh: make(chan float64, 1), epoch: epoch}
	var err error
	if ep.engineURL, err = offsetURL(cfg.EngineURL, r); err != nil {
		return nil, err
	}
	if ep.events, err = offsetPort(cfg.KVEvents, r); err != nil {
		return nil, err
	}
	if cfg.Replay != "" {
		if ep.replay, err = offsetPort(cfg.Replay, r); err != nil {
			return nil, err
		}
	}
	if ep.kvSource, err = kvSourceAddr(ep.engineURL, cfg.P2PPort, r); err != nil {
		return nil, err
	}
	ep.log = d.log.With(zap.Int("rank", r), zap.String("engine", ep.engineURL))
	if ep.identity, err = ep.identify(ctx, hc, cfg.Model); err != nil {
		return nil, err
	}
	ep.identity.KeyFormat = blockkey.FormatV1
	ep.identity.SummaryParams = cfg.Params().String()
	// The series exist since openAdmin (the label, ep.label(), is the
	// engine URL); the engine answered: the scrape loop keeps it from here.
	ep.metrics.engineDown.WithLabelValues(ep.label()).Set(0)
	icfg := index.DefaultConfig()
	icfg.Model, icfg.Params = ep.identity.Model, cfg.Params()
	if bs := ep.identity.BlockSize; bs > 0 { // else learned from the first run
		icfg.BlockSize, icfg.LearnBlockSize = bs, false
	}
	if ep.idx, err = index.New(icfg); err != nil {
		return nil, err
	}
	qcfg := sequence.DefaultConfig()
	qcfg.Replay, qcfg.IdleCheck = ep.replay != "", cfg.IdleCheck
	if ep.seq, err = sequence.New(qcfg, epoch); err != nil {
		return nil, err
	}
	hcfg := streamhealth.DefaultConfig()
	hcfg.Window, hcfg.Bind = cfg.StreamWindow, cfg.Bind
	if ep.judge, err = streamhealth.New(hcfg); err != nil {
		return nil, err
	}
	ep.stream = ep.judge.Status()
	ep.setStreamGauge(ep.stream.State)
	return ep, nil
}

// intake is the intake goroutine's sockets, decoder and wake-up pacing.
type intake struct {
	zctx               *zmq.Context
	sub                *zmq.Socket
	dec                kvevents.Decoder
	wake               time.Duration
	busyWake, idleWake time.Duration
}

// openIntake opens rank ep's SUB socket, in connect or bind mode.
func (ep *endpoint) openIntake() (*intake, error) {
	cfg := &ep.cfg
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("zmq context: %w", err)
	}
	sub, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		zctx.Term()
		return nil, fmt.Errorf("zmq socket: %w", err)
	}
	in := &intake{zctx: zctx, sub: sub}
	_ = sub.SetLinger(0)
	_ = sub.SetRcvhwm(0)
	// While blocks flow, wake often enough to take deltas on time; when a
	// delta interval passes with nothing to send, wake rarely (an idle
	// sidecar polling every few milliseconds burns CPU in every pod).
	in.busyWake = max(time.Millisecond, min(cfg.DeltaInterval/4, 5*time.Millisecond))
	// An engine restart seen by the scraper is acted on at the next wake:
	// keep that well under a scrape interval.
	in.idleWake = max(in.busyWake, min(cfg.IdleCheck/2, cfg.ScrapeInterval/4, 100*time.Millisecond))
	in.wake = in.busyWake
	_ = sub.SetRcvtimeo(in.wake)
	_ = sub.SetSubscribe(cfg.Topic)
	if cfg.Bind {
		err = sub.Bind(ep.events)
	} else {
		err = sub.Connect(ep.events)
	}
	if err != nil {
		in.close()
		return nil, fmt.Errorf("--kv-events %s (bind=%v): %w", ep.events, cfg.Bind, err)
	}
	if cfg.Bind {
		if last, err := sub.GetLastEndpoint(); err == nil {
			ep.mu.Lock() // the scraper reads it for its log lines
			ep.events = last
			ep.mu.Unlock()
		}
	}
	return in, nil
}

func (in *intake) setWake(d time.Duration) {
	if d != in.wake {
		in.wake = d
		_ = in.sub.SetRcvtimeo(d)
	}
}

func (in *intake) close() {
	in.sub.Close()
	in.zctx.Term()
}

// run is the intake loop: it tells the sequencer what it receives and
// carries out the sequencer's actions.
func (ep *endpoint) run(ctx context.Context, ready chan<- error) {
	in, err := ep.openIntake()
	if err != nil {
		ready <- err
		return
	}
	ep.mu.Lock()
	ep.intakeOpen = true
	ep.mu.Unlock()
	defer func() {
		ep.mu.Lock()
		ep.intakeOpen = false
		ep.mu.Unlock()
		in.close()
	}()
	ready <- nil
	ep.exec(in, ep.seq.Start(time.Now()), nil)
	nextDelta := time.Now().Add(ep.cfg.DeltaInterval)
	for ctx.Err() == nil {
		frames, err := in.sub.RecvMessageBytes(0)
		select {
		case start := <-ep.restartCh:
			if ep.exec(in, ep.seq.EngineStart(start), nil) && err == nil {
				continue // received before the restart was noticed: the old process's
			}
		default:
		}
		if err != nil {
			ep.exec(in, ep.seq.Idle(time.Now()), nil)
		}
		if now := time.Now(); now.After(nextDelta) {
			if !ep.takeDeltas() {
				in.setWake(in.idleWake)
			}
			nextDelta = now.Add(ep.cfg.DeltaInterval)
		}
		if err != nil {
			if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) && ctx.Err() == nil {
				ep.log.Warn("kv events receive", zap.Error(err))
				time.Sleep(10 * time.Millisecond)
			}
			continue
		}
		ep.seq.Heard(time.Now())
		in.setWake(in.busyWake)
		m, err := kvevents.ParseMessage(frames)
		if err != nil {
			ep.count(func(c *endpointCounters) { c.Malformed++ })
			ep.metrics.malformed.WithLabelValues(ep.label()).Inc()
			continue
		}
		ep.mu.Lock()
		ep.live = true
		ep.judge.LiveBatch(time.Now())
		ep.mu.Unlock()
		ep.exec(in, ep.seq.Live(m.Seq), m.Payload)
	}
}

func (ep *endpoint) label() string { return ep.identity.Endpoint }

func (ep *endpoint) count(f func(*endpointCounters)) {
	ep.mu.Lock()
	f(&ep.counters)
	ep.mu.Unlock()
}

// exec carries out the sequencer's actions in order. held is the batch in
// hand: the live one, or the replayed one (nil for none). It reports
// whether the sequencer said to drop the live batch in hand.
func (ep *endpoint) exec(in *intake, acts []sequence.Action, held []byte) (drop bool) {
	for _, a := range acts {
		switch a.Kind {
		case sequence.Apply:
			ep.apply(&in.dec, a.Seq, held)
		case sequence.Replay:
			in.setWake(in.busyWake)
			ep.count(func(c *endpointCounters) { c.Replays++ })
			err := ep.replayFrom(in, a.From)
			if ep.exec(in, ep.seq.ReplayEnd(time.Now(), err), held) {
				drop = true
			}
		case sequence.ReplayDone:
			if a.Outcome != sequence.OK {
				ep.count(func(c *endpointCounters) { c.ReplayFailures++ })
			}
			ep.metrics.replays.WithLabelValues(ep.label(), a.Outcome.String()).Inc()
		case sequence.Gap:
			ep.count(func(c *endpointCounters) { c.Gaps++ })
			ep.metrics.gaps.WithLabelValues(ep.label()).Inc()
		case sequence.Restart:
			in.setWake(in.busyWake)
			ep.restart(a)
		case sequence.MarkPartial:
			ep.markPartial(a.Reason)
		case sequence.DropHeld:
			drop = true
		}
	}
	return drop
}

// replayFrom asks the replay ROUTER for the batches from `from` and hands
// each to the sequencer, applying those it accepts, until the end marker.
func (ep *endpoint) replayFrom(in *intake, from uint64) error {
	d, err := in.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return err
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetRcvtimeo(ep.cfg.ReplayTimeout)
	if err := d.Connect(ep.replay); err != nil {
		return err
	}
	if _, err := d.SendMessage(kvevents.ReplayRequest(from)); err != nil {
		return err
	}
	deadline := time.Now().Add(ep.cfg.ReplayTimeout)
	for {
		if time.Now().After(deadline) {
			return errors.New("replay timed out")
		}
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			return err
		}
		f, err := kvevents.ParseReplayReply(frames)
		if err != nil {
			return err
		}
		if f.End {
			return nil
		}
		acts := ep.seq.Replayed(f.Seq)
		if slices.ContainsFunc(acts, func(a sequence.Action) bool { return a.Kind == sequence.Apply }) {
			ep.mu.Lock()
			ep.judge.ReplayedBatch(time.Now()) // new to the sidecar, and it came through replay
			ep.mu.Unlock()
		}
		ep.exec(in, acts, f.Payload)
	}
}

func (ep *endpoint) markPartial(why string) {
	ep.mu.Lock()
	ep.partial = true
	ep.judge.SetPartial(time.Now(), true, why)
	ep.mu.Unlock()
	ep.log.Warn("endpoint state is partial", zap.String("reason", why))
	ep.metrics.partial.WithLabelValues(ep.label()).Set(1)
}

// apply decodes and indexes one batch and shows its seq as the last.
func (ep *endpoint) apply(dec *kvevents.Decoder, seq uint64, payload []byte) {
	var b kvevents.Batch
	derr := dec.Decode(payload, &b)
	now := time.Now()
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.lastSeq, ep.haveSeq = seq, true
	ep.counters.Batches++
	if derr != nil {
		ep.counters.Malformed++
		ep.metrics.malformed.WithLabelValues(ep.label()).Inc()
		ep.remember(recentEvent{Seq: seq, Type: "malformed", Error: derr.Error()})
		ep.log.Warn("malformed kv event batch", zap.Uint64("seq", seq), zap.Error(derr))
		return
	}
	var tierBuf [tier.Count]tier.Tier
	touched, cleared := tierBuf[:0], false
	for i := range b.Events {
		ev := &b.Events[i]
		err := ep.idx.Apply(ev)
		if ev.Type == kvevents.TypeAllBlocksCleared {
			cleared = true
		} else if t, ok := tier.FromMedium(ev.Medium); ok && !slices.Contains(touched, t) {
			touched = append(touched, t)
		}
		ep.metrics.events.WithLabelValues(ep.label(), ev.Type.String()).Inc()
		if ev.Type == kvevents.TypeAllBlocksCleared {
			for _, a := range ep.seq.Cleared() {
				ep.epoch = a.Epoch
				ep.partial = false // the state is exact again
				ep.judge.SetPartial(now, false, "")
				ep.metrics.partial.WithLabelValues(ep.label()).Set(0)
				ep.newEpochLocked()
			}
		}
		r := recentEvent{Seq: seq, Type: ev.Type.String(), Blocks: len(ev.BlockHashes), HasParent: ev.HasParent}
		if t, ok := tier.FromMedium(ev.Medium); ok && ev.Type != kvevents.TypeAllBlocksCleared {
			r.Tier = t.String()
		}
		for j, h := range ev.BlockHashes {
			if j == 4 {
				break
			}
			r.Hashes = append(r.Hashes, h.Int)
		}
		if err != nil {
			r.Error = err.Error()
			if errors.Is(err, index.ErrUnresolvedParent) {
				ep.metrics.unresolved.WithLabelValues(ep.label()).Inc()
			} else {
				ep.metrics.invalid.WithLabelValues(ep.label()).Inc()
			}
		}
		ep.remember(r)
	}
	if b.TS > 0 {
		ep.metrics.lag.WithLabelValues(ep.label()).Observe(max(0, float64(now.UnixNano())/1e9-b.TS))
		if ep.oldestPending == 0 || b.TS < ep.oldestPending {
			ep.oldestPending = b.TS
		}
	}
	// Block gauges for the tiers this batch touched (all after a clear),
	// without listing and sorting every tier on each batch.
	if cleared {
		touched = ep.idx.Tiers()
	}
	for _, t := range touched {
		ep.metrics.blocks.WithLabelValues(ep.label(), t.String()).Set(float64(ep.idx.Blocks(t)))
	}
}

func (ep *endpoint) remember(r recentEvent) {
	if len(ep.recent) == recentCap {
		copy(ep.recent, ep.recent[1:])
		ep.recent = ep.recent[:recentCap-1]
	}
	ep.recent = append(ep.recent, r)
}

// restart clears the endpoint for a new engine process.
func (ep *endpoint) restart(a sequence.Action) {
	ep.mu.Lock()
	ep.idx.Clear()
	ep.epoch = a.Epoch
	ep.haveSeq, ep.partial = false, false
	ep.judge.SetPartial(time.Now(), false, "")
	ep.counters.Restarts++
	ep.newEpochLocked()
	ep.mu.Unlock()
	ep.metrics.restarts.WithLabelValues(ep.label()).Inc()
	ep.metrics.partial.WithLabelValues(ep.label()).Set(0)
	ep.log.Info("engine restarted: endpoint cleared", zap.String("reason", a.Reason), zap.Uint64("epoch", a.Epoch))
}

// takeDeltas batches each tier's bit flips into a numbered delta and hands
// it to the watchers; a tier they have not seen in this epoch gets a
// snapshot first. It reports whether it sent anything.
func (ep *endpoint) takeDeltas() (sent bool) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	id := ep.identity.Endpoint
	oldest := int64(ep.oldestPending * 1e9)
	ep.oldestPending = 0
	for _, t := range ep.idx.Tiers() {
		sum := ep.idx.Summary(t)
		if !ep.hub.hasFeed(id, t.String(), ep.epoch) {
			ep.hub.snapshot(snapshotUpdate(id, t, ep.epoch, sum.Snapshot()))
			sent = true
		}
		d, ok := sum.TakeDelta()
		if !ok {
			continue
		}
		sent = true
		ep.deltaSeq[t] = d.Seq
		data := summary.AppendDelta(nil, d)
		ep.hub.delta(&pb.SummaryUpdate{Endpoint: id, Tier: t.String(), Epoch: ep.epoch,
			Body: &pb.SummaryUpdate_Delta{Delta: &pb.Delta{Seq: d.Seq, Data: data, OldestEventUnixNanos: oldest}}})
		ep.metrics.deltas.WithLabelValues(ep.label(), t.String()).Inc()
		ep.metrics.deltaFlips.WithLabelValues(ep.label(), t.String()).Add(float64(len(d.Flips)))
		ep.metrics.deltaBytes.WithLabelValues(ep.label(), t.String()).Add(float64(len(data)))
	}
	return sent
}

// newEpochLocked announces a cleared endpoint: every tier's (now empty)
// summary goes out as a snapshot of the new epoch. Callers hold ep.mu.
func (ep *endpoint) newEpochLocked() {
	ep.metrics.epoch.WithLabelValues(ep.label()).Set(float64(ep.epoch))
	for _, t := range ep.idx.Tiers() {
		ep.deltaSeq[t] = 0
		ep.hub.snapshot(snapshotUpdate(ep.identity.Endpoint, t, ep.epoch, ep.idx.Summary(t).Snapshot()))
	}
}
