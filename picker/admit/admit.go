package admit

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Config holds the admission limits. Start from DefaultConfig: Validate
// says what is out of range. A zero saturation limit is not checked.
type Config struct {
	// MaxWaiting: an endpoint with at least this many requests queued
	// (its engine's last reported waiting requests plus this picker's
	// picks that report does not cover) is saturated. Default 5, as
	// llm-d's saturation detector.
	MaxWaiting float64
	// MaxKVUsage: an endpoint whose engine reports at least this share of
	// its KV cache in use (0..1) is saturated. Default 0.95.
	MaxKVUsage float64
	// MaxPrefillTokens: an endpoint with at least this many uncached
	// prompt tokens from this picker still before their first byte is
	// saturated. Default 2,048: one chunked-prefill step at vLLM's
	// default --max-num-batched-tokens for its API server on GPUs under
	// 70 GB (8,192 above), so the engine has its next step's work while
	// later requests wait in the picker, where priority and fairness
	// apply, instead of in the engine's queue. Higher trades TTFT and
	// fairness for throughput (docs/benchmarks.md, issue 19).
	MaxPrefillTokens float64
	// QueueSize bounds the requests waiting per model group. Default 256.
	QueueSize int
	// QueueTimeout bounds a request's wait; past it, 429. Default 5 s.
	QueueTimeout time.Duration
	// LIFOAfter: once a key's oldest waiter has waited this long (the
	// queue stands: load is above capacity, not a burst), that key's
	// waiters go newest first, so that those released wait little and
	// those that cannot be served expire. 0 keeps arrival order. Default
	// 250 ms.
	LIFOAfter time.Duration
	// StandingTimeout: once the queue has stood (its oldest waiter older
	// than LIFOAfter) for this long, waiters older than this are shed
	// (429): under sustained overload no released request has waited
	// longer, while a burst may still wait QueueTimeout. 0 never.
	// Default 1 s.
	StandingTimeout time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{MaxWaiting: 5, MaxKVUsage: 0.95, MaxPrefillTokens: 2048, QueueSize: 256, QueueTimeout: 5 * time.Second,
		LIFOAfter: 250 * time.Millisecond, StandingTimeout: time.Second}
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []error
	if !(c.MaxWaiting >= 0) || math.IsInf(c.MaxWaiting, 0) {
		errs = append(errs, fmt.Errorf("--saturation-waiting %v: want a number of requests, 0 to not check", c.MaxWaiting))
	}
	if !(c.MaxKVUsage >= 0 && c.MaxKVUsage <= 1) {
		errs = append(errs, fmt.Errorf("--saturation-kv-usage %v: want a share 0..1, 0 to not check", c.MaxKVUsage))
	}
	if !(c.MaxPrefillTokens >= 0) || math.IsInf(c.MaxPrefillTokens, 0) {
		errs = append(errs, fmt.Errorf("--saturation-prefill-tokens %v: want a number of tokens, 0 to not check", c.MaxPrefillTokens))
	}
	if c.QueueSize < 0 || c.QueueSize > 1<<20 {
		errs = append(errs, fmt.Errorf("--queue-size %d: want 0 (shed at once) to %d", c.QueueSize, 1<<20))
	}
	if c.QueueTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--queue-timeout %v: want a positive duration", c.QueueTimeout))
	}
	if c.StandingTimeout < 0 || (c.StandingTimeout > 0 && c.StandingTimeout < c.LIFOAfter) {
		errs = append(errs, fmt.Errorf("--queue-standing-timeout %v: want 0 (never) or at least --queue-lifo-after (%v)", c.StandingTimeout, c.LIFOAfter))
	}
	if c.LIFOAfter < 0 {
		errs = append(errs, fmt.Errorf("--queue-lifo-after %v: want a duration, 0 to keep arrival order", c.LIFOAfter))
	}
	return errors.Join(errs...)
}

// Load is one routable endpoint's load as admission judges it.
type Load struct {
	Queued        float64 // requests queued at its engine: reported waiting plus unreported picks
	KVUsage       float64 // reported KV cache usage, 0..1 (0: none reported)
	PrefillTokens float64 // this picker's uncached prompt tokens to it before their first byte
}

