package sched

import (
	"errors"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/test/enginesim/kvcache"
)

// kvState is where a waiting request stands with its KV (vLLM's
// WAITING_FOR_REMOTE_KVS, split by what it waits for).
type kvState uint8

const (
	kvNone   kvState = iota // admissible
	kvLookup                // a lookup was sent to its Source; no answer yet
	kvPull                  // answered: the pull arrives (or fails) at readyAt
	kvLoad                  // its CPU-tier blocks load to the GPU until readyAt
)

// kvWait is a request's KV wait.
type kvWait struct {
	state   kvState
	source  string        // Request.Source
	probed  bool          // its Source was asked (or there was nothing to ask)
	at      time.Duration // kvLookup: the earliest time its answer counts
	from    int           // the first block asked for
	asked   int           // the blocks asked for
	blocks  int           // the blocks the pull brings (0: none)
	failed  bool          // the pull failed
	readyAt time.Duration // kvPull, kvLoad: when the wait ends
	paid    int           // CPU-tier blocks whose load was waited for
	pulled  int           // blocks the pull put in the CPU tier, from from
}

// Lookup is a request's question to its Source: which of these blocks
// (GPU-block digests, from block FromBlock of its prompt, starting at an
// offload-chunk boundary) does the peer's CPU tier still hold. The shell
// asks the peer (Scheduler.ServeLookup on a simulated one), starts the
// pull of the leading blocks held at At (in tokens: blocks × the block
// size; package transfer prices it) and answers with Resolve.
type Lookup struct {
	ID        ID
	Source    string
	FromBlock int
	Hashes    []blockkey.Digest
	// At is the earliest time the answer can be used: a lookup costs one
	// scheduler step (kv-transfer.md §2.3: sent at the step's end). It is
	// the step's end, or, for a step that computed nothing, the step's
	// start plus the profile's StepBase.
	At time.Duration
}

// Errors of Resolve.
var ErrNoLookup = errors.New("sched: no lookup of this request awaits an answer")

// setKV moves r to state st, keeping waitingKV.
func (s *Scheduler) setKV(r *request, st kvState) {
	if (r.kv.state == kvNone) != (st == kvNone) {
		if st == kvNone {
			s.waitingKV--
		} else {
			s.waitingKV++
		}
	}
	r.kv.state = st
}

// bytes is the KV size of n blocks.
func (s *Scheduler) bytes(blocks int) int64 {
	return int64(float64(blocks*s.cfg.Cache.BlockSize) * s.cfg.Latency.KVBytesPerToken)
}

// kvReady decides, at r's turn in the admission pass of the step starting
// at now, whether r is admitted now: with the GPU hit and the CPU-tier
// blocks to load, or not, when it waits for KV. A request with a Source
// not asked yet sends its lookup first (for the blocks beyond its local
// GPU and CPU hits, within the len−1 cap; none if there are none). CPU
// blocks not yet waited for start their load (H2D at the profile's
// bandwidth, overlapping other requests' compute), and r waits for it.
func (s *Scheduler) kvReady(out *Step, r *request, now time.Duration) (gpu, load int, ok bool) {
	w := &r.kv
	if w.state == kvLookup || (w.state == kvPull || w.state == kvLoad) && w.readyAt > now {
		return 0, 0, false
	}
	if s.cfg.Cache.CPUBlocks == 0 && w.source == "" {
		return 0, 0, true // nothing to load or ask: Admit's own lookup does
	}
	gpu, cpu := s.cache.Probe(r.seq)
	if w.source != "" && !w.probed {
		w.probed = true
		if from, to := s.cache.LookupRange(r.seq, gpu+cpu); from < to {
			w.from, w.asked, w.blocks, w.failed, w.pulled = from, to-from, 0, false, 0
			s.setKV(r, kvLookup)
			out.Lookups = append(out.Lookups, Lookup{ID: r.id, Source: w.source, FromBlock: from, Hashes: s.cache.Hashes(r.seq, from, to)})
			return 0, 0, false
		}
	}
	if cpu > w.paid {
		w.readyAt = now + s.cfg.Latency.LoadBack((cpu-w.paid)*s.cfg.Cache.BlockSize)
		w.paid = cpu
		s.setKV(r, kvLoad)
		return 0, 0, false
	}
	s.setKV(r, kvNone)
	return gpu, cpu, true
}

