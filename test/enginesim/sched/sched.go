package sched

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim/kvcache"
	"github.com/kvroute/kvroute/test/enginesim/profile"
)

// Config sizes the engine and its latency model; fields are named after
// vLLM's flags where vLLM has one.
type Config struct {
	// Cache is the paged KV cache: num_gpu_blocks, block size, hash seed,
	// event hashes, whether KV events are made at all, and the CPU
	// offload tier (CPUBlocks 0: none; its loads and pulls are priced by
	// Latency's KV constants).
	Cache kvcache.Config
	// MaxModelLen is --max-model-len: a request stops ("length") when its
	// prompt and output reach it.
	MaxModelLen int
	// MaxNumSeqs is --max-num-seqs: the most requests running at once.
	MaxNumSeqs int
	// MaxNumBatchedTokens is --max-num-batched-tokens: one step's token
	// budget (a decode takes one, a prefill chunk the rest).
	MaxNumBatchedTokens int
	// Latency is the latency model (package profile): a step's base, its
	// prefill chunks' and its decodes' costs. Only its costs are read
	// here; the sizes are the fields above (a shell takes its defaults
	// from the profile).
	Latency profile.Profile
	// Policy is --scheduling-policy: PolicyFCFS (vLLM's default; "" is
	// the same) or PolicyPriority, which orders the waiting queue by
	// Request.Priority (lower first, then arrival) and preempts the
	// lowest-priority running request (highest value, latest arrival)
	// when blocks run out.
	Policy string
}

// Scheduling policies, as vLLM's --scheduling-policy names them.
const (
	PolicyFCFS     = "fcfs"
	PolicyPriority = "priority"
)

// DefaultConfig returns the simulated engine's defaults: the sim-default
// profile (one H100 serving an 8B–20B model with vLLM's own defaults, as
// the engine has always modelled it), without KV events and without a CPU
// tier (offloading prompts only, vLLM's default, once one is sized).
func DefaultConfig() Config {
	p := profile.Default()
	return Config{
		Cache:               kvcache.Config{NumBlocks: p.NumGPUBlocks, BlockSize: p.BlockSize, Seed: blockkey.DefaultSeed, OffloadPromptOnly: true},
		MaxModelLen:         p.MaxModelLen,
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: p.MaxNumBatchedTokens,
		Latency:             p,
	}
}

// Validate checks c.
func (c Config) Validate() error {
	var errs []error
	if err := c.Cache.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.MaxModelLen <= 0 || c.MaxNumSeqs <= 0 || c.MaxNumBatchedTokens <= 0 {
		errs = append(errs, fmt.Errorf("sched: max_model_len %d, max_num_seqs %d, max_num_batched_tokens %d: want all positive",
			c.MaxModelLen, c.MaxNumSeqs, c.MaxNumBatchedTokens))
	}
	if err := c.Latency.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("sched: latency: %w", err))
	}
	switch c.Policy {
	case "", PolicyFCFS, PolicyPriority:
	default:
		errs = append(errs, fmt.Errorf("sched: scheduling policy %q: want %q or %q", c.Policy, PolicyFCFS, PolicyPriority))
	}
	return errors.Join(errs...)
}

// ID names a request; the caller chooses it, unique among the requests in
// the engine.
type ID uint64

// Request is a prompt to run.
type Request struct {
	ID     ID
	Prompt []uint32
	LoRA   string // adapter name, "" for none
	LoraID int    // adapter id for events' lora_id; 0 for none
	Salt   string // cache_salt, "" for none
	// MaxTokens is the output budget (at least 1).
	MaxTokens int
	// IgnoreEOS generates MaxTokens tokens, past the natural length.
	IgnoreEOS bool
	// Source names a peer to pull the prompt's KV from (vLLM's
	// kv_transfer_params.remote_kv_source), opaque here: the shell maps
	// it to an engine. "" is none, and then the engine never pulls on its
	// own (kv-transfer.md §2.2).
	Source string
	// Priority is the body's priority (vLLM's, default 0): under
	// PolicyPriority a lower value runs first, ties by arrival. Ignored
	// under PolicyFCFS (vLLM's front end refuses a non-zero priority
	// there before the scheduler sees it).
	Priority int
}

// Finish reasons, as vLLM's finish_reason.
const (
	FinishStop   = "stop"
	FinishLength = "length"
)

