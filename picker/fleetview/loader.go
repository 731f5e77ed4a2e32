package fleetview

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/summary"
)

// loader writes the snapshot loads the streams start, one batch at a
// time, on its own goroutine: the loads of one index that are waiting
// together are written in one pass (summary.LoadBatch), which is what
// makes a restarted picker's sync of a thousand endpoints a few passes
// over the index rather than a thousand. A stream hands its load
// over and waits for it (its later deltas must follow it); loads that
// arrive while a batch is written wait for the next. The view's lock is
// held for one step at a time, as the streams held it before.
type loader struct {
	lock    sync.Locker     // the view's write lock, held a step at a time
	batched func(loads int) // observes each batch's size
	mu      sync.Mutex
	pending []*pendingLoad
	wake    chan struct{} // one token: pending grew
	waiting atomic.Int64  // loads handed over and not yet answered or dropped
}

type pendingLoad struct {
	ctx  context.Context // the stream's: a load whose stream ended is dropped
	load *summary.SnapshotLoad
	done chan error // buffered: the loader never waits for a stream that left
}

func newLoader(lock sync.Locker, batched func(loads int)) *loader {
	return &loader{lock: lock, batched: batched, wake: make(chan struct{}, 1)}
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

// run writes batches until ctx ends.
func (ld *loader) run(ctx context.Context) {
	for {
		select {
		case <-ld.wake:
		case <-ctx.Done():
			return
		}
		for batch := ld.take(); len(batch) > 0; batch = ld.take() {
			ld.write(batch)
		}
	}
}

// take removes from pending the oldest load and every other waiting for
// the same index, one per slot (a later load of a slot already taken
// waits: the earlier one is abandoned at its first step).
func (ld *loader) take() []*pendingLoad {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if len(ld.pending) == 0 {
		return nil
	}
	first := ld.pending[0].load
	var batch []*pendingLoad
	slots := map[int]bool{}
	rest := ld.pending[:0]
	for _, p := range ld.pending {
		if p.load.Fleet() == first.Fleet() && !slots[p.load.Slot()] {
			batch, slots[p.load.Slot()] = append(batch, p), true
			continue
		}
		rest = append(rest, p)
	}
	clear(ld.pending[len(rest):])
	ld.pending = rest
	return batch
}

// write steps one batch to its end under the view's lock, a step at a
// time, dropping the loads whose streams ended (their slots stay absent
// until the next snapshot) and answering each load as it finishes.
func (ld *loader) write(batch []*pendingLoad) {
	loads := make([]*summary.SnapshotLoad, len(batch))
	byLoad := make(map[*summary.SnapshotLoad]*pendingLoad, len(batch))
	for i, p := range batch {
		loads[i], byLoad[p.load] = p.load, p
	}
	b, ok := summary.NewLoadBatch(loads)
	if !ok && len(batch) > 1 { // take groups only what a batch admits; were it not so, one at a time
		for _, p := range batch {
			ld.write([]*pendingLoad{p})
		}
		return
	}
	if !ok {
		ld.answer(batch[0], summary.ErrAbandoned) // a load already stepped: nothing else steps loads
		return
	}
	ld.batched(len(batch))
	for {
		ld.lock.Lock()
		for l, p := range byLoad {
			if p.ctx.Err() != nil {
				b.Drop(l)
				delete(byLoad, l)
				ld.waiting.Add(-1)
			}
		}
		done, abandoned := b.Step(max(1, snapshotStepLoadWords/max(1, b.Live())))
		ld.lock.Unlock()
		for _, l := range abandoned {
			if p := byLoad[l]; p != nil {
				ld.answer(p, summary.ErrAbandoned)
				delete(byLoad, l)
			}
		}
		if done || len(byLoad) == 0 {
			for _, p := range byLoad {
				ld.answer(p, nil)
			}
			return
		}
	}
}

func (ld *loader) answer(p *pendingLoad, err error) {
	ld.waiting.Add(-1)
	p.done <- err
}
