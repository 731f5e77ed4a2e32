package sequence

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

// FuzzSequencer feeds random observation sequences (including ones the
// shell never makes, such as a live batch while a replay is in flight)
// and checks the invariants of the package doc on every action.
func FuzzSequencer(f *testing.F) {
	f.Add([]byte{1, 0, 0, 2, 0, 2, 1, 2, 4, 3, 1, 3, 2, 3, 3, 3, 4, 4, 0})
	f.Add([]byte{0, 6, 1, 2, 0, 2, 1, 6, 2, 3, 0, 4, 0, 2, 1, 2, 0})
	f.Add([]byte{1, 2, 5, 3, 6, 5, 0, 9, 30, 7, 0, 3, 6, 4, 0, 8, 0, 2, 3})
	f.Add([]byte{0, 2, 0, 2, 9, 8, 0, 2, 2, 2, 1, 2, 0xff, 2, 0x81, 3, 0x85, 5, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) == 0 {
			return
		}
		cfg := DefaultConfig()
		cfg.Replay = ops[0]&1 == 1
		s, err := New(cfg, epoch0)
		if err != nil {
			t.Fatal(err)
		}
		c := checker{t: t, s: s, epoch: epoch0}
		now := at(0)
		for i := 1; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%10, ops[i+1]
			seq := uint64(arg % 16)
			if arg&0x80 != 0 {
				seq = math.MaxUint64 - uint64(arg&7)
			}
			switch op {
			case 0:
				c.check("Start", s.Start(now), nil)
			case 1:
				s.Heard(now)
			case 2:
				c.live(seq, s.Live(seq))
			case 3:
				c.check("Replayed", s.Replayed(seq), &seq)
			case 4:
				c.check("ReplayEnd", s.ReplayEnd(now, nil), nil)
			case 5:
				c.check("ReplayEnd(err)", s.ReplayEnd(now, errors.New("boom")), nil)
			case 6:
				c.check("EngineStart", s.EngineStart(float64(arg%4)*1000), nil)
			case 7:
				c.check("Idle", s.Idle(now), nil)
			case 8:
				c.check("Cleared", s.Cleared(), nil)
			case 9:
				now = now.Add(time.Duration(arg) * 100 * time.Millisecond)
			}
		}
	})
}

// checker follows the actions and checks the invariants.
type checker struct {
	t           *testing.T
	s           *Sequencer
	epoch       uint64
	applied     uint64
	have        bool // applied since the last restart
	partial     bool
	inFlight    bool
	from, to    uint64
	pending     bool // a live batch waits for the replay in flight
	pendingSeq  uint64
	expectApply bool // the pending live batch must be applied next
	expectedSeq uint64
	liveInCall  bool
	liveSeq     uint64
}

func (c *checker) live(seq uint64, acts []Action) {
	c.liveInCall, c.liveSeq = true, seq
	c.check("Live", acts, nil)
	c.liveInCall = false
	if c.inFlight { // the gap's replay: the batch waits for its end
		c.pending, c.pendingSeq = true, seq
		return
	}
	// A live batch is never lost: applied, or covered already.
	if applied, have := c.s.Applied(); !have || applied < seq {
		c.t.Fatalf("Live(%d) left the applied seq at %d (have %v)", seq, applied, have)
	}
}

func (c *checker) check(call string, acts []Action, replayed *uint64) {
	t := c.t
	for i, a := range acts {
		waited := c.expectApply
		if waited && (a.Kind != Apply || a.Seq != c.expectedSeq) {
			t.Fatalf("%s: action %d %v: the live batch %d waiting for the replay was not applied", call, i, a, c.expectedSeq)
		}
		c.expectApply = false
		switch a.Kind {
		case Apply:
			if c.have && a.Seq <= c.applied {
				t.Fatalf("%s: %v after %d with no restart between", call, a, c.applied)
			}
			switch {
			case waited:
				c.pending = false
			case replayed != nil:
				if a.Seq != *replayed || !c.inFlight || a.Seq < c.from || a.Seq >= c.to {
					t.Fatalf("%s(%d): %v outside the replay [%d,%d) (in flight %v)", call, *replayed, a, c.from, c.to, c.inFlight)
				}
			case c.liveInCall && a.Seq == c.liveSeq:
			default:
				t.Fatalf("%s: %v is neither the batch in hand nor the one waiting", call, a)
			}
			c.applied, c.have = a.Seq, true
		case Replay:
			if c.inFlight {
				t.Fatalf("%s: %v while a replay is in flight", call, a)
			}
			if a.CatchUp && a.To != End || !a.CatchUp && a.From >= a.To {
				t.Fatalf("%s: %v", call, a)
			}
			c.inFlight, c.from, c.to = true, a.From, a.To
		case ReplayDone:
			if !c.inFlight || a.Outcome < OK || a.Outcome > Failed {
				t.Fatalf("%s: %v with no replay in flight", call, a)
			}
			c.inFlight = false
			if c.pending {
				c.expectApply, c.expectedSeq = true, c.pendingSeq
			}
		case Gap:
			if !c.have || a.From != c.applied+1 || a.To <= a.From {
				t.Fatalf("%s: %v after applied %d", call, a, c.applied)
			}
		case Restart, Cleared:
			if a.Epoch != c.epoch+1 {
				t.Fatalf("%s: %v after epoch %d", call, a, c.epoch)
			}
			c.epoch, c.partial = a.Epoch, false
			if a.Kind == Restart {
				c.applied, c.have = 0, false
			}
		case MarkPartial:
			if c.partial || a.Reason == "" {
				t.Fatalf("%s: %v while partial already", call, a)
			}
			c.partial = true
		case DropHeld:
			if i != len(acts)-1 || !slices.ContainsFunc(acts, func(b Action) bool { return b.Kind == Restart }) {
				t.Fatalf("%s: %v but not last after a restart: %v", call, a, acts)
			}
		default:
			t.Fatalf("%s: unknown action %v", call, a)
		}
	}
	if c.expectApply {
		t.Fatalf("%s: the live batch %d waiting for the replay was not applied", call, c.expectedSeq)
	}
	applied, have := c.s.Applied()
	if c.s.Epoch() != c.epoch || c.s.Partial() != c.partial || c.s.Replaying() != c.inFlight || have != c.have || (have && applied != c.applied) {
		t.Fatalf("%s: sequencer epoch %d partial %v replaying %v applied %d/%v; actions said %d %v %v %d/%v",
			call, c.s.Epoch(), c.s.Partial(), c.s.Replaying(), applied, have, c.epoch, c.partial, c.inFlight, c.applied, c.have)
	}
}
