package lab

import (
	"container/heap"
	"time"
)

// sim is the lab's virtual clock and event queue: events run in time
// order, and events at the same time in the order they were scheduled,
// so a run is a pure function of its inputs.
type sim struct {
	now   time.Duration // since the run's start
	seq   uint64
	queue events
	base  time.Time // the wall-clock face of time 0, for the cores that take a time.Time
}

type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type events []event

func (q events) Len() int { return len(q) }
func (q events) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q events) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)   { *q = append(*q, x.(event)) }
func (q *events) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*q = old[:len(old)-1]
	return e
}

// at schedules fn at time t (not before now).
func (s *sim) at(t time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.queue, event{at: max(t, s.now), seq: s.seq, fn: fn})
}

// after schedules fn d after now.
func (s *sim) after(d time.Duration, fn func()) { s.at(s.now+d, fn) }

// run runs events until none is left or the next is past horizon; false
// when it stopped at the horizon.
func (s *sim) run(horizon time.Duration) bool {
	for s.queue.Len() > 0 {
		e := heap.Pop(&s.queue).(event)
		if e.at > horizon {
			return false
		}
		s.now = e.at
		e.fn()
	}
	return true
}

// wall is the time.Time face of simulated time t.
func (s *sim) wall(t time.Duration) time.Time { return s.base.Add(t) }

// clock is the time.Time face of now, for the cores' Clock hooks.
func (s *sim) clock() time.Time { return s.base.Add(s.now) }