// Update is one request's output in a step: a token, and with the first
// one the prompt's cached tokens and the time to first token; Finish is
// set ("stop" or "length") on the last, with the request's queued and
// prefill intervals (vLLM reports them when a request finishes).
type Update struct {
	ID     ID
	Token  uint32
	First  bool
	TTFT   time.Duration // with First: step end − arrival
	Finish string        // "" while the request runs on
	// CachedTokens, with First, is vLLM's num_cached_tokens: the prompt
	// tokens not computed at the first admission, the GPU prefix hit and
	// the tokens loaded from the CPU tier, pulled ones included (vLLM
	// counts the connector's tokens in it). GPUHitTokens, CPUHitTokens and
	// PulledTokens split it (the CPU tier's own blocks, and those a pull
	// brought); the prompt's other tokens were recomputed.
	CachedTokens                             int
	GPUHitTokens, CPUHitTokens, PulledTokens int
	// Queued and Prefill, with Finish, are vLLM's queued interval (arrival
	// to first scheduled: the start of the step that first admitted it)
	// and prefill interval (first scheduled to first token, preemptions
	// included): Queued + Prefill is the TTFT.
	Queued, Prefill time.Duration
}

// Load is what vLLM's /metrics reports of the engine's load:
// vllm:num_requests_waiting, vllm:num_requests_running and
// vllm:kv_cache_usage_perc (0 to 1).
type Load struct {
	Waiting, Running int
	KVUsage          float64
}

// Step is one step's outcome.
type Step struct {
	// Duration is the step's simulated duration: it ends at now+Duration.
	// 0 when the step scheduled nothing (it may still carry lookups, pull
	// figures and events: pulled blocks stored in the CPU tier).
	Duration time.Duration
	// Scheduled counts the requests the step computed for.
	Scheduled int
	// Updates are the tokens sampled, in batch order.
	Updates []Update
	// Events are the KV events the step made, in order.
	Events []kvevents.Event
	// Load is after the step.
	Load Load
	// Dropped are the cancelled requests that left the engine.
	Dropped []ID
	// Preemptions counts the requests preempted (vllm:num_preemptions).
	Preemptions int
	// PromptTokens and CachedTokens sum the prompts admitted for the first
	// time and their GPU prefix-cache hits (vllm:prefix_cache_queries,
	// vllm:prefix_cache_hits, vllm:prompt_tokens). CPUHitTokens and
	// PulledTokens sum what those admissions loaded from the CPU tier, of
	// its own blocks and of pulled ones: their sum is the connector's
	// hits, vllm:external_prefix_cache_hits (vLLM counts the offloading
	// connector's CPU hits there as well as pulls). The cached part of
	// the prompts is the three together; the rest was recomputed.
	PromptTokens, CachedTokens int
	CPUHitTokens, PulledTokens int

	// Lookups are the peer lookups the step made (requests with a Source
	// reaching admission); the shell answers each with Resolve.
	Lookups []Lookup
	// Pulls counts the pulls whose blocks arrived in this step (into the
	// CPU tier); PullFailures those that brought nothing: failed
	// (refused, unreachable, timed out) or answered with no block, the
	// latter counted again in PullMisses (the source no longer held
	// them). Each such request recomputes what it lacks.
	Pulls, PullFailures, PullMisses int
	// LoadedBytes and StoredBytes are the bytes copied from the CPU tier
	// to the GPU (H2D) and from the GPU to the tier (D2H) in this step:
	// vllm:kv_offload_load_bytes_total and _store_bytes_total.
	// PulledBytes are the bytes the arrived pulls brought.
	LoadedBytes, StoredBytes, PulledBytes int64
	// NextReady is the earliest time a request waiting for KV (a pull's
	// arrival or a load's end) is ready, 0 if none: a shell with nothing
	// else to run steps again then. Lookups still unanswered are not in
	// it; after Resolve, Scheduler.NextReady has them.
	NextReady time.Duration
}

// request is one prompt in the engine.
type request struct {
	id        ID
	seq       *kvcache.Seq
	promptLen int
	target    int // output tokens to generate
	stopAt    int // the natural length (0 with ignore_eos): finish "stop" there
	gen       generator
	cancelled bool
	arrival   time.Duration
	priority  int           // Request.Priority
	order     uint64        // Add's order: the tie after (priority, arrival)
	scheduled time.Duration // the start of the step that first admitted it
	ttft      time.Duration // with outputs > 0: first token − arrival
	outputs   int
	prefilled bool
	counted   bool // counted in the prompt figures; scheduled is set
	kv        kvWait
	// the first admission's split of the cached tokens
	gpuHit, cpuHit, pulledHit int
}

