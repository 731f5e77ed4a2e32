package enginesim

import (
	"errors"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
	"github.com/kvroute/kvroute/test/enginesim/kvcache"
)

// update is what the scheduler tells a request's handler.
type update struct {
	index        int
	token        uint32
	hasToken     bool
	first        bool    // the first generated token
	cachedTokens int     // with first: num_cached_tokens
	ttft         float64 // with first: simulated seconds from arrival
	done         bool
	finish       string // "stop" or "length", with done
	err          error  // the request was aborted
}

// request is one prompt in the engine.
type request struct {
	index     int
	seq       *kvcache.Seq
	promptLen int
	target    int // output tokens to generate
	stopAt    int // the natural length (0 with ignore_eos): finish "stop" there
	gen       generator
	box       *mailbox
	cancelled atomic.Bool

	// owned by the scheduler goroutine
	arrival   float64
	outputs   int
	prefilled bool
	counted   bool // counted in the prefix-cache metrics
}

// mailbox carries updates from the scheduler to a handler without ever
// blocking the scheduler: its size is bounded by the tokens requested.
type mailbox struct {
	mu     sync.Mutex
	items  []update
	notify chan struct{} // capacity 1: "something arrived"
}

func newMailbox() *mailbox { return &mailbox{notify: make(chan struct{}, 1)} }

func (m *mailbox) put(u update) {
	m.mu.Lock()
	m.items = append(m.items, u)
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// empty reports whether nothing awaits take.
func (m *mailbox) empty() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.items) == 0
}

// take returns what arrived since the last call.
func (m *mailbox) take() []update {
	m.mu.Lock()
	defer m.mu.Unlock()
	items := m.items
	m.items = nil
	return items
}

// errRestarted aborts requests in flight when the engine restarts.
var errRestarted = errors.New("the engine restarted")

// words feed the deterministic output text.
var words = []string{
	"the", "cache", "block", "prefix", "token", "router", "engine", "request",
	"model", "answer", "tool", "call", "result", "data", "value", "state",
	"first", "next", "last", "long", "short", "fast", "slow", "warm",
	"cold", "shared", "local", "remote", "queue", "batch", "step", "turn",
}

// generator yields a deterministic token stream seeded by the prompt.
type generator struct {
	x       uint64
	pending []uint32
	n       int
}

