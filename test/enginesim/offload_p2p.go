package enginesim

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/test/enginesim/p2p"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/sched"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
)

// lookup is one probe the core asks for: request id's prompt blocks (GPU
// blocks' digests, from an offload-chunk boundary, in prompt order) at the
// peer source names; the answer counts the leading ones pulled. at is the
// earliest simulated time the answer counts (the lookup's step's end):
// the pull starts then.
type lookup struct {
	id     sched.ID
	source string
	hashes []blockkey.Digest
	at     time.Duration
}

// pullDone is a pull's outcome, for the scheduler goroutine to resolve:
// the leading blocks fetched (GPU blocks) and the transfer time from the
// pull's start, the lookup's at or the resolve's time if later (0 blocks:
// nothing to load; failed: recompute, with reason).
type pullDone struct {
	id     sched.ID
	blocks int
	at     time.Duration
	wait   time.Duration
	failed bool
	reason string
	// probed and found are the blocks looked up and found at the peer.
	probed, found int
}

// openNode starts the rank's P2P side channel when the P2P tier is on: it
// listens on the tier's base port + the rank and answers peers from the
// CPU tier, through the scheduler goroutine.
func (e *Engine) openNode() error {
	if !e.cfg.KVTransfer.P2PEnabled() {
		return nil
	}
	c := p2p.DefaultConfig()
	c.Host = e.cfg.p2pHost()
	c.Port = e.cfg.p2pBasePort()
	if c.Port != 0 {
		c.Port += e.rank
	}
	c.Fingerprint = e.cfg.p2pFingerprint()
	c.HandshakeTimeout = e.cfg.P2PHandshakeTimeout
	c.Labels = prometheus.Labels{"model_name": e.cfg.servedNames()[0], "engine": strconv.Itoa(e.rank)}
	n, err := p2p.New(c, e.lookupForPeer, e.log.Named("p2p"), e.reg)
	if err != nil {
		return err
	}
	e.node = n
	e.log.Info("P2P side channel listening", zap.String("id", n.ID()))
	return nil
}

// P2PID returns the rank's P2P side-channel identity (host:port, as peers
// name it in remote_kv_source); "" without the P2P tier.
func (e *Engine) P2PID() string {
	if e.node == nil {
		return ""
	}
	return e.node.ID()
}

// lookupForPeer answers a peer's lookup or fetch: the leading hashes the
// CPU tier holds, asked of the core on the scheduler goroutine (the core
// is not safe for concurrent use).
func (e *Engine) lookupForPeer(ctx context.Context, hashes []blockkey.Digest) (int, error) {
	var hits int
	err := e.doCtx(ctx, func() { hits = e.serveLookup(hashes) })
	return hits, err
}

// doCtx is do that gives up when ctx ends before f was taken.
func (e *Engine) doCtx(ctx context.Context, f func()) error {
	ran := make(chan struct{})
	select {
	case e.ctrl <- func() { f(); close(ran) }:
	case <-e.quit:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ran:
		return nil
	case <-e.done:
		return ErrClosed
	}
}

// maxPulls bounds the pulls a rank runs at once; more wait their turn.
const maxPulls = 256

// startPulls runs a step's lookups at their peers, each in its own
// goroutine; their outcomes come back on e.pulls for takePull. It runs on
// the scheduler goroutine (it reads the requests' kv_request_ids).
func (e *Engine) startPulls(lks []lookup) {
	for _, lk := range lks {
		r, ok := e.live[lk.id]
		if !ok || e.node == nil { // nobody to ask: it recomputes
			e.resolvePull(pullDone{id: lk.id, at: lk.at, failed: true, reason: "other"}, e.simNow)
			continue
		}
		e.pullWG.Add(1)
		go func(kvRequestID string) {
			defer e.pullWG.Done()
			var d pullDone
			select {
			case e.pullSem <- struct{}{}:
				d = e.pull(e.pullCtx, lk, kvRequestID)
				<-e.pullSem
			case <-e.pullCtx.Done():
				return
			}
			select {
			case e.pulls <- d:
			case <-e.pullCtx.Done():
			}
		}(r.source.kvRequestID)
	}
}

// takePull hands a pull's outcome to the core, on the scheduler
// goroutine, and counts it.
func (e *Engine) takePull(d pullDone) {
	if m := e.metrics.offload; m != nil {
		m.observePull(d)
	}
	e.resolvePull(d, e.simNow)
}

// pull runs one lookup at its peer, off the scheduler goroutine: the
// probe, the fetch of the hits, and the transfer time from the profile
// with both ends' pulls under way (the source's as it reported them).
// The peer is told the time in wall time (scaled), to count the pull. A
// pull whose transfer would outlast transfer.PullTimeout (vLLM's
// _LOAD_TIMEOUT_S) fails as a timeout at its start + PullTimeout, with
// nothing loaded, and the request recomputes, as the lab's fleet does.
func (e *Engine) pull(ctx context.Context, lk lookup, kvRequestID string) pullDone {
	p := e.cfg.Sim.Profile()
	perBlock := e.cfg.BlockSize // a lookup's hashes are GPU blocks'
	scale := e.cfg.Sim.TimeScale
	hold := func(hits, srcActive, dstActive int, first bool) time.Duration {
		w, _ := pullWait(p, hits*perBlock, srcActive, dstActive, first)
		return time.Duration(float64(w) * scale)
	}
	res, err := e.node.Pull(ctx, lk.source, kvRequestID, lk.hashes, hold)
	d := pullDone{id: lk.id, at: lk.at, probed: len(lk.hashes), found: res.Hits}
	if err != nil {
		d.failed, d.reason = true, p2p.Reason(err)
		e.log.Debug("P2P pull failed; the request recomputes", zap.Uint64("request", uint64(lk.id)),
			zap.String("source", lk.source), zap.Error(err))
		return d
	}
	w, timedOut := pullWait(p, res.Blocks*perBlock, res.SrcActive, res.DstActive, res.First)
	if timedOut {
		d.failed, d.reason, d.wait = true, "timeout", transfer.PullTimeout
		e.log.Debug("P2P pull would outlast the pull timeout; the request recomputes", zap.Uint64("request", uint64(lk.id)),
			zap.String("source", lk.source), zap.Int("blocks", res.Blocks), zap.Duration("timeout", transfer.PullTimeout))
		return d
	}
	d.blocks, d.wait = res.Blocks, w
	return d
}

// pullWait is a pull's transfer time, in simulated time, and whether it
// outlasts transfer.PullTimeout; then the time is PullTimeout, when the
// consumer gives up. The pulls under way are taken in [0, p2p.MaxActive]
// whatever a peer reported, and the time is never negative: one that
// overflows is past the timeout.
func pullWait(p profile.Profile, tokens, srcActive, dstActive int, first bool) (time.Duration, bool) {
	clamp := func(n int) int { return min(max(n, 0), p2p.MaxActive) }
	w := pullDuration(p, tokens, clamp(srcActive), clamp(dstActive), first)
	if w < 0 || w > transfer.PullTimeout {
		return transfer.PullTimeout, true
	}
	return w, false
}