// Scheduler is the engine core. It is not safe for concurrent use.
type Scheduler struct {
	cfg     Config
	cache   *kvcache.Cache
	waiting []*request
	running []*request
	byID    map[ID]*request
	chunks  []profile.Chunk // a step's prefills, reused
	// waitingKV counts the waiting requests in a KV wait (kv.state ≠
	// kvNone): the passes over them are skipped when there are none.
	waitingKV int
	// byPriority is Policy == PolicyPriority: the waiting queue is kept
	// sorted by (priority, arrival, order).
	byPriority bool
	added      uint64 // requests added so far: the next one's order
}

// New returns an idle scheduler with an empty cache.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cache, err := kvcache.New(cfg.Cache)
	if err != nil {
		return nil, err
	}
	return &Scheduler{cfg: cfg, cache: cache, byID: map[ID]*request{}, byPriority: cfg.Policy == PolicyPriority}, nil
}

// Errors of Add.
var (
	ErrDuplicateID = errors.New("sched: a request with this id is in the engine")
	ErrBadRequest  = errors.New("sched: a request needs a prompt and max_tokens of at least 1")
)

// Add queues r, arrived at simulated time now. The prompt is copied.
func (s *Scheduler) Add(r Request, now time.Duration) error {
	if len(r.Prompt) == 0 || r.MaxTokens < 1 {
		return ErrBadRequest
	}
	if _, ok := s.byID[r.ID]; ok {
		return ErrDuplicateID
	}
	q := &request{
		id:        r.ID,
		seq:       &kvcache.Seq{Tokens: append([]uint32(nil), r.Prompt...), LoRA: r.LoRA, LoraID: r.LoraID, Salt: r.Salt, PromptLen: len(r.Prompt)},
		promptLen: len(r.Prompt),
		gen:       newGenerator(r.Prompt, r.Salt),
		target:    r.MaxTokens,
		arrival:   now,
		priority:  r.Priority,
		order:     s.added,
		kv:        kvWait{source: r.Source},
	}
	s.added++
	if !r.IgnoreEOS {
		q.stopAt = q.gen.naturalLength()
		q.target = min(q.target, q.stopAt)
	}
	s.byID[r.ID] = q
	s.enqueue(q, false)
	return nil
}

// before orders the waiting queue under PolicyPriority, as vLLM's
// Request.__lt__: lower priority value first, then earlier arrival, then
// (standing in for vLLM's request id) the order of Add.
func before(a, b *request) bool {
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	if a.arrival != b.arrival {
		return a.arrival < b.arrival
	}
	return a.order < b.order
}

// enqueue puts r in the waiting queue: under PolicyFCFS at the back, or
// at the front when it was preempted (vLLM's prepend_request); under
// PolicyPriority at its place in the order, preempted or not (vLLM's
// priority queue has no front).
func (s *Scheduler) enqueue(r *request, preempted bool) {
	if !s.byPriority {
		if preempted {
			s.waiting = append([]*request{r}, s.waiting...)
		} else {
			s.waiting = append(s.waiting, r)
		}
		return
	}
	i := sort.Search(len(s.waiting), func(i int) bool { return before(r, s.waiting[i]) })
	s.waiting = slices.Insert(s.waiting, i, r)
}

// victim is the running request preempted when blocks run out: under
// PolicyFCFS the newest (the back of the running queue); under
// PolicyPriority the lowest-priority one, the greatest (priority,
// arrival), the first such in running order (vLLM's max over running).
func (s *Scheduler) victim() int {
	v := len(s.running) - 1
	if !s.byPriority {
		return v
	}
	v = 0
	for i, r := range s.running[1:] {
		w := s.running[v]
		if r.priority > w.priority || r.priority == w.priority && r.arrival > w.arrival {
			v = i + 1
		}
	}
	return v
}

// Cancel marks request id for abort; it leaves at the next step that
// reaches it. It reports whether the request is in the engine.
func (s *Scheduler) Cancel(id ID) bool {
	r, ok := s.byID[id]
	if ok {
		r.cancelled = true
	}
	return ok
}

// SetLatency replaces the latency model from the next step on: the
// engine's hardware changed under the same address (a node replaced by a
// faster or slower one), its cache and requests kept. An invalid profile
// is refused and the model kept.
func (s *Scheduler) SetLatency(p profile.Profile) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("sched: latency: %w", err)
	}
	s.cfg.Latency = p
	return nil
}

