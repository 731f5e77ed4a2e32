package enginesim

// The engine's calls into the scheduler core's CPU tier and pulls, against
// the core's API (sched, kvcache, profile, transfer). Every other part of
// the connector's shell goes through these functions.

import (
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/test/enginesim/kvcache"
	"github.com/kvroute/kvroute/test/enginesim/profile"
	"github.com/kvroute/kvroute/test/enginesim/sched"
	"github.com/kvroute/kvroute/test/enginesim/transfer"
)

// setSource names the request's KV source for the core: the peer's side
// channel, host:port.
func setSource(spec *sched.Request, src kvSource) { spec.Source = src.peer }

// offloadCache sizes the core's CPU tier from the connector's settings:
// cpu_bytes_to_use in GPU blocks of the profile's KV bytes per token,
// stored in chunks of the offload block.
func offloadCache(c *kvcache.Config, cfg *Config) {
	k := cfg.KVTransfer
	if !k.Enabled() {
		return
	}
	c.OffloadBlocks = k.OffloadBlockTokens(cfg.BlockSize) / cfg.BlockSize
	c.CPUBlocks = cfg.Sim.Profile().CPUBlocks(k.Offload.CPUBytes, cfg.BlockSize)
	c.OffloadPromptOnly = k.Offload.PromptOnly
	c.SelfDescribing = k.Offload.SelfDescribing
}

// stepOffload is a step's connector figures.
func stepOffload(st sched.Step) offloadStep {
	return offloadStep{PromptTokens: st.PromptTokens, CPUHitTokens: st.CPUHitTokens, PulledTokens: st.PulledTokens,
		LoadedBytes: st.LoadedBytes, StoredBytes: st.StoredBytes, PulledBytes: st.PulledBytes,
		Pulls: st.Pulls, PullFailures: st.PullFailures - st.PullMisses}
}

// lookupsOf is the probes a step asks for.
func lookupsOf(st sched.Step) []lookup {
	out := make([]lookup, 0, len(st.Lookups))
	for _, l := range st.Lookups {
		out = append(out, lookup{id: l.ID, source: l.Source, hashes: l.Hashes, at: l.At})
	}
	return out
}

// serveLookup answers a peer from the CPU tier (scheduler goroutine).
func (e *Engine) serveLookup(h []blockkey.Digest) int { return e.core.ServeLookup(h) }

// resolvePull hands a pull's outcome to the core, at simulated time now:
// the pull started at the lookup's time, or now if the answer came later.
// A request that left meanwhile is no longer waiting (ErrNoLookup).
func (e *Engine) resolvePull(d pullDone, now time.Duration) {
	_ = e.core.Resolve(d.id, d.blocks, max(d.at, now)+d.wait, d.failed)
}

// resetConnector empties the CPU tier (scheduler goroutine).
func (e *Engine) resetConnector() { e.core.ResetConnectorCache() }

// h2dBandwidth is the profile's host-to-device bandwidth, bytes a second.
func h2dBandwidth(p profile.Profile) float64 { return p.H2DBytesPerSecond }

// parkKV waits, after a step that ran nothing, while requests wait for
// KV: until the earliest is ready (its simulated time, scaled to wall
// time; the clock then jumps to it), or a pull, a request, a control call
// or a cancellation arrives (a wall wait moves the clock on by the
// simulated time it stands for, not past the ready time). False when the
// engine closes. With nothing waiting it returns at once.
func (e *Engine) parkKV() bool {
	if e.core.Idle() {
		return true
	}
	next := e.core.NextReady()
	if next > 0 && next <= e.simNow {
		return true
	}
	var timer <-chan time.Time
	if next > 0 {
		t := time.NewTimer(time.Duration(float64(next-e.simNow) * e.cfg.Sim.TimeScale))
		defer t.Stop()
		timer = t.C
	}
	start := time.Now()
	select {
	case <-timer:
		e.advance(next)
		return true
	case r := <-e.submitCh:
		e.enqueue(r)
	case f := <-e.ctrl:
		f()
	case d := <-e.pulls:
		e.takePull(d)
	case <-e.wake:
	case <-e.quit:
		return false
	}
	if scale := e.cfg.Sim.TimeScale; scale > 0 && next > 0 {
		e.advance(min(next, e.simNow+time.Duration(float64(time.Since(start))/scale)))
	}
	return true
}

// advance moves the simulated clock to t (never back).
func (e *Engine) advance(t time.Duration) {
	if t > e.simNow {
		e.simSec += (t - e.simNow).Seconds()
		e.simNow = t
	}
}

// pullDuration is a pull's transfer time.
func pullDuration(p profile.Profile, tokens, srcActive, dstActive int, first bool) time.Duration {
	return transfer.Duration(p, tokens, srcActive, dstActive, first)
}
