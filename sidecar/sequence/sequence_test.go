package sequence

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// A step is one observation and the actions it must return.
type step struct {
	name string
	do   func(*Sequencer) []Action
	want []Action
}

// at is d after the tests' time 0.
func at(d time.Duration) time.Time { return time.Unix(1_800_000_000, 0).Add(d) }

func start(now time.Time, want ...Action) step {
	return step{fmt.Sprintf("Start(+%v)", now.Sub(at(0))), func(s *Sequencer) []Action { return s.Start(now) }, want}
}

func heard(now time.Time) step {
	return step{fmt.Sprintf("Heard(+%v)", now.Sub(at(0))), func(s *Sequencer) []Action { s.Heard(now); return nil }, nil}
}

func live(seq uint64, want ...Action) step {
	return step{fmt.Sprintf("Live(%d)", seq), func(s *Sequencer) []Action { return s.Live(seq) }, want}
}

func replayed(seq uint64, want ...Action) step {
	return step{fmt.Sprintf("Replayed(%d)", seq), func(s *Sequencer) []Action { return s.Replayed(seq) }, want}
}

func end(want ...Action) step { return endAt(at(0), nil, want...) }

func endAt(now time.Time, err error, want ...Action) step {
	return step{fmt.Sprintf("ReplayEnd(+%v, %v)", now.Sub(at(0)), err), func(s *Sequencer) []Action { return s.ReplayEnd(now, err) }, want}
}

func engineStart(st float64, want ...Action) step {
	return step{fmt.Sprintf("EngineStart(%v)", st), func(s *Sequencer) []Action { return s.EngineStart(st) }, want}
}

func idle(now time.Time, want ...Action) step {
	return step{fmt.Sprintf("Idle(+%v)", now.Sub(at(0))), func(s *Sequencer) []Action { return s.Idle(now) }, want}
}

func cleared(want ...Action) step {
	return step{"Cleared()", func(s *Sequencer) []Action { return s.Cleared() }, want}
}

func apply(seq uint64) Action      { return Action{Kind: Apply, Seq: seq} }
func fill(from, to uint64) Action  { return Action{Kind: Replay, From: from, To: to} }
func catchUp(from uint64) Action   { return Action{Kind: Replay, From: from, To: End, CatchUp: true} }
func done(o Outcome) Action        { return Action{Kind: ReplayDone, Outcome: o} }
func gap(from, to uint64) Action   { return Action{Kind: Gap, From: from, To: to} }
func partial(why string) Action    { return Action{Kind: MarkPartial, Reason: why} }
func newEpoch(epoch uint64) Action { return Action{Kind: Cleared, Epoch: epoch} }
func restart(epoch uint64, why string) Action {
	return Action{Kind: Restart, Epoch: epoch, Reason: why}
}

func drop() Action { return Action{Kind: DropHeld} }

const epoch0 = 100

// end state checked after the steps (nil: not checked).
type state struct {
	epoch   uint64
	applied uint64
	have    bool
	partial bool
}