// Idle reports whether no request waits or runs.
func (s *Scheduler) Idle() bool { return len(s.waiting) == 0 && len(s.running) == 0 }

// Load returns the current load figures.
func (s *Scheduler) Load() Load {
	return Load{Waiting: len(s.waiting), Running: len(s.running), KVUsage: s.cache.Usage()}
}

// NumCachedBlocks returns the blocks holding cached (hashed) content.
func (s *Scheduler) NumCachedBlocks() int { return s.cache.NumCached() }

// NumFreeBlocks returns the blocks no request holds (cached or not).
func (s *Scheduler) NumFreeBlocks() int { return s.cache.NumFree() }

// Reset is what ResetPrefixCache did: the requests it preempted and the
// events (AllBlocksCleared).
type Reset struct {
	Preemptions int
	Events      []kvevents.Event
}

// ResetPrefixCache drops every cached block (AllBlocksCleared). Like vLLM
// it fails while requests hold blocks, unless resetRunning, which first
// preempts every running request (they recompute when readmitted).
func (s *Scheduler) ResetPrefixCache(resetRunning bool) (Reset, error) {
	var out Reset
	if resetRunning {
		for i := len(s.running) - 1; i >= 0; i-- {
			s.preempt(s.running[i])
			out.Preemptions++
		}
		s.running = nil
	}
	if err := s.cache.Reset(); err != nil {
		return out, err
	}
	out.Events = s.cache.TakeEvents()
	return out, nil
}

// Restart is a process restart: every request leaves (returned, running
// first, then waiting, in queue order) and the cache empties without
// events.
func (s *Scheduler) Restart() []ID {
	var ids []ID
	for _, r := range append(s.running, s.waiting...) {
		ids = append(ids, r.id)
	}
	s.running, s.waiting, s.waitingKV = nil, nil, 0
	clear(s.byID)
	s.cache.Wipe()
	return ids
}

// work is one request's share of a step.
type work struct {
	r      *request
	n      int
	decode bool
}

// Step runs one engine step starting at simulated time now: it schedules,
// computes the step's duration and applies it (KV computed, tokens
// sampled, finished requests freed).
func (s *Scheduler) Step(now time.Duration) Step {
	var out Step
	stored := s.cache.CPU().Stored
	if s.waitingKV > 0 {
		s.arrive(&out, now)
	}
	budget := s.cfg.MaxNumBatchedTokens
	batch, budget, preempted := s.scheduleRunning(&out, budget)
	if !preempted {
		batch = s.admitWaiting(&out, batch, budget, now)
	}
	out.Scheduled = len(batch)
	if len(batch) > 0 {
		out.Duration = s.duration(batch)
		s.apply(&out, batch, now+out.Duration)
	}
	s.lookupsAnswerable(&out, now)
	out.Events = s.cache.TakeEvents()
	out.StoredBytes = s.bytes(s.cache.CPU().Stored - stored)
	out.NextReady = s.NextReady()
	out.Load = s.Load()
	return out
}

// scheduleRunning schedules the running requests first: decodes take one
// token, chunked prefills continue. When blocks run out it preempts from
// the back (vLLM's policy).
func (s *Scheduler) scheduleRunning(out *Step, budget int) ([]work, int, bool) {
	var batch []work
	preempted := false
	for i := 0; i < len(s.running) && budget > 0; i++ {
		r := s.running[i]
		if r.cancelled {
			s.cache.Free(r.seq)
			s.forget(out, r)
			s.running = append(s.running[:i], s.running[i+1:]...)
			i--
			continue
		}
		n := 1
		if !r.prefilled {
			n = min(len(r.seq.Tokens)-r.seq.Computed(), budget)
		}
		for {
			if err := s.cache.Schedule(r.seq, n); err == nil {
				batch = append(batch, work{r: r, n: n, decode: r.prefilled})
				budget -= n
				break
			}
			v := s.victim()
			victim := s.running[v]
			s.running = slices.Delete(s.running, v, v+1)
			if v < i {
				// Scheduled earlier in this step (only PolicyPriority
				// reaches back): its tokens go back to the budget.
				for j, w := range batch {
					if w.r == victim {
						budget += w.n
						batch = slices.Delete(batch, j, j+1)
						break
					}
				}
				i--
			}
			s.preempt(victim)
			out.Preemptions++
			preempted = true
			if victim == r {
				break
			}
		}
	}
	return batch, budget, preempted
}

