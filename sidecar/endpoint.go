package sidecar

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
	pb "github.com/kvroute/kvroute/proto/kvroute/v1"
	"github.com/kvroute/kvroute/sidecar/index"
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

// endpoint is one rank: its intake goroutine owns the sockets; the state
// below mu is shared with the debug server and the scraper.
type endpoint struct {
	s         *Sidecar
	rank      int
	engineURL string
	events    string
	replay    string
	log       *zap.Logger
	restartCh chan float64 // new engine start time, from the scraper

	firstReplayed uint64 // intake goroutine only: first seq of the last replay

	oldestPending float64 // engine ts of the oldest batch applied since the last delta (under mu)

	mu       sync.Mutex
	idx      *index.Index
	epoch    uint64
	lastSeq  uint64
	haveSeq  bool
	partial  bool
	live     bool
	counters endpointCounters
	recent   []recentEvent
	deltaSeq [tier.Count]uint64
	identity Identity
	load     Load
	// liveSeq is the last seq received on the SUB (replays aside): only the
	// live stream going backwards means a new engine process.
	liveSeq  uint64
	haveLive bool
	// knownStart is the engine start time the current epoch belongs to;
	// 0 after a restart seen in the seq numbers: the next reading is adopted.
	knownStart float64
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

// run is the intake loop.
func (ep *endpoint) run(ctx context.Context, ready chan<- error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		ready <- fmt.Errorf("zmq context: %w", err)
		return
	}
	defer zctx.Term()
	sub, err := zctx.NewSocket(zmq.SUB)
	if err != nil {
		ready <- fmt.Errorf("zmq socket: %w", err)
		return
	}
	defer sub.Close()
	_ = sub.SetLinger(0)
	_ = sub.SetRcvhwm(0)
	// While blocks flow, wake often enough to take deltas on time; when a
	// delta interval passes with nothing to send, wake rarely (an idle
	// sidecar polling every few milliseconds burns CPU in every pod).
	busyWake := max(time.Millisecond, min(ep.s.cfg.DeltaInterval/4, 5*time.Millisecond))
	// An engine restart seen by the scraper is acted on at the next wake:
	// keep that well under a scrape interval.
	idleWake := max(busyWake, min(ep.s.cfg.IdleCheck/2, ep.s.cfg.ScrapeInterval/4, 100*time.Millisecond))
	wake := busyWake
	_ = sub.SetRcvtimeo(wake)
	setWake := func(d time.Duration) {
		if d != wake {
			wake = d
			_ = sub.SetRcvtimeo(d)
		}
	}
	_ = sub.SetSubscribe(ep.s.cfg.Topic)
	if ep.s.cfg.Bind {
		err = sub.Bind(ep.events)
	} else {
		err = sub.Connect(ep.events)
	}
	if err != nil {
		ready <- fmt.Errorf("--kv-events %s (bind=%v): %w", ep.events, ep.s.cfg.Bind, err)
		return
	}
	if ep.s.cfg.Bind {
		if last, err := sub.GetLastEndpoint(); err == nil {
			ep.events = last
		}
	}
	ready <- nil
	var dec kvevents.Decoder
	// A late start: what the engine published before we connected is only
	// in its replay ring.
	if ep.replay != "" {
		ep.fill(zctx, &dec, 0, ^uint64(0), true)
	}
	nextDelta := time.Now().Add(ep.s.cfg.DeltaInterval)
	lastHeard := time.Now()
	for ctx.Err() == nil {
		frames, err := sub.RecvMessageBytes(0)
		select {
		case start := <-ep.restartCh:
			if ep.engineStarted(start) {
				setWake(busyWake)
				if ep.replay != "" {
					ep.fill(zctx, &dec, 0, ^uint64(0), true)
				}
				if err == nil {
					continue // received before the restart was noticed: the old process's
				}
			}
		default:
		}
		// Live messages lost while the SUB (re)connects leave no gap to
		// notice until the next one; when quiet, ask the ring for the tail.
		if err != nil && ep.replay != "" && time.Since(lastHeard) > ep.s.cfg.IdleCheck {
			ep.mu.Lock()
			from := uint64(0)
			if ep.haveSeq {
				from = ep.lastSeq + 1
			}
			ep.mu.Unlock()
			setWake(busyWake)
			ep.fill(zctx, &dec, from, ^uint64(0), true)
			lastHeard = time.Now()
		}
		if now := time.Now(); now.After(nextDelta) {
			if !ep.takeDeltas() {
				setWake(idleWake)
			}
			nextDelta = now.Add(ep.s.cfg.DeltaInterval)
		}
		if err != nil {
			if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) && ctx.Err() == nil {
				ep.log.Warn("kv events receive", zap.Error(err))
				time.Sleep(10 * time.Millisecond)
			}
			continue
		}
		lastHeard = time.Now()
		setWake(busyWake)
		m, err := kvevents.ParseMessage(frames)
		if err != nil {
			ep.count(func(c *endpointCounters) { c.Malformed++ })
			ep.s.metrics.malformed.WithLabelValues(ep.label()).Inc()
			continue
		}
		ep.handle(zctx, &dec, m.Seq, m.Payload)
	}
}

