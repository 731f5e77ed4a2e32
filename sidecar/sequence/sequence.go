package sequence

import (
	"errors"
	"fmt"
	"time"
)

// End is the To of a catch-up replay: whatever the ring holds.
const End = ^uint64(0)

// Reasons, as Restart and MarkPartial carry them (and the sidecar logs).
const (
	ReasonSeqBackwards  = "seq went backwards"
	ReasonStartChanged  = "engine start time changed"
	ReasonNoReplay      = "replay disabled"
	ReasonRingLostStart = "replay ring no longer holds the start of the stream"
	ReasonRingLostGap   = "replay ring no longer holds the missing batches"
	// A failed gap fill's reason is "replay failed: " and the error.
	reasonFailedPrefix = "replay failed: "
)

// ErrInterrupted ends a replay the shell did not report the end of before
// its next observation.
var ErrInterrupted = errors.New("replay interrupted by another observation")

// Kind says what an Action asks of the shell.
type Kind uint8

const (
	// Apply: decode and index batch Seq, and show Seq as the last applied.
	// The batch is the one just passed to Replayed, or else the live batch
	// in hand (passed to Live, possibly before a replay that just ended).
	Apply Kind = iota + 1
	// Replay: ask the replay ROUTER for the batches from From, pass each to
	// Replayed and the end of the exchange (its error, if any) to
	// ReplayEnd. Only batches in [From, To) are applied. CatchUp: take what
	// the ring holds (To is End).
	Replay
	// ReplayDone: a replay exchange ended with Outcome (count it).
	ReplayDone
	// Gap: the live seqs [From, To) never arrived (count it).
	Gap
	// Restart: a new engine process: clear the endpoint, start epoch Epoch
	// and count a restart; Reason says how it showed.
	Restart
	// Cleared: the engine cleared every block (AllBlocksCleared, which the
	// index applies itself): start epoch Epoch; the state is exact again.
	Cleared
	// MarkPartial: the state may miss blocks from now on (Reason).
	MarkPartial
	// DropHeld: a live batch the shell received before this observation
	// belongs to the old engine process: drop it, unseen by Live and Heard.
	DropHeld
)