func TestSequencer(t *testing.T) {
	noReplay := Config{Replay: false, IdleCheck: 2 * time.Second}
	errTimeout := errors.New("replay timed out")
	for _, tc := range []struct {
		name  string
		cfg   *Config // nil: DefaultConfig
		steps []step
		end   *state
	}{
		{name: "in order", steps: []step{
			live(0, apply(0)), live(1, apply(1)), live(2, apply(2)),
		}, end: &state{epoch0, 2, true, false}},
		{name: "late start: the ring holds the whole stream", steps: []step{
			start(at(0), catchUp(0)),
			replayed(0, apply(0)), replayed(1, apply(1)), replayed(2, apply(2)),
			end(done(OK)),
			live(3, apply(3)),
		}, end: &state{epoch0, 3, true, false}},
		// TestReplayOverlapIsNotARestart: batches published while the
		// catch-up is answered arrive twice, replayed and then live; they
		// are applied once and are no restart. A real restart that
		// publishes nothing is still caught from the start time.
		{name: "replay overlapping live is not a restart", steps: []step{
			engineStart(1000),
			start(at(0), catchUp(0)),
			replayed(0, apply(0)), replayed(1, apply(1)), replayed(2, apply(2)),
			replayed(3, apply(3)), replayed(4, apply(4)), // published during the replay
			end(done(OK)),
			live(3), live(4), // the same two, queued live
			live(5, apply(5)),
			engineStart(1000),
			engineStart(2000, restart(epoch0+1, ReasonStartChanged), catchUp(0), drop()),
			end(done(OK)), // the new process's ring is empty
			live(0, apply(0)),
		}, end: &state{epoch0 + 1, 0, true, false}},
		{name: "late start: the ring lost the start of the stream", steps: []step{
			start(at(0), catchUp(0)),
			replayed(3, apply(3)), replayed(4, apply(4)),
			end(partial(ReasonRingLostStart), done(Incomplete)),
			live(5, apply(5)),
		}, end: &state{epoch0, 5, true, true}},
		{name: "late start: an empty ring is no evidence of loss", steps: []step{
			start(at(0), catchUp(0)),
			end(done(OK)),
			live(7, fill(0, 7)),
			replayed(0, apply(0)), replayed(1, apply(1)), replayed(2, apply(2)), replayed(3, apply(3)),
			replayed(4, apply(4)), replayed(5, apply(5)), replayed(6, apply(6)),
			replayed(7), // the live batch itself: applied after the replay
			end(done(OK), apply(7)),
		}, end: &state{epoch0, 7, true, false}},
		{name: "late start: a failed catch-up is no evidence of loss", steps: []step{
			start(at(0), catchUp(0)),
			endAt(at(0), errTimeout, done(Failed)),
			live(0, apply(0)),
		}, end: &state{epoch0, 0, true, false}},
		{name: "late start without replay", cfg: &noReplay, steps: []step{
			start(at(0)),
			live(5, partial(ReasonNoReplay), apply(5)),
			live(6, apply(6)),
		}, end: &state{epoch0, 6, true, true}},
		{name: "gap filled", steps: []step{
			live(0, apply(0)),
			live(3, gap(1, 3), fill(1, 3)),
			replayed(1, apply(1)), replayed(2, apply(2)), replayed(3), replayed(4),
			end(done(OK), apply(3)),
			live(4, apply(4)),
		}, end: &state{epoch0, 4, true, false}},
		{name: "gap filled from a ring that starts earlier", steps: []step{
			live(0, apply(0)), live(1, apply(1)),
			live(4, gap(2, 4), fill(2, 4)),
			replayed(0), replayed(1), replayed(2, apply(2)), replayed(3, apply(3)),
			end(done(OK), apply(4)),
		}, end: &state{epoch0, 4, true, false}},
		{name: "gap partially filled: the ring lost the first missing batch", steps: []step{
			live(0, apply(0)),
			live(4, gap(1, 4), fill(1, 4)),
			replayed(2, apply(2)), replayed(3, apply(3)),
			end(partial(ReasonRingLostGap), done(Incomplete), apply(4)),
			// partial once: a later incomplete fill says nothing new
			live(7, gap(5, 7), fill(5, 7)),
			replayed(6, apply(6)),
			end(done(Incomplete), apply(7)),
		}, end: &state{epoch0, 7, true, true}},
		{name: "gap partially filled: a batch missing in the middle", steps: []step{
			live(0, apply(0)),
			live(4, gap(1, 4), fill(1, 4)),
			replayed(1, apply(1)), replayed(3, apply(3)),
			end(partial(ReasonRingLostGap), done(Incomplete), apply(4)),
		}, end: &state{epoch0, 4, true, true}},
		{name: "gap replay failed", steps: []step{
			live(0, apply(0)),
			live(3, gap(1, 3), fill(1, 3)),
			replayed(1, apply(1)),
			endAt(at(0), errTimeout, partial("replay failed: replay timed out"), done(Failed), apply(3)),
		}, end: &state{epoch0, 3, true, true}},
		{name: "gap with replay disabled", cfg: &noReplay, steps: []step{
			live(0, apply(0)),
			live(3, gap(1, 3), partial(ReasonNoReplay), apply(3)),
			live(5, gap(4, 5), apply(5)),
		}, end: &state{epoch0, 5, true, true}},
		{name: "the start of the stream missing: replayed before the first live batch", steps: []step{
			live(2, fill(0, 2)),
			replayed(0, apply(0)), replayed(1, apply(1)), replayed(2),
			end(done(OK), apply(2)),
		}, end: &state{epoch0, 2, true, false}},
		{name: "seq backwards: a restart, the new stream's start replayed", steps: []step{
			engineStart(1000),
			live(0, apply(0)), live(1, apply(1)), live(5, gap(2, 5), fill(2, 5)),
			replayed(2, apply(2)), replayed(3, apply(3)), replayed(4, apply(4)),
			end(done(OK), apply(5)),
			live(2, restart(epoch0+1, ReasonSeqBackwards), fill(0, 2)),
			replayed(0, apply(0)), replayed(1, apply(1)),
			end(done(OK), apply(2)),
			// the seq said restart first: the new start time is adopted
			engineStart(2000), engineStart(2000),
			live(3, apply(3)),
			engineStart(3000, restart(epoch0+2, ReasonStartChanged), catchUp(0), drop()),
			end(done(OK)),
		}, end: &state{epoch0 + 2, 0, false, false}},
		{name: "seq backwards to 0", steps: []step{
			live(0, apply(0)), live(1, apply(1)),
			live(0, restart(epoch0+1, ReasonSeqBackwards), apply(0)),
		}, end: &state{epoch0 + 1, 0, true, false}},
		{name: "a repeated live seq is a new process", cfg: &noReplay, steps: []step{
			live(0, apply(0)), live(1, apply(1)),
			live(1, restart(epoch0+1, ReasonSeqBackwards), partial(ReasonNoReplay), apply(1)),
		}, end: &state{epoch0 + 1, 1, true, true}},
		{name: "a restart clears partial", cfg: &noReplay, steps: []step{
			live(0, apply(0)), live(2, gap(1, 2), partial(ReasonNoReplay), apply(2)),
			live(0, restart(epoch0+1, ReasonSeqBackwards), apply(0)),
			live(5, gap(1, 5), partial(ReasonNoReplay), apply(5)),
		}, end: &state{epoch0 + 1, 5, true, true}},
		{name: "start time changed: restart, catch up, the old live seq forgotten", steps: []step{
			engineStart(1000),
			live(0, apply(0)), live(1, apply(1)), live(2, apply(2)),
			engineStart(2000, restart(epoch0+1, ReasonStartChanged), catchUp(0), drop()),
			replayed(0, apply(0)),
			end(done(OK)),
			live(1, apply(1)), // below the old process's live seq: no second restart
		}, end: &state{epoch0 + 1, 1, true, false}},
		{name: "start time changed without replay", cfg: &noReplay, steps: []step{
			engineStart(1000),
			live(0, apply(0)), live(1, apply(1)),
			engineStart(2000, restart(epoch0+1, ReasonStartChanged), drop()),
			live(0, apply(0)),
		}, end: &state{epoch0 + 1, 0, true, false}},
		{name: "start time: the first reading is adopted, the same one is no change, none is ignored", steps: []step{
			engineStart(1000), engineStart(1000), engineStart(0), engineStart(-1), engineStart(math.NaN()),
			live(0, apply(0)), engineStart(1000),
		}, end: &state{epoch0, 0, true, false}},
		{name: "AllBlocksCleared: a new epoch, exact again", cfg: &noReplay, steps: []step{
			live(0, apply(0)), live(2, gap(1, 2), partial(ReasonNoReplay), apply(2)),
			cleared(newEpoch(epoch0 + 1)),
			live(3, apply(3)),
			live(5, gap(4, 5), partial(ReasonNoReplay), apply(5)),
			live(1, restart(epoch0+2, ReasonSeqBackwards), partial(ReasonNoReplay), apply(1)),
		}, end: &state{epoch0 + 2, 1, true, true}},
		{name: "AllBlocksCleared inside a replay", steps: []step{
			start(at(0), catchUp(0)),
			replayed(0, apply(0)),
			cleared(newEpoch(epoch0 + 1)),
			replayed(1, apply(1)),
			end(done(OK)),
		}, end: &state{epoch0 + 1, 1, true, false}},
		{name: "idle tail check", steps: []step{
			start(at(0), catchUp(0)),
			replayed(0, apply(0)),
			endAt(at(10*time.Millisecond), nil, done(OK)), // the catch-up's end starts the idle clock
			idle(at(2010 * time.Millisecond)),
			idle(at(2011*time.Millisecond), catchUp(1)),
			replayed(0), replayed(1, apply(1)),
			endAt(at(2020*time.Millisecond), nil, done(OK)),
			idle(at(3 * time.Second)),
			heard(at(4 * time.Second)),
			live(2, apply(2)),
			idle(at(6 * time.Second)),
			idle(at(6*time.Second+time.Millisecond), catchUp(3)),
			replayed(7, apply(7)), // the ring rotated past what was missed
			endAt(at(6*time.Second+time.Millisecond), nil, partial(ReasonRingLostStart), done(Incomplete)),
		}, end: &state{epoch0, 7, true, true}},
		{name: "idle tail check with nothing applied asks from 0", steps: []step{
			start(at(0), catchUp(0)),
			end(done(OK)),
			idle(at(3*time.Second), catchUp(0)),
			endAt(at(3*time.Second), errTimeout, done(Failed)), // a catch-up: no partial
		}, end: &state{epoch0, 0, false, false}},
		{name: "the restart catch-up does not restart the idle clock", steps: []step{
			start(at(0), catchUp(0)), end(done(OK)),
			engineStart(1000),
			engineStart(2000, restart(epoch0+1, ReasonStartChanged), catchUp(0), drop()),
			endAt(at(5*time.Second), nil, done(OK)),
			idle(at(5*time.Second), catchUp(0)),
			end(done(OK)),
		}},
		{name: "no idle check without replay", cfg: &noReplay, steps: []step{
			start(at(0)), idle(at(time.Hour)),
		}},
		{name: "an observation during a replay ends it as failed", steps: []step{
			live(0, apply(0)),
			live(3, gap(1, 3), fill(1, 3)),
			replayed(1, apply(1)),
			live(4, partial("replay failed: "+ErrInterrupted.Error()), done(Failed), apply(3), apply(4)),
			replayed(2), end(), // no replay in flight: nothing
		}, end: &state{epoch0, 4, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.cfg != nil {
				cfg = *tc.cfg
			}
			s, err := New(cfg, epoch0)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				if got := st.do(s); !slices.Equal(got, st.want) {
					t.Fatalf("step %d %s: %v, want %v", i, st.name, got, st.want)
				}
			}
			if e := tc.end; e != nil {
				applied, have := s.Applied()
				if got := (state{s.Epoch(), applied, have, s.Partial()}); got != *e {
					t.Fatalf("end state %+v, want %+v", got, *e)
				}
			}
			if s.Replaying() {
				t.Fatal("a replay left in flight")
			}
		})
	}
}

func TestConfig(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Config{{}, {Replay: true}, {Replay: true, IdleCheck: -time.Second}} {
		if _, err := New(bad, 1); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestActionStrings(t *testing.T) {
	for _, tc := range []struct {
		a    Action
		want string
	}{
		{apply(3), "apply 3"}, {fill(1, 3), "replay [1,3)"}, {catchUp(4), "catch up from 4"}, {done(Incomplete), "replay incomplete"},
		{gap(1, 3), "gap [1,3)"}, {restart(7, ReasonSeqBackwards), "restart epoch 7 (seq went backwards)"},
		{newEpoch(8), "cleared epoch 8"}, {partial(ReasonNoReplay), "partial (replay disabled)"}, {drop(), "drop-held"},
		{Action{Kind: 99}, "kind(99)"},
	} {
		if got := tc.a.String(); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
	for o, want := range map[Outcome]string{OK: "ok", Incomplete: "incomplete", Failed: "failed", 0: "outcome(0)"} {
		if got := o.String(); got != want {
			t.Errorf("outcome %d: %q, want %q", o, got, want)
		}
	}
}