func (ep *endpoint) label() string { return ep.identity.Endpoint }

func (ep *endpoint) count(f func(*endpointCounters)) {
	ep.mu.Lock()
	f(&ep.counters)
	ep.mu.Unlock()
}

// handle orders one live batch: duplicates are ignored, a backwards seq is
// an engine restart, a gap is filled from the replay ring.
func (ep *endpoint) handle(zctx *zmq.Context, dec *kvevents.Decoder, seq uint64, payload []byte) {
	ep.mu.Lock()
	have, last := ep.haveSeq, ep.lastSeq
	haveLive, lastLive := ep.haveLive, ep.liveSeq
	ep.haveLive, ep.liveSeq = true, seq
	ep.live = true
	ep.mu.Unlock()
	switch {
	case haveLive && seq <= lastLive:
		ep.restart("seq went backwards", true)
		have = false
	case have && seq <= last:
		return // already applied through a replay
	}
	switch {
	case have && seq > last+1:
		ep.count(func(c *endpointCounters) { c.Gaps++ })
		ep.s.metrics.gaps.WithLabelValues(ep.label()).Inc()
		ep.fill(zctx, dec, last+1, seq, false)
	case !have && seq > 0:
		// The start of this engine's stream is missing.
		ep.fill(zctx, dec, 0, seq, false)
	}
	ep.apply(dec, seq, payload)
}

// fill replays [from, to) and applies what comes back in order. A gap it
// cannot recover completely marks the endpoint partial. With catchUp (a
// late start, a restart, the idle tail check) it takes whatever the ring
// holds: an empty ring, or no replay socket at all, is no evidence of loss.
func (ep *endpoint) fill(zctx *zmq.Context, dec *kvevents.Decoder, from, to uint64, catchUp bool) {
	if ep.replay == "" {
		if !catchUp {
			ep.markPartial("replay disabled")
		}
		return
	}
	ep.count(func(c *endpointCounters) { c.Replays++ })
	got, err := ep.replayRange(zctx, dec, from, to)
	outcome := "ok"
	switch {
	case err != nil:
		outcome = "failed"
		if !catchUp {
			ep.markPartial("replay failed: " + err.Error())
		}
	case catchUp:
		if got > 0 && ep.firstReplayed > from {
			outcome = "incomplete"
			ep.markPartial("replay ring no longer holds the start of the stream")
		}
	case uint64(got) != to-from || ep.firstReplayed > from:
		outcome = "incomplete"
		ep.markPartial("replay ring no longer holds the missing batches")
	}
	if outcome != "ok" {
		ep.count(func(c *endpointCounters) { c.ReplayFailures++ })
	}
	ep.s.metrics.replays.WithLabelValues(ep.label(), outcome).Inc()
}

func (ep *endpoint) markPartial(why string) {
	ep.mu.Lock()
	was := ep.partial
	ep.partial = true
	ep.mu.Unlock()
	if !was {
		ep.log.Warn("endpoint state is partial", zap.String("reason", why))
	}
	ep.s.metrics.partial.WithLabelValues(ep.label()).Set(1)
}

// replayRange asks the ROUTER for batches from `from` and applies those
// below `to`. It returns how many it applied.
func (ep *endpoint) replayRange(zctx *zmq.Context, dec *kvevents.Decoder, from, to uint64) (int, error) {
	ep.firstReplayed = 0
	d, err := zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return 0, err
	}
	defer d.Close()
	_ = d.SetLinger(0)
	_ = d.SetRcvtimeo(ep.s.cfg.ReplayTimeout)
	if err := d.Connect(ep.replay); err != nil {
		return 0, err
	}
	if _, err := d.SendMessage(kvevents.ReplayRequest(from)); err != nil {
		return 0, err
	}
	applied := 0
	deadline := time.Now().Add(ep.s.cfg.ReplayTimeout)
	for first := true; ; first = false {
		if time.Now().After(deadline) {
			return applied, errors.New("replay timed out")
		}
		frames, err := d.RecvMessageBytes(0)
		if err != nil {
			return applied, err
		}
		f, err := kvevents.ParseReplayReply(frames)
		if err != nil {
			return applied, err
		}
		if f.End {
			return applied, nil
		}
		if first {
			ep.firstReplayed = f.Seq
		}
		if f.Seq < from || f.Seq >= to {
			continue
		}
		ep.apply(dec, f.Seq, f.Payload)
		applied++
	}
}