func newGenerator(prompt []uint32, salt string) generator {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range prompt {
		b[0], b[1], b[2], b[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		h.Write(b[:])
	}
	h.Write([]byte(salt))
	return generator{x: h.Sum64() | 1}
}

// naturalLength is the reply's length when it ends on its own: 16–63 tokens.
func (g *generator) naturalLength() int { return 16 + int(g.x%48) }

func (g *generator) next() uint32 {
	for len(g.pending) == 0 {
		g.x ^= g.x << 13
		g.x ^= g.x >> 7
		g.x ^= g.x << 17
		w := words[g.x%uint64(len(words))]
		if g.n > 0 {
			w = " " + w
			if g.n%9 == 0 {
				w = "." + w
			}
		}
		g.n++
		g.pending = chat.Encode(w)
	}
	t := g.pending[0]
	g.pending = g.pending[1:]
	return t
}

// work is one request's share of a step.
type work struct {
	r      *request
	n      int
	decode bool
}

// scheduler is the engine core's state; only its goroutine touches it.
type scheduler struct {
	e       *Engine
	waiting []*request
	running []*request
	simNow  float64 // simulated seconds
}

func (s *scheduler) enqueue(r *request) {
	r.arrival = s.simNow
	s.waiting = append(s.waiting, r)
}

func (s *scheduler) abortAll(err error) {
	for _, r := range append(s.running, s.waiting...) {
		r.box.put(update{index: r.index, done: true, err: err})
	}
	s.running, s.waiting = nil, nil
}

// drop ends a request without a reply (its client went away).
func (s *scheduler) drop(r *request) {
	s.e.cache.Free(r.seq)
	s.e.metrics.aborted.Inc()
}

// step runs one engine step: schedule, simulate its duration, apply.
// It returns false when quit fired while sleeping.
func (s *scheduler) step(quit <-chan struct{}) bool {
	e := s.e
	cfg := e.cfg
	cache := e.cache
	budget := cfg.MaxNumBatchedTokens
	var batch []work
	preempted := false

	// Running requests first: decodes take one token, chunked prefills
	// continue. When blocks run out, preempt from the back (vLLM's policy).
	for i := 0; i < len(s.running) && budget > 0; i++ {
		r := s.running[i]
		if r.cancelled.Load() {
			s.drop(r)
			s.running = append(s.running[:i], s.running[i+1:]...)
			i--
			continue
		}
		n := 1
		if !r.prefilled {
			n = min(len(r.seq.Tokens)-r.seq.Computed(), budget)
		}
		for {
			err := cache.Schedule(r.seq, n)
			if err == nil {
				batch = append(batch, work{r: r, n: n, decode: r.prefilled})
				budget -= n
				break
			}
			victim := s.running[len(s.running)-1]
			s.running = s.running[:len(s.running)-1]
			s.preempt(victim)
			preempted = true
			if victim == r {
				break
			}
		}
	}
	// Then waiting requests, first come first served — none in a step that
	// had to preempt (vLLM's rule).
	for !preempted && len(s.waiting) > 0 && len(s.running) < cfg.MaxNumSeqs && budget > 0 {
		r := s.waiting[0]
		if r.cancelled.Load() {
			s.waiting = s.waiting[1:]
			e.metrics.aborted.Inc()
			continue
		}
		n, err := cache.Admit(r.seq, budget)
		if err != nil {
			break // head of line waits for blocks
		}
		s.waiting = s.waiting[1:]
		if !r.counted {
			r.counted = true
			hit := r.seq.CachedTokens()
			e.metrics.prefixQueries.Add(float64(r.promptLen))
			e.metrics.prefixHits.Add(float64(hit))
			e.metrics.promptTokens.Add(float64(r.promptLen))
			e.metrics.promptTokensCached.Add(float64(hit))
			e.metrics.promptTokensRecomputed.Add(float64(r.promptLen - hit))
		}
		r.prefilled = false
		s.running = append(s.running, r)
		batch = append(batch, work{r: r, n: n})
		budget -= n
	}
	if len(batch) == 0 {
		return true
	}

	// Simulated duration of the step.
	prefill, decodes := 0, 0
	for _, w := range batch {
		if w.decode {
			decodes++
		} else {
			prefill += w.n
		}
	}
	d := cfg.Sim.StepBase + time.Duration(decodes)*cfg.Sim.StepPerSeq +
		time.Duration(float64(prefill)/cfg.Sim.PrefillTokensPerSecond*float64(time.Second))
	if scaled := time.Duration(float64(d) * cfg.Sim.TimeScale); scaled > 0 {
		t := time.NewTimer(scaled)
		select {
		case <-t.C:
		case <-quit:
			t.Stop()
			return false
		}
	}
	s.simNow += d.Seconds()

	// Apply: KV computed, tokens sampled, finished requests freed. Updates
	// go out after the step's events are published, so a client never sees
	// its answer before the events of the blocks it stored.
	type note struct {
		r *request
		u update
	}
	var notes []note
	finished := map[*request]bool{}
	for _, w := range batch {
		r := w.r
		cache.Commit(r.seq, w.n)
		if !w.decode {
			if r.seq.Computed() < len(r.seq.Tokens) {
				continue // chunked prefill goes on next step
			}
			r.prefilled = true
		}
		tok := r.gen.next()
		r.seq.Tokens = append(r.seq.Tokens, tok)
		r.outputs++
		e.metrics.generationTokens.Inc()
		u := update{index: r.index, token: tok, hasToken: true}
		if r.outputs == 1 {
			u.first, u.cachedTokens, u.ttft = true, r.seq.CachedTokens(), s.simNow-r.arrival
			e.metrics.ttft.Observe(u.ttft)
		}
		notes = append(notes, note{r, u})
		if r.outputs >= r.target || len(r.seq.Tokens) >= cfg.MaxModelLen {
			finish := "length"
			if r.outputs == r.stopAt {
				finish = "stop"
			}
			cache.Free(r.seq)
			notes = append(notes, note{r, update{index: r.index, done: true, finish: finish}})
			e.metrics.success.WithLabelValues(finish).Inc()
			finished[r] = true
		}
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
	if ev := cache.TakeEvents(); len(ev) > 0 && e.pub != nil {
		e.pub.publish(ev)
	}
	for _, n := range notes {
		n.r.box.put(n.u)
	}
	e.metrics.observe(s)
	return true
}

// preemptAll puts every running request back in the queue.
func (s *scheduler) preemptAll() {
	for i := len(s.running) - 1; i >= 0; i-- {
		s.preempt(s.running[i])
	}
	s.running = nil
}

// preempt frees a running request's blocks and puts it back at the head
// of the queue; it recomputes its tokens when readmitted.
func (s *scheduler) preempt(r *request) {
	s.e.cache.Free(r.seq)
	r.prefilled = false
	s.waiting = append([]*request{r}, s.waiting...)
	s.e.metrics.preemptions.Inc()
}