// EndpointSaturated reports whether l is at or above a limit.
func (c *Config) EndpointSaturated(l Load) bool {
	return (c.MaxWaiting > 0 && l.Queued >= c.MaxWaiting) ||
		(c.MaxKVUsage > 0 && l.KVUsage >= c.MaxKVUsage) ||
		(c.MaxPrefillTokens > 0 && l.PrefillTokens >= c.MaxPrefillTokens)
}

// Saturated reports whether every one of a group's routable endpoints
// (loads) is saturated; false for none.
func (c *Config) Saturated(loads []Load) bool {
	for _, l := range loads {
		if !c.EndpointSaturated(l) {
			return false
		}
	}
	return len(loads) > 0
}

// RetryAfter is the wait to tell a refused client: queued waiters over
// the recent release rate (per second), within [1 s, 60 s]; 60 s when
// nothing was released lately.
func RetryAfter(queued int, releasesPerSecond float64) time.Duration {
	if !(releasesPerSecond > 0) {
		return 60 * time.Second
	}
	s := math.Ceil(float64(queued+1) / releasesPerSecond)
	return time.Duration(min(max(s, 1), 60)) * time.Second
}

// Waiter is a request in the queue.
type Waiter struct {
	ID       uint64 // unique among the queue's waiters
	Key      string // fairness key
	Priority int    // higher first
	Cost     float64
	Arrived  time.Time
	Deadline time.Time
}

// Queue is a bounded queue of waiters (package doc).
type Queue struct {
	size  int
	lifo  time.Duration
	bands map[int]*band
	where map[uint64]*flow
	n     int
	seq   uint64
}

// NewQueue returns an empty queue holding at most size waiters, whose
// keys go newest first once their oldest waiter waited lifoAfter (0:
// never).
func NewQueue(size int, lifoAfter time.Duration) *Queue {
	return &Queue{size: size, lifo: lifoAfter, bands: map[int]*band{}, where: map[uint64]*flow{}}
}

// Len is the number of waiters.
func (q *Queue) Len() int { return q.n }

// LenOf is the number of waiters of key.
func (q *Queue) LenOf(key string) int {
	n := 0
	for _, b := range q.bands {
		if f := b.flows[key]; f != nil {
			n += len(f.items)
		}
	}
	return n
}

// Keys are the keys with waiters, each with how many.
func (q *Queue) Keys() map[string]int {
	out := map[string]int{}
	for _, b := range q.bands {
		for k, f := range b.flows {
			if len(f.items) > 0 {
				out[k] += len(f.items)
			}
		}
	}
	return out
}

// Push adds w. When the queue is full, a waiter of the lowest band not
// above w's makes room: the oldest of its key with the largest finish tag
// (the key furthest ahead of its share), returned with displaced true.
// When every waiter is of a higher band, or the queue holds none, w is
// refused (ok false). A duplicate ID is refused.
func (q *Queue) Push(w Waiter) (out Waiter, displaced, ok bool) {
	if _, dup := q.where[w.ID]; dup {
		return Waiter{}, false, false
	}
	if q.n >= q.size {
		low := q.lowest()
		if low == nil || low.prio > w.Priority {
			return Waiter{}, false, false
		}
		out, displaced = low.drop(), true
		q.Remove(out.ID)
	}
	b := q.bands[w.Priority]
	if b == nil {
		b = &band{prio: w.Priority, flows: map[string]*flow{}}
		q.bands[w.Priority] = b
	}
	q.seq++
	q.where[w.ID] = b.push(w, q.seq)
	q.n++
	return out, displaced, true
}

// Pop takes out the next waiter to release at now (package doc): the
// key's oldest, or its newest once the oldest waited the queue's
// lifoAfter.
func (q *Queue) Pop(now time.Time) (Waiter, bool) {
	w, ok := q.Peek(now)
	if !ok {
		return Waiter{}, false
	}
	f := q.where[w.ID]
	b := f.band
	if f.items[0].w.ID == w.ID {
		b.pop()
	} else {
		b.take(f, w.ID)
	}
	delete(q.where, w.ID)
	q.n--
	q.dropIfEmpty(b)
	return w, true
}

// Peek is the waiter Pop would return at now.
func (q *Queue) Peek(now time.Time) (Waiter, bool) {
	b := q.highest()
	if b == nil {
		return Waiter{}, false
	}
	f := b.heads[0]
	if q.lifo > 0 && now.Sub(f.items[0].w.Arrived) >= q.lifo {
		return f.items[len(f.items)-1].w, true
	}
	return f.items[0].w, true
}