// apply decodes and indexes one batch and advances the seq.
func (ep *endpoint) apply(dec *kvevents.Decoder, seq uint64, payload []byte) {
	var b kvevents.Batch
	derr := dec.Decode(payload, &b)
	now := time.Now()
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.haveSeq && seq <= ep.lastSeq {
		return
	}
	ep.lastSeq, ep.haveSeq = seq, true
	ep.counters.Batches++
	if derr != nil {
		ep.counters.Malformed++
		ep.s.metrics.malformed.WithLabelValues(ep.label()).Inc()
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
		ep.s.metrics.events.WithLabelValues(ep.label(), ev.Type.String()).Inc()
		if ev.Type == kvevents.TypeAllBlocksCleared {
			ep.epoch++
			ep.partial = false // the state is exact again
			ep.s.metrics.partial.WithLabelValues(ep.label()).Set(0)
			ep.newEpochLocked()
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
				ep.s.metrics.unresolved.WithLabelValues(ep.label()).Inc()
			} else {
				ep.s.metrics.invalid.WithLabelValues(ep.label()).Inc()
			}
		}
		ep.remember(r)
	}
	if b.TS > 0 {
		ep.s.metrics.lag.WithLabelValues(ep.label()).Observe(max(0, float64(now.UnixNano())/1e9-b.TS))
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
		ep.s.metrics.blocks.WithLabelValues(ep.label(), t.String()).Set(float64(ep.idx.Blocks(t)))
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
func (ep *endpoint) restart(why string, bySeq bool) {
	ep.mu.Lock()
	ep.idx.Clear()
	ep.epoch++
	ep.haveSeq, ep.partial = false, false
	ep.counters.Restarts++
	if bySeq {
		ep.knownStart = 0 // the scraper's next reading is the new process's
	} else {
		ep.haveLive = false // the old process's live seq means nothing now
	}
	epoch := ep.epoch
	ep.newEpochLocked()
	ep.mu.Unlock()
	ep.s.metrics.restarts.WithLabelValues(ep.label()).Inc()
	ep.s.metrics.partial.WithLabelValues(ep.label()).Set(0)
	ep.log.Info("engine restarted: endpoint cleared", zap.String("reason", why), zap.Uint64("epoch", epoch))
}

// engineStarted handles a start time reported by the scraper, and reports
// whether it restarted the endpoint.
func (ep *endpoint) engineStarted(start float64) bool {
	ep.mu.Lock()
	known := ep.knownStart
	ep.knownStart = start
	ep.mu.Unlock()
	if known == 0 || known == start {
		return false // first reading (or first after a seq restart), or no change
	}
	ep.restart("engine start time changed", false)
	return true
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
		if !ep.s.hub.hasFeed(id, t.String(), ep.epoch) {
			ep.s.hub.snapshot(snapshotUpdate(id, t, ep.epoch, sum.Snapshot()))
			sent = true
		}
		d, ok := sum.TakeDelta()
		if !ok {
			continue
		}
		sent = true
		ep.deltaSeq[t] = d.Seq
		data := summary.AppendDelta(nil, d)
		ep.s.hub.delta(&pb.SummaryUpdate{Endpoint: id, Tier: t.String(), Epoch: ep.epoch,
			Body: &pb.SummaryUpdate_Delta{Delta: &pb.Delta{Seq: d.Seq, Data: data, OldestEventUnixNanos: oldest}}})
		ep.s.metrics.deltas.WithLabelValues(ep.label(), t.String()).Inc()
		ep.s.metrics.deltaFlips.WithLabelValues(ep.label(), t.String()).Add(float64(len(d.Flips)))
		ep.s.metrics.deltaBytes.WithLabelValues(ep.label(), t.String()).Add(float64(len(data)))
	}
	return sent
}

// newEpochLocked announces a cleared endpoint: every tier's (now empty)
// summary goes out as a snapshot of the new epoch. Callers hold ep.mu.
func (ep *endpoint) newEpochLocked() {
	ep.s.metrics.epoch.WithLabelValues(ep.label()).Set(float64(ep.epoch))
	for _, t := range ep.idx.Tiers() {
		ep.deltaSeq[t] = 0
		ep.s.hub.snapshot(snapshotUpdate(ep.identity.Endpoint, t, ep.epoch, ep.idx.Summary(t).Snapshot()))
	}
}