// admitWaiting admits waiting requests, first come first served, while
// max_num_seqs, the budget and the free blocks allow, in the step
// starting at now. Requests waiting for KV keep their place and are
// passed over (kvReady); the first other request that does not fit
// stops the pass.
func (s *Scheduler) admitWaiting(out *Step, batch []work, budget int, now time.Duration) []work {
	for i := 0; i < len(s.waiting) && len(s.running) < s.cfg.MaxNumSeqs && budget > 0; {
		r := s.waiting[i]
		if r.cancelled {
			s.dequeue(i)
			s.forget(out, r)
			continue
		}
		gpu, load, ok := s.kvReady(out, r, now)
		if !ok {
			i++
			continue
		}
		n, err := s.cache.AdmitLoad(r.seq, budget, load)
		if err != nil {
			break // this request waits for blocks; nothing overtakes it
		}
		s.dequeue(i)
		s.loaded(out, r, gpu, load, now)
		r.prefilled = false
		s.running = append(s.running, r)
		batch = append(batch, work{r: r, n: n})
		budget -= n
	}
	return batch
}

// dequeue takes the i-th request out of the waiting queue.
func (s *Scheduler) dequeue(i int) {
	if i == 0 {
		s.waiting = s.waiting[1:]
		return
	}
	s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
}

// duration is the latency model's cost of a batch: each prefill is a
// chunk at its context offset (the tokens computed or cached before it),
// each decode a sequence whose context is read.
func (s *Scheduler) duration(batch []work) time.Duration {
	chunks := s.chunks[:0]
	decodes, kvTokens := 0, 0
	for _, w := range batch {
		if w.decode {
			decodes++
			kvTokens += w.r.seq.Computed() + w.n
		} else {
			chunks = append(chunks, profile.Chunk{Offset: w.r.seq.Computed(), Tokens: w.n})
		}
	}
	s.chunks = chunks
	return s.cfg.Latency.StepCost(chunks, decodes, kvTokens)
}

// apply commits a scheduled batch at the step's end: KV computed, a token
// for each request whose prefill is complete, finished requests freed.
func (s *Scheduler) apply(out *Step, batch []work, end time.Duration) {
	finished := map[*request]bool{}
	for _, w := range batch {
		r := w.r
		s.cache.Commit(r.seq, w.n)
		if !w.decode {
			if r.seq.Computed() < len(r.seq.Tokens) {
				continue // chunked prefill goes on next step
			}
			r.prefilled = true
		}
		tok := r.gen.next()
		r.seq.Tokens = append(r.seq.Tokens, tok)
		r.outputs++
		u := Update{ID: r.id, Token: tok}
		if r.outputs == 1 {
			r.ttft = end - r.arrival
			u.First, u.CachedTokens, u.TTFT = true, r.seq.CachedTokens(), r.ttft
			u.GPUHitTokens, u.CPUHitTokens, u.PulledTokens = r.gpuHit, r.cpuHit, r.pulledHit
		}
		if r.outputs >= r.target || len(r.seq.Tokens) >= s.cfg.MaxModelLen {
			u.Finish = FinishLength
			if r.outputs == r.stopAt {
				u.Finish = FinishStop
			}
			u.Queued = r.scheduled - r.arrival
			u.Prefill = r.ttft - u.Queued
			s.cache.Free(r.seq)
			delete(s.byID, r.id)
			finished[r] = true
		}
		out.Updates = append(out.Updates, u)
	}
	if len(finished) > 0 {
		kept := s.running[:0]
		for _, r := range s.running {
			if !finished[r] {
				kept = append(kept, r)
			}
		}
		s.running = kept
	}
}

// forget ends a cancelled request.
func (s *Scheduler) forget(out *Step, r *request) {
	s.setKV(r, kvNone)
	delete(s.byID, r.id)
	out.Dropped = append(out.Dropped, r.id)
}

// preempt frees a running request's blocks and puts it back at the head
// of the queue; it recomputes its tokens when readmitted (or loads those
// the CPU tier holds), and one with a Source asks its peer again, as
// vLLM's rescheduled requests re-probe.
func (s *Scheduler) preempt(r *request) {
	s.cache.Free(r.seq)
	r.prefilled = false
	r.kv.probed, r.kv.paid = false, 0
	s.enqueue(r, true)
}