// Remove takes out the waiter id; false when it is not queued.
func (q *Queue) Remove(id uint64) bool {
	f, ok := q.where[id]
	if !ok {
		return false
	}
	b := f.band
	b.remove(f, id)
	delete(q.where, id)
	q.n--
	q.dropIfEmpty(b)
	return true
}

// Expire takes out and returns the waiters whose deadline is not after
// now, earliest deadline first.
func (q *Queue) Expire(now time.Time) []Waiter {
	return q.takeBy(deadlineOf, now)
}

// ExpireArrived takes out and returns the waiters that arrived at or
// before cutoff, oldest first, of keys ahead of their share: those whose
// finish tag is more than their head waiter's cost past the band's
// virtual time (a key with a single waiter, or one that just got its
// turn, is spared: it waits for its turn, up to its deadline).
func (q *Queue) ExpireArrived(cutoff time.Time) []Waiter {
	var out []Waiter
	for _, b := range q.bands {
		for _, f := range b.heads {
			if f.finish-b.vtime <= costOf(f.items[0].w) {
				continue
			}
			for _, e := range f.items {
				if !e.w.Arrived.After(cutoff) {
					out = append(out, e.w)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Waiter) int { return cmp.Or(a.Arrived.Compare(b.Arrived), cmp.Compare(a.ID, b.ID)) })
	for _, w := range out {
		q.Remove(w.ID)
	}
	return out
}

// NextDeadline is the earliest deadline among the waiters.
func (q *Queue) NextDeadline() (time.Time, bool) { return q.earliest(deadlineOf) }

// Oldest is the earliest arrival among the waiters.
func (q *Queue) Oldest() (time.Time, bool) { return q.earliest(arrivalOf) }

func deadlineOf(w Waiter) time.Time { return w.Deadline }
func arrivalOf(w Waiter) time.Time  { return w.Arrived }

// takeBy takes out and returns the waiters whose time (by at) is not
// after t, earliest first.
func (q *Queue) takeBy(at func(Waiter) time.Time, t time.Time) []Waiter {
	var out []Waiter
	q.each(func(w Waiter) {
		if !at(w).After(t) {
			out = append(out, w)
		}
	})
	slices.SortFunc(out, func(a, b Waiter) int { return cmp.Or(at(a).Compare(at(b)), cmp.Compare(a.ID, b.ID)) })
	for _, w := range out {
		q.Remove(w.ID)
	}
	return out
}

// earliest is the least time (by at) among the waiters.
func (q *Queue) earliest(at func(Waiter) time.Time) (time.Time, bool) {
	var t time.Time
	q.each(func(w Waiter) {
		if t.IsZero() || at(w).Before(t) {
			t = at(w)
		}
	})
	return t, !t.IsZero()
}

// each calls fn with every waiter, in no order.
func (q *Queue) each(fn func(Waiter)) {
	for _, b := range q.bands {
		for _, f := range b.heads {
			for _, e := range f.items {
				fn(e.w)
			}
		}
	}
}

func (q *Queue) dropIfEmpty(b *band) {
	if b.n == 0 {
		delete(q.bands, b.prio)
	}
}

func (q *Queue) highest() *band {
	var best *band
	for _, b := range q.bands {
		if best == nil || b.prio > best.prio {
			best = b
		}
	}
	return best
}

func (q *Queue) lowest() *band {
	var low *band
	for _, b := range q.bands {
		if low == nil || b.prio < low.prio {
			low = b
		}
	}
	return low
}

// band is one priority's waiters: a flow per key, the flows with waiters
// in a heap by their head's start tag.
type band struct {
	prio  int
	vtime float64 // the start tag of the waiter last released
	flows map[string]*flow
	heads flowHeap
	n     int
}

type flow struct {
	band   *band
	key    string
	items  []entry
	finish float64 // the finish tag of its last waiter
	index  int     // in band.heads; -1 when it has no waiters
}

type entry struct {
	w     Waiter
	start float64
	seq   uint64
}

func (b *band) push(w Waiter, seq uint64) *flow {
	f := b.flows[w.Key]
	if f == nil {
		f = &flow{band: b, key: w.Key, index: -1}
		b.flows[w.Key] = f
	}
	cost := costOf(w)
	start := max(b.vtime, f.finish)
	f.finish = start + cost
	f.items = append(f.items, entry{w: w, start: start, seq: seq})
	if f.index < 0 {
		heap.Push(&b.heads, f)
	}
	b.n++
	return f
}

func (b *band) pop() Waiter {
	f := b.heads[0]
	e := f.items[0]
	f.items = f.items[1:]
	b.vtime = max(b.vtime, e.start)
	if len(f.items) == 0 {
		heap.Pop(&b.heads)
	} else {
		heap.Fix(&b.heads, 0)
	}
	b.n--
	b.forget()
	return e.w
}

// take releases waiter id of f, not its head (newest first), charging
// the flow as a release of its head would: the virtual time moves to the
// head's start tag, and the waiters left take the next slots from there
// on, the first starting where the released waiter's cost ends. (Taking
// the waiter out as remove does would leave the flow's head tag where it
// was, and a flow served newest first would hold the virtual time still
// and starve every other key.)
func (b *band) take(f *flow, id uint64) {
	i := slices.IndexFunc(f.items, func(e entry) bool { return e.w.ID == id })
	if i < 0 {
		return
	}
	s0 := f.items[0].start
	b.vtime = max(b.vtime, s0)
	next := s0 + costOf(f.items[i].w)
	f.items = append(f.items[:i:i], f.items[i+1:]...)
	for j := range f.items {
		f.items[j].start = next
		next += costOf(f.items[j].w)
	}
	f.finish = max(next, b.vtime)
	if len(f.items) == 0 {
		heap.Remove(&b.heads, f.index)
	} else {
		heap.Fix(&b.heads, f.index)
	}
	b.n--
	b.forget()
}

// remove takes waiter id out of f: the waiters behind it in f move ahead
// by its cost (not before the band's virtual time).
func (b *band) remove(f *flow, id uint64) {
	i := 0
	for i < len(f.items) && f.items[i].w.ID != id {
		i++
	}
	if i == len(f.items) {
		return
	}
	cost := costOf(f.items[i].w)
	f.items = append(f.items[:i:i], f.items[i+1:]...)
	for j := i; j < len(f.items); j++ {
		f.items[j].start = max(b.vtime, f.items[j].start-cost)
	}
	f.finish = max(b.vtime, f.finish-cost)
	if len(f.items) == 0 {
		heap.Remove(&b.heads, f.index)
	} else {
		heap.Fix(&b.heads, f.index)
	}
	b.n--
	b.forget()
}

// forget drops idle keys whose finish tag the virtual time passed (they
// have no credit or debt left), and every key when the band is empty.
func (b *band) forget() {
	if b.n == 0 {
		clear(b.flows)
		return
	}
	if len(b.flows) <= 2*b.n+64 {
		return
	}
	for k, f := range b.flows {
		if len(f.items) == 0 && f.finish <= b.vtime {
			delete(b.flows, k)
		}
	}
}

// drop is the waiter to make room with: the oldest of the flow with the
// largest finish tag (ties: the earlier arrival).
func (b *band) drop() Waiter {
	var worst *flow
	for _, f := range b.heads {
		if worst == nil || f.finish > worst.finish || (f.finish == worst.finish && f.items[0].seq < worst.items[0].seq) {
			worst = f
		}
	}
	return worst.items[0].w
}

// flowHeap orders flows by their head's start tag, then its arrival.
type flowHeap []*flow

func (h flowHeap) Len() int { return len(h) }
func (h flowHeap) Less(i, j int) bool {
	a, b := h[i].items[0], h[j].items[0]
	if a.start != b.start {
		return a.start < b.start
	}
	return a.seq < b.seq
}
func (h flowHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *flowHeap) Push(x any) {
	f := x.(*flow)
	f.index = len(*h)
	*h = append(*h, f)
}
func (h *flowHeap) Pop() any {
	old := *h
	f := old[len(old)-1]
	old[len(old)-1] = nil
	f.index = -1
	*h = old[:len(old)-1]
	return f
}

// costOf is w's cost as the tags count it: at least 1, finite.
func costOf(w Waiter) float64 {
	if math.IsNaN(w.Cost) || math.IsInf(w.Cost, 0) || w.Cost < 1 {
		return 1
	}
	return w.Cost
}
