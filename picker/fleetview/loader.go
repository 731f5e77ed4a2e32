package fleetview

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/summary"
)

// loader writes the snapshot loads the streams start, on its own
// goroutine, all the loads of one index together (summary.LoadBatch):
// a load joins the lap of the index's rows under way at once and is
// written one lap later, which is what makes a restarted picker's sync of
// a thousand endpoints about one pass over the index rather than a
// thousand, and its last snapshot written one lap after it arrives. A
// stream hands its load over and waits for it (its later deltas must
// follow it). Each step is prepared without the view's lock (the
// transposes) and committed under it (the index written), so the lock is
// held for the writes alone, a step at a time.
type loader struct {
	lock    sync.Locker     // the view's write lock, held for each step's commit
	batched func(loads int) // observes each lap's loads: those written together, from an idle index to an idle index
	mu      sync.Mutex
	pending []*pendingLoad
	wake    chan struct{} // one token: pending grew
	waiting atomic.Int64  // loads handed over and not yet answered or dropped

	laps map[*summary.Fleet]*lap // the loader goroutine's alone
}

type pendingLoad struct {
	ctx  context.Context // the stream's: a load whose stream ended is dropped
	load *summary.SnapshotLoad
	done chan error // buffered: the loader never waits for a stream that left
}

// lap is the loads of one index being written.
type lap struct {
	b      *summary.LoadBatch
	byLoad map[*summary.SnapshotLoad]*pendingLoad
	joined int // loads that joined since the index was idle
}

// snapshotStepColumnWords is how much one step writes: 1,024 snapshot
// words of one row word's loads (64 rows each), over the row words with
// loads (64 words, 64Ki row words, for a group of a thousand; all of a
// snapshot's 16Ki words in 16 steps for one load). Its commit — the
// view's lock — is a few hundred microseconds (BenchmarkFleetLoad).
const snapshotStepColumnWords = 1 << 10

func newLoader(lock sync.Locker, batched func(loads int)) *loader {
	return &loader{lock: lock, batched: batched, wake: make(chan struct{}, 1), laps: map[*summary.Fleet]*lap{}}
}

// load hands l over and waits until it is written (nil), abandoned
// (summary.ErrAbandoned: the endpoint changed meanwhile) or ctx ends.
func (ld *loader) load(ctx context.Context, l *summary.SnapshotLoad) error {
	p := &pendingLoad{ctx: ctx, load: l, done: make(chan error, 1)}
	ld.waiting.Add(1)
	ld.mu.Lock()
	ld.pending = append(ld.pending, p)
	ld.mu.Unlock()
	select {
	case ld.wake <- struct{}{}:
	default:
	}
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		return ctx.Err() // the loader drops it at its next step
	}
}

// run writes loads until ctx ends: while any index has loads it steps
// each such index in turn, taking the loads handed over meanwhile before
// every round.
func (ld *loader) run(ctx context.Context) {
	for {
		ld.mu.Lock()
		idle := len(ld.laps) == 0 && len(ld.pending) == 0
		ld.mu.Unlock()
		if idle {
			select {
			case <-ld.wake:
			case <-ctx.Done():
				return
			}
		} else if ctx.Err() != nil {
			return
		}
		ld.admit()
		for f, lp := range ld.laps {
			ld.step(lp)
			if lp.b.Live() == 0 {
				if lp.joined > 0 {
					ld.batched(lp.joined)
				}
				delete(ld.laps, f)
			}
		}
	}
}

// admit moves the loads handed over into their index's lap. A load of a
// slot that still has one in the lap (which it abandons) waits for the
// next round, when that one has left; a load whose stream ended is
// dropped, its slot absent until the next snapshot.
func (ld *loader) admit() {
	select {
	case <-ld.wake:
	default:
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	rest := ld.pending[:0]
	for _, p := range ld.pending {
		if p.ctx.Err() != nil {
			ld.waiting.Add(-1)
			continue
		}
		if p.load.Started() { // a load already stepped: nothing else steps loads
			ld.answer(p, summary.ErrAbandoned)
			continue
		}
		lp := ld.laps[p.load.Fleet()]
		if lp == nil {
			lp = &lap{b: summary.NewLoadBatch(p.load.Fleet()), byLoad: map[*summary.SnapshotLoad]*pendingLoad{}}
			ld.laps[p.load.Fleet()] = lp
		}
		if !lp.b.Add(p.load) {
			rest = append(rest, p)
			continue
		}
		lp.byLoad[p.load] = p
		lp.joined++
	}
	clear(ld.pending[len(rest):])
	ld.pending = rest
}

// step writes one step of lp: prepared without the lock, committed under
// it, the loads whose streams ended dropped first (under the lock: a
// sidecar forgotten under it never has a load finished after); then it
// answers the loads the step finished or found abandoned.
func (ld *loader) step(lp *lap) {
	lp.b.Prepare(max(1, snapshotStepColumnWords/max(1, lp.b.Columns())))
	ld.lock.Lock()
	for l, p := range lp.byLoad {
		if p.ctx.Err() != nil {
			lp.b.Drop(l)
			delete(lp.byLoad, l)
			ld.waiting.Add(-1)
		}
	}
	finished, abandoned := lp.b.Commit()
	ld.lock.Unlock()
	for _, l := range abandoned {
		if p := lp.byLoad[l]; p != nil {
			ld.answer(p, summary.ErrAbandoned)
			delete(lp.byLoad, l)
		}
	}
	for _, l := range finished {
		if p := lp.byLoad[l]; p != nil {
			ld.answer(p, nil)
			delete(lp.byLoad, l)
		}
	}
}

func (ld *loader) answer(p *pendingLoad, err error) {
	ld.waiting.Add(-1)
	p.done <- err
}