func (k Kind) String() string {
	switch k {
	case Apply:
		return "apply"
	case Replay:
		return "replay"
	case ReplayDone:
		return "replay-done"
	case Gap:
		return "gap"
	case Restart:
		return "restart"
	case Cleared:
		return "cleared"
	case MarkPartial:
		return "partial"
	case DropHeld:
		return "drop-held"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Outcome is how a replay exchange went.
type Outcome uint8

const (
	// OK: the ring covered what was asked (for a catch-up, what it held).
	OK Outcome = iota + 1
	// Incomplete: the ring no longer held all of it.
	Incomplete
	// Failed: the exchange failed (error, timeout).
	Failed
)

// String is the outcome's metric label: ok, incomplete or failed.
func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Incomplete:
		return "incomplete"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Action is one thing the shell is to do. Only the fields its Kind names
// are set.
type Action struct {
	Kind     Kind
	Seq      uint64  // Apply
	From, To uint64  // Replay, Gap
	CatchUp  bool    // Replay
	Epoch    uint64  // Restart, Cleared
	Reason   string  // Restart, MarkPartial
	Outcome  Outcome // ReplayDone
}

func (a Action) String() string {
	switch a.Kind {
	case Apply:
		return fmt.Sprintf("apply %d", a.Seq)
	case Replay:
		if a.CatchUp {
			return fmt.Sprintf("catch up from %d", a.From)
		}
		return fmt.Sprintf("replay [%d,%d)", a.From, a.To)
	case ReplayDone:
		return "replay " + a.Outcome.String()
	case Gap:
		return fmt.Sprintf("gap [%d,%d)", a.From, a.To)
	case Restart:
		return fmt.Sprintf("restart epoch %d (%s)", a.Epoch, a.Reason)
	case Cleared:
		return fmt.Sprintf("cleared epoch %d", a.Epoch)
	case MarkPartial:
		return "partial (" + a.Reason + ")"
	}
	return a.Kind.String()
}

// Config configures a Sequencer. Start from DefaultConfig, which holds
// the documented defaults: Validate (New calls it) rejects zero and
// invalid values, and nothing is filled in.
type Config struct {
	// Replay says the engine has a replay ROUTER. Without one nothing is
	// caught up, and a gap marks the state partial. Default true.
	Replay bool
	// IdleCheck: after this long with nothing heard on the live socket,
	// catch up from the ring (live messages lost while the SUB reconnects
	// leave no gap to notice). Default 2 s; must be positive.
	IdleCheck time.Duration
}

// DefaultConfig returns the defaults: replay on, a 2 s idle check.
func DefaultConfig() Config { return Config{Replay: true, IdleCheck: 2 * time.Second} }

// Validate checks c.
func (c Config) Validate() error {
	if c.IdleCheck <= 0 {
		return fmt.Errorf("sequence: idle check %v: want > 0", c.IdleCheck)
	}
	return nil
}

// Sequencer holds one rank's ordering state and applies the rules (see
// the package doc).
type Sequencer struct {
	cfg   Config
	epoch uint64
	// applied is the last seq applied (live or replayed), when haveApplied.
	applied     uint64
	haveApplied bool
	// live is the last seq received live (replays aside), when haveLive:
	// only the live stream going backwards means a new engine process.
	live     uint64
	haveLive bool
	// start is the engine start time the epoch belongs to; 0 after a
	// restart the seqs showed: the next reading is adopted.
	start     float64
	partial   bool
	lastHeard time.Time
	replaying bool
	r         replay // when replaying
}

// replay is the exchange in flight.
type replay struct {
	from, to uint64
	catchUp  bool
	// restsIdle: the end of the exchange restarts the idle clock (the
	// catch-ups of the intake opening and of the idle check).
	restsIdle bool
	seen      bool   // a batch came back
	first     uint64 // the first seq that came back
	got       uint64 // batches that came back inside [from, to)
	// pending: the live batch pendingSeq waits for the end.
	pending    bool
	pendingSeq uint64
}

// New returns a Sequencer whose first epoch is epoch.
func New(cfg Config, epoch uint64) (*Sequencer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Sequencer{cfg: cfg, epoch: epoch}, nil
}

// Epoch returns the current epoch.
func (s *Sequencer) Epoch() uint64 { return s.epoch }

// Applied returns the last seq applied, and false when none has been
// since the start or the last restart.
func (s *Sequencer) Applied() (uint64, bool) { return s.applied, s.haveApplied }

// Partial reports whether the state may miss blocks.
func (s *Sequencer) Partial() bool { return s.partial }

// Replaying reports whether a replay is in flight.
func (s *Sequencer) Replaying() bool { return s.replaying }

// Start observes the intake opening at now: what the engine published
// before is only in its replay ring, so catch up from seq 0.
func (s *Sequencer) Start(now time.Time) []Action {
	acts := s.interrupt(nil)
	s.lastHeard = now
	return s.catchUp(acts, 0, true)
}

// Heard observes a message arriving on the live socket at now, whether or
// not it parses.
func (s *Sequencer) Heard(now time.Time) { s.lastHeard = now }

// Live observes live batch seq. A seq at or below the last live one is a
// new engine process (restart); one applied already is a duplicate
// (nothing to do); one past the next is a gap, replayed first, and then
// the Apply for seq comes with the replay's end.
func (s *Sequencer) Live(seq uint64) []Action {
	acts := s.interrupt(nil)
	have, last := s.haveApplied, s.applied
	haveLive, lastLive := s.haveLive, s.live
	s.haveLive, s.live = true, seq
	switch {
	case haveLive && seq <= lastLive:
		acts = s.restart(acts, ReasonSeqBackwards, true)
		have = false
	case have && seq <= last:
		return acts // already applied through a replay
	}
	switch {
	case have && seq > last+1:
		acts = append(acts, Action{Kind: Gap, From: last + 1, To: seq})
		acts = s.fill(acts, last+1, seq)
	case !have && seq > 0:
		acts = s.fill(acts, 0, seq) // the start of this engine's stream is missing
	}
	if s.replaying {
		s.r.pending, s.r.pendingSeq = true, seq
		return acts
	}
	return s.apply(acts, seq)
}

// Replayed observes batch seq coming back from the replay in flight.
func (s *Sequencer) Replayed(seq uint64) []Action {
	if !s.replaying {
		return nil
	}
	r := &s.r
	if !r.seen {
		r.seen, r.first = true, seq
	}
	if seq < r.from || seq >= r.to {
		return nil
	}
	r.got++
	return s.apply(nil, seq)
}

// ReplayEnd observes the replay in flight ending at now, with err when the
// exchange failed.
func (s *Sequencer) ReplayEnd(now time.Time, err error) []Action {
	if !s.replaying {
		return nil
	}
	return s.endReplay(nil, now, err)
}

// EngineStart observes the engine's process start time as scraped
// (seconds; a reading ≤ 0 says nothing and is ignored).
func (s *Sequencer) EngineStart(start float64) []Action {
	acts := s.interrupt(nil)
	if !(start > 0) {
		return acts
	}
	known := s.start
	s.start = start
	if known == 0 || known == start {
		return acts // the first reading (or the first after a seq restart), or no change
	}
	acts = s.restart(acts, ReasonStartChanged, false)
	acts = s.catchUp(acts, 0, false)
	return append(acts, Action{Kind: DropHeld})
}

// Idle observes a wake-up at now with nothing received: after IdleCheck
// of quiet, catch up from the ring past the last applied seq.
func (s *Sequencer) Idle(now time.Time) []Action {
	acts := s.interrupt(nil)
	if !s.cfg.Replay || now.Sub(s.lastHeard) <= s.cfg.IdleCheck {
		return acts
	}
	from := uint64(0)
	if s.haveApplied {
		from = s.applied + 1
	}
	return s.catchUp(acts, from, true)
}

// Cleared observes an AllBlocksCleared event being applied (the index
// clears itself): a new epoch, and the state is exact again.
func (s *Sequencer) Cleared() []Action {
	s.epoch++
	s.partial = false
	return []Action{{Kind: Cleared, Epoch: s.epoch}}
}

// fill asks for the missing [from, to), which the live batch showing the
// gap waits for; without a replay socket the state is partial.
func (s *Sequencer) fill(acts []Action, from, to uint64) []Action {
	if !s.cfg.Replay {
		return s.markPartial(acts, ReasonNoReplay)
	}
	s.replaying, s.r = true, replay{from: from, to: to}
	return append(acts, Action{Kind: Replay, From: from, To: to})
}

// catchUp asks for whatever the ring holds from `from`; without a replay
// socket there is nothing to do (and no evidence of loss).
func (s *Sequencer) catchUp(acts []Action, from uint64, restsIdle bool) []Action {
	if !s.cfg.Replay {
		return acts
	}
	s.replaying, s.r = true, replay{from: from, to: End, catchUp: true, restsIdle: restsIdle}
	return append(acts, Action{Kind: Replay, From: from, To: End, CatchUp: true})
}

// endReplay judges the exchange in flight. A gap fill must return every
// missing batch from the first; a catch-up takes what the ring holds, but
// a ring whose first batch is past the start asked for has lost some.
func (s *Sequencer) endReplay(acts []Action, now time.Time, err error) []Action {
	r := s.r
	s.replaying, s.r = false, replay{}
	outcome := OK
	switch {
	case err != nil:
		outcome = Failed
		if !r.catchUp {
			acts = s.markPartial(acts, reasonFailedPrefix+err.Error())
		}
	case r.catchUp:
		if r.got > 0 && r.first > r.from {
			outcome = Incomplete
			acts = s.markPartial(acts, ReasonRingLostStart)
		}
	case r.got != r.to-r.from || r.first > r.from:
		outcome = Incomplete
		acts = s.markPartial(acts, ReasonRingLostGap)
	}
	acts = append(acts, Action{Kind: ReplayDone, Outcome: outcome})
	if r.restsIdle {
		s.lastHeard = now
	}
	if r.pending {
		acts = s.apply(acts, r.pendingSeq)
	}
	return acts
}

// interrupt ends a replay still in flight as failed: the shell observed
// something else before reporting its end.
func (s *Sequencer) interrupt(acts []Action) []Action {
	if !s.replaying {
		return acts
	}
	return s.endReplay(acts, s.lastHeard, ErrInterrupted)
}

// restart starts a new epoch for a new engine process. Seen in the seqs,
// the next start time reading is the new process's; seen in the start
// time, the old process's live seq means nothing now.
func (s *Sequencer) restart(acts []Action, why string, bySeq bool) []Action {
	s.epoch++
	s.applied, s.haveApplied, s.partial = 0, false, false
	if bySeq {
		s.start = 0
	} else {
		s.haveLive = false
	}
	return append(acts, Action{Kind: Restart, Epoch: s.epoch, Reason: why})
}

// markPartial marks the state partial, once per partial spell.
func (s *Sequencer) markPartial(acts []Action, why string) []Action {
	if s.partial {
		return acts
	}
	s.partial = true
	return append(acts, Action{Kind: MarkPartial, Reason: why})
}

// apply advances the applied seq; a seq at or below it was applied already.
func (s *Sequencer) apply(acts []Action, seq uint64) []Action {
	if s.haveApplied && seq <= s.applied {
		return acts
	}
	s.applied, s.haveApplied = seq, true
	return append(acts, Action{Kind: Apply, Seq: seq})
}
