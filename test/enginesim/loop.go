package enginesim

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/test/enginesim/sched"
)

// update is what the scheduler goroutine tells a request's handler.
type update struct {
	index        int
	token        uint32
	hasToken     bool
	first        bool // the first generated token
	cachedTokens int  // with first: num_cached_tokens
	done         bool
	finish       string // "stop" or "length", with done
	err          error  // the request was aborted
}

// request is one prompt of an HTTP request, on its way to the core.
type request struct {
	spec  sched.Request
	index int // the prompt's place in its HTTP request
	box   *mailbox
	// arrival is the simulated second it reached the core (simSec).
	arrival float64
	// source is the peer its remote_kv_source names (none: zero).
	source kvSource
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

// run is the scheduler goroutine: it takes requests and control calls
// between steps, and steps the core while it has work.
func (e *Engine) run() {
	defer close(e.done)
	for {
		if e.core.Idle() {
			select {
			case r := <-e.submitCh:
				e.enqueue(r)
			case f := <-e.ctrl:
				f()
				continue
			case d := <-e.pulls:
				e.takePull(d)
				continue
			case <-e.quit:
				e.abortAll(ErrClosed)
				return
			}
		}
		if !e.drain() || !e.step() {
			e.abortAll(ErrClosed)
			return
		}
	}
}

// drain takes what arrived without waiting: requests, control calls and
// cancellations. It returns false when the engine is closing.
func (e *Engine) drain() bool {
	for {
		select {
		case r := <-e.submitCh:
			e.enqueue(r)
		case f := <-e.ctrl:
			f()
		case d := <-e.pulls:
			e.takePull(d)
		case <-e.quit:
			return false
		default:
			e.applyCancels()
			return true
		}
	}
}

// applyCancels passes the handlers' cancellations to the core. A request
// is submitted before it is cancelled, so the queued submissions are taken
// first: none is missed.
func (e *Engine) applyCancels() {
	e.cancelMu.Lock()
	ids := e.cancels
	e.cancels = nil
	e.cancelMu.Unlock()
	if len(ids) == 0 {
		return
	}
	for queued := true; queued; {
		select {
		case r := <-e.submitCh:
			e.enqueue(r)
		default:
			queued = false
		}
	}
	for _, id := range ids {
		e.core.Cancel(id) // one already finished is no longer there
	}
}

// enqueue hands a request to the core, at the current simulated time.
func (e *Engine) enqueue(r *request) {
	if err := e.core.Add(r.spec, e.simNow); err != nil { // the handlers check first: cannot happen
		r.box.put(update{index: r.index, done: true, err: err})
		return
	}
	r.arrival = e.simSec
	e.live[r.spec.ID] = r
}

// cancel asks the core to drop requests (their client went away); they
// leave at the next step that reaches them.
func (e *Engine) cancel(ids []sched.ID) {
	e.cancelMu.Lock()
	e.cancels = append(e.cancels, ids...)
	e.cancelMu.Unlock()
	select { // a loop parked for KV takes them now
	case e.wake <- struct{}{}:
	default:
	}
}

// abortAll fails every request in flight: the core's, running first, then
// waiting; then any whose last step was cut short.
func (e *Engine) abortAll(err error) {
	for _, id := range e.core.Restart() {
		if r, ok := e.live[id]; ok {
			r.box.put(update{index: r.index, done: true, err: err})
			delete(e.live, id)
		}
	}
	for id, r := range e.live {
		r.box.put(update{index: r.index, done: true, err: err})
		delete(e.live, id)
	}
}

// step runs one core step: it sleeps for the step's duration times the
// time scale, then counts what was scheduled and sampled (the prompt
// figures of the requests admitted come with the step's outcome, as
// vLLM's scheduler stats do), publishes the step's events and only then
// delivers its tokens, so a client never sees its answer before the
// events of the blocks it stored. It returns false when the engine closed
// while sleeping.
func (e *Engine) step() bool {
	res := e.core.Step(e.simNow)
	e.startPulls(lookupsOf(res))
	m := e.metrics
	for _, id := range res.Dropped {
		delete(e.live, id)
		m.aborted.Inc()
	}
	if res.Preemptions > 0 {
		m.preemptions.Add(float64(res.Preemptions))
	}
	if res.Scheduled == 0 {
		e.observeOffload(res)
		if len(res.Events) > 0 { // pulled blocks stored in the CPU tier
			e.emit(res.Events)
		}
		e.setLoad(res.Load)
		return e.parkKV()
	}
	if !e.sleep(res.Duration) {
		return false
	}
	e.simNow += res.Duration
	e.simSec += res.Duration.Seconds()
	if res.PromptTokens > 0 { // with the step's outcome, as vLLM's scheduler stats
		hit := float64(res.CachedTokens) // the GPU's
		o := stepOffload(res)
		external := o.CPUHitTokens + o.PulledTokens // the connector's
		m.prefixQueries.Add(float64(res.PromptTokens))
		m.prefixHits.Add(hit)
		m.promptTokens.Add(float64(res.PromptTokens))
		m.promptTokensCached.Add(hit + float64(external))
		m.promptTokensRecomputed.Add(float64(res.PromptTokens - res.CachedTokens - external))
	}
	e.observeOffload(res)
	for _, u := range res.Updates {
		m.generationTokens.Inc()
		if r, ok := e.live[u.ID]; ok && u.First {
			m.ttft.Observe(e.simSec - r.arrival) // u.TTFT, on the float clock
		}
		if u.Finish != "" {
			m.success.WithLabelValues(u.Finish).Inc()
			m.queueTime.Observe(u.Queued.Seconds()) // at the end, as vLLM
			m.prefillTime.Observe(u.Prefill.Seconds())
		}
	}
	if len(res.Events) > 0 {
		e.emit(res.Events)
	}
	e.deliver(res.Updates)
	e.setLoad(res.Load)
	return true
}

// sleep waits d times the time scale; false when the engine closes first.
func (e *Engine) sleep(d time.Duration) bool {
	scaled := time.Duration(float64(d) * e.cfg.Sim.TimeScale)
	if scaled <= 0 {
		return true
	}
	t := time.NewTimer(scaled)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-e.quit:
		return false
	}
}

// deliver hands a step's updates to the handlers' mailboxes.
func (e *Engine) deliver(updates []sched.Update) {
	for _, u := range updates {
		r, ok := e.live[u.ID]
		if !ok {
			continue
		}
		r.box.put(update{index: r.index, token: u.Token, hasToken: true, first: u.First, cachedTokens: u.CachedTokens})
		if u.Finish != "" {
			r.box.put(update{index: r.index, done: true, finish: u.Finish})
			delete(e.live, u.ID)
		}
	}
}

// emit publishes one batch of events: over ZMQ when KV events are on, and
// to the in-process sink when there is one.
func (e *Engine) emit(events []kvevents.Event) {
	batch := kvevents.Batch{
		TS:               float64(time.Now().UnixNano()) / 1e9,
		Events:           events,
		DataParallelRank: kvevents.Some(int64(e.rank)),
	}
	if e.pub != nil {
		e.pub.publish(&batch)
	}
	if e.cfg.EventSink != nil {
		e.cfg.EventSink(batch)
	}
}

// submit hands requests to the scheduler.
func (e *Engine) submit(ctx context.Context, reqs ...*request) error {
	for _, r := range reqs {
		select {
		case e.submitCh <- r:
		case <-e.quit:
			return ErrClosed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