// loaded counts r's admission (probed with a GPU hit of gpu blocks and
// load CPU-tier blocks to load): the bytes it loaded from the tier, and at
// its first admission the prompt figures and its cached tokens' split.
func (s *Scheduler) loaded(out *Step, r *request, gpu, load int, now time.Duration) {
	bs := s.cfg.Cache.BlockSize
	blocks := 0
	if load > 0 {
		blocks = r.seq.Computed()/bs - gpu
	}
	out.LoadedBytes += s.bytes(blocks)
	r.kv.paid = 0
	if r.counted {
		return
	}
	r.counted, r.scheduled = true, now
	pulled := max(0, min(gpu+blocks, r.kv.from+r.kv.pulled)-max(gpu, r.kv.from)) * bs
	r.gpuHit, r.pulledHit = r.seq.GPUHitTokens(), pulled
	r.cpuHit = r.seq.LoadedTokens() - pulled
	out.PromptTokens += r.promptLen
	out.CachedTokens += r.gpuHit
	out.CPUHitTokens += r.cpuHit
	out.PulledTokens += r.pulledHit
}

// arrive lands the pulls due by now: their blocks go into the CPU tier
// (from where they load like the tier's own), a failed or empty one is
// counted; either way the request is admissible again. An engine without
// a tier cannot keep pulled blocks (vLLM's P2P tier sits behind its CPU
// tier): the pull is a miss, and the request recomputes.
func (s *Scheduler) arrive(out *Step, now time.Duration) {
	for _, r := range s.waiting {
		w := &r.kv
		if w.state != kvPull || w.readyAt > now {
			continue
		}
		s.setKV(r, kvNone)
		switch {
		case w.failed:
			out.PullFailures++
		case w.blocks == 0:
			out.PullFailures++
			out.PullMisses++
		default:
			// What the tier kept is what was pulled: nothing kept (the
			// batch fits no chunk of the tier) is a miss, recomputed.
			if w.pulled = s.cache.Insert(r.seq, w.from, w.blocks); w.pulled == 0 {
				out.PullFailures++
				out.PullMisses++
				continue
			}
			out.Pulls++
			out.PulledBytes += s.bytes(w.pulled)
		}
	}
}

// lookupsAnswerable stamps the step's lookups with the earliest time
// their answers count: the step's end, or a StepBase after its start if
// it computed nothing.
func (s *Scheduler) lookupsAnswerable(out *Step, now time.Duration) {
	at := now + out.Duration
	if out.Duration == 0 {
		at = now + s.cfg.Latency.StepBase
	}
	for i := range out.Lookups {
		out.Lookups[i].At = at
		s.byID[out.Lookups[i].ID].kv.at = at
	}
}

// Resolve answers request id's lookup: the first blocks of the blocks it
// asked for arrive in its CPU tier at ready (not before the lookup's At),
// or, failed (refused, unreachable, timed out: the shell applies
// transfer.PullTimeout), nothing arrives and it recomputes from ready on.
// blocks is clamped to what was asked; 0 is a miss. ErrNoLookup when the
// request awaits no answer (it left, or was never asked).
func (s *Scheduler) Resolve(id ID, blocks int, ready time.Duration, failed bool) error {
	r, ok := s.byID[id]
	if !ok || r.kv.state != kvLookup {
		return ErrNoLookup
	}
	w := &r.kv
	w.blocks, w.failed, w.readyAt = min(max(blocks, 0), w.asked), failed, max(ready, w.at)
	if failed {
		w.blocks = 0
	}
	s.setKV(r, kvPull)
	return nil
}

// ServeLookup is the source side of a lookup: how many leading blocks of
// hashes this engine's CPU tier holds (whole offload chunks). The GPU is
// never consulted, and serving costs this engine no step time.
func (s *Scheduler) ServeLookup(hashes []blockkey.Digest) int { return s.cache.CPURun(hashes) }

// NextReady is the earliest time a request waiting for KV (a pull's
// arrival or a load's end) is ready, 0 if none. It may be at or before
// the current time: such a request is admissible at the next step (it
// was not reached, or its blocks were short).
func (s *Scheduler) NextReady() time.Duration {
	var next time.Duration
	if s.waitingKV == 0 {
		return 0
	}
	for _, r := range s.waiting {
		if st := r.kv.state; (st == kvPull || st == kvLoad) && (next == 0 || r.kv.readyAt < next) {
			next = r.kv.readyAt
		}
	}
	return next
}

// ResetConnectorCache empties the CPU tier without events, as vLLM's
// reset_prefix_cache with reset_connector (reset_external=true) does;
// requests waiting for their loads recompute what is gone.
func (s *Scheduler) ResetConnectorCache() { s.cache.ResetCPU() }

// CPUStats returns the CPU tier's figures (package kvcache).
func (s *Scheduler) CPUStats() kvcache.CPUStats { return s.cache.CPU() }
