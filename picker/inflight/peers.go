package inflight

import (
	"cmp"
	"container/heap"
	"slices"
	"time"
)

// OpKind is what a booking operation does.
type OpKind uint8

// The operations a picker shares of its bookings (Bookings.TakeJournal)
// and applies of another's (Bookings.Apply).
const (
	// OpAdd is a pick: Endpoint, Uncached, Carried, At, Predicted, and
	// Source when it already pulls (Bookings.Live).
	OpAdd OpKind = iota + 1
	// OpPull: the pick pulls its prefix from Source.
	OpPull
	// OpFirstByte: its first byte came (its prefill in flight ends).
	OpFirstByte
	// OpFirstToken: its first output token came (its wait, and its pull,
	// end).
	OpFirstToken
	// OpDone: it ended.
	OpDone
)

// Op is one change to a picker's bookings, as shared with its peers.
type Op struct {
	Kind OpKind
	// ID names the booking among its picker's (unique per picker and
	// run).
	ID uint64
	// Endpoint, Uncached and Carried are an OpAdd's pick: where, its
	// uncached prompt tokens, and whether the picker carries it to the
	// engine (a decision-API pick is not carried: it counts only until a
	// load report covers it).
	Endpoint string
	Uncached float64
	Carried  bool
	// At is when the pick was made: on the sender's clock out of
	// TakeJournal and Live, on the receiver's in Apply (the shell
	// translates by the pick's age).
	At time.Time
	// Predicted is the pick's predicted prefill, seconds (0: none
	// predicted): shown, not priced (the receiver prices the tokens with
	// its own model).
	Predicted float64
	// Source is an OpPull's source endpoint, or an OpAdd's out of Live
	// (the pick already pulls).
	Source string
	// FirstByte and FirstToken mark an OpAdd out of Live whose first
	// byte, first output token, came already.
	FirstByte, FirstToken bool
}

// PeerLimit bounds the bookings held of one peer: its adds past it are
// ignored (a peer's burst beyond it is priced by the engines' reports).
const PeerLimit = 1 << 17

// JournalLimit bounds the operations kept for TakeJournal; past it the
// journal is dropped and TakeJournal says so (the shell then sends its
// peers Live again).
const JournalLimit = 1 << 16

// PeerStat is what a picker holds of one peer's bookings.
type PeerStat struct {
	// Live are its bookings counted here now; Awaiting those of them
	// before their first output token, and AwaitTokens their uncached
	// tokens; Predicted the sum of their predicted prefills (seconds).
	Live, Awaiting          int
	AwaitTokens, Predicted  float64
	Applied, Added, Expired uint64 // operations applied; picks added; carried picks expired before their first token (releases lost)
}

// Journal turns the journal of this picker's own bookings on or off
// (off drops it). On, every change to a booking made here (not Apply's)
// is kept for TakeJournal, and the live ones for Live.
func (b *Bookings) Journal(on bool) {
	b.journalOn = on
	b.journal, b.overflow = nil, false
	b.live = nil
	if on {
		b.live = map[uint64]*Op{}
	}
}

// TakeJournal returns the operations on this picker's own bookings since
// the last call, oldest first, and empties the journal; overflow: some
// were dropped (more than JournalLimit), so a peer must be sent Live
// instead. It also forgets live picks not carried once Forget has passed
// (nothing ends them: a load report covers them).
func (b *Bookings) TakeJournal(now time.Time) (ops []Op, overflow bool) {
	ops, overflow = b.journal, b.overflow
	b.journal, b.overflow = nil, false
	for len(b.liveLoose) > 0 && now.Sub(b.liveLoose[0].at) > b.ledger.cfg.Forget {
		delete(b.live, b.liveLoose[0].id)
		b.liveLoose = b.liveLoose[1:]
	}
	return ops, overflow
}

// Live is this picker's own bookings that count now, each as an OpAdd
// with its state (Source, FirstByte, FirstToken): what a peer that starts
// following this picker is sent first. Nil unless journaling.
func (b *Bookings) Live() []Op {
	if b.live == nil {
		return nil
	}
	out := make([]Op, 0, len(b.live))
	for _, op := range b.live {
		out = append(out, *op)
	}
	sortOps(out)
	return out
}

// journalOp records op when journaling and bk is this picker's own.
func (b *Bookings) journalOp(bk *Booking, op Op) {
	if !b.journalOn || bk.peer != "" {
		return
	}
	op.ID = bk.send
	if len(b.journal) >= JournalLimit {
		b.journal, b.overflow = nil, true
	}
	if !b.overflow {
		b.journal = append(b.journal, op)
	}
	switch op.Kind {
	case OpAdd:
		c := op
		b.live[op.ID] = &c
		if !op.Carried {
			b.liveLoose = append(b.liveLoose, looseAdd{id: op.ID, at: op.At})
		}
	case OpDone:
		delete(b.live, op.ID)
	default:
		if l := b.live[op.ID]; l != nil {
			switch op.Kind {
			case OpPull:
				l.Source = op.Source
			case OpFirstByte:
				l.FirstByte = true
			case OpFirstToken:
				l.FirstToken, l.Source = true, ""
			}
		}
	}
}

// Predict records bk's predicted prefill (seconds) for its peers; it
// changes nothing here.
func (b *Bookings) Predict(bk *Booking, seconds float64) {
	if l := b.live[bk.send]; l != nil && bk.peer == "" {
		l.Predicted = seconds
	}
	for i := len(b.journal) - 1; i >= 0 && i >= len(b.journal)-4; i-- {
		if op := &b.journal[i]; op.ID == bk.send && op.Kind == OpAdd {
			op.Predicted = seconds
			return
		}
	}
}

// Apply applies peer's operations, received at now, to the bookings
// counted here: its picks count as this picker's do (Pending's Count and
// Tokens until a load report covers them, AwaitCount and AwaitTokens
// before their first output token, PullsOut, Prefill), until released or
// until Config.PeerLifetime has passed since the pick was made. An OpAdd
// for a booking held already, or an operation on one not held (its add
// was lost, or it expired), is ignored; so a peer's Live may be applied
// over what its journal already gave.
func (b *Bookings) Apply(peer string, ops []Op, now time.Time) {
	b.Expire(now)
	m := b.peers[peer]
	if m == nil {
		m = map[uint64]*Booking{}
		b.peers[peer] = m
	}
	st := b.stat(peer)
	for _, op := range ops {
		st.Applied++
		if op.Kind == OpAdd {
			expires := op.At.Add(b.ledger.cfg.PeerLifetime)
			if m[op.ID] != nil || op.Endpoint == "" || !expires.After(now) || len(m) >= PeerLimit {
				continue
			}
			bk := b.book(op.Endpoint, op.Uncached, op.Carried, op.At)
			bk.peer, bk.predicted = peer, op.Predicted
			m[op.ID] = &bk
			st.Added++
			heap.Push(&b.expiries, expiry{at: expires, peer: peer, id: op.ID})
			if op.Source != "" && !op.FirstToken {
				b.Pull(&bk, op.Source)
			}
			if op.FirstByte || op.FirstToken {
				b.FirstByte(&bk)
			}
			if op.FirstToken {
				b.FirstToken(&bk)
			}
			continue
		}
		bk := m[op.ID]
		if bk == nil {
			continue
		}
		switch op.Kind {
		case OpPull:
			b.Pull(bk, op.Source)
		case OpFirstByte:
			b.FirstByte(bk)
		case OpFirstToken:
			b.FirstByte(bk)
			b.FirstToken(bk)
		case OpDone:
			b.Done(bk)
			delete(m, op.ID)
		}
	}
}

// Expire drops the peers' bookings whose lifetime has passed at now
// (Config.PeerLifetime from their pick), and returns how many of them
// still awaited their first output token: releases that were lost, now
// no longer counted.
func (b *Bookings) Expire(now time.Time) (phantoms int) {
	for len(b.expiries) > 0 && !b.expiries[0].at.After(now) {
		x := heap.Pop(&b.expiries).(expiry)
		bk := b.peers[x.peer][x.id]
		if bk == nil {
			continue
		}
		if bk.awaiting {
			phantoms++
			b.stat(x.peer).Expired++
		}
		b.Done(bk)
		delete(b.peers[x.peer], x.id)
	}
	return phantoms
}

// DropPeer forgets every booking of peer (it left the fleet, or
// restarted and sends its live bookings again) and, with forget, its
// figures too.
func (b *Bookings) DropPeer(peer string, forget bool) {
	for id, bk := range b.peers[peer] {
		b.Done(bk)
		delete(b.peers[peer], id)
	}
	if forget {
		delete(b.peers, peer)
		delete(b.peerStats, peer)
	}
}

// Peers is, per peer applied, what is held of its bookings now.
func (b *Bookings) Peers() map[string]PeerStat {
	out := make(map[string]PeerStat, len(b.peerStats))
	for peer, st := range b.peerStats {
		s := *st
		for _, bk := range b.peers[peer] {
			s.Live++
			s.Predicted += bk.predicted
			if bk.awaiting {
				s.Awaiting++
				s.AwaitTokens += bk.Await
			}
		}
		out[peer] = s
	}
	return out
}

func (b *Bookings) stat(peer string) *PeerStat {
	st := b.peerStats[peer]
	if st == nil {
		st = &PeerStat{}
		b.peerStats[peer] = st
	}
	return st
}

// looseAdd is a live pick not carried, forgotten after Forget.
type looseAdd struct {
	id uint64
	at time.Time
}

// expiry is when a peer's booking stops counting.
type expiry struct {
	at   time.Time
	peer string
	id   uint64
}

// expiries is a min-heap of expiry by time (then peer and id, so that
// expiries at one instant go in a stable order).
type expiries []expiry

func (h expiries) Len() int { return len(h) }
func (h expiries) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	if h[i].peer != h[j].peer {
		return h[i].peer < h[j].peer
	}
	return h[i].id < h[j].id
}
func (h expiries) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *expiries) Push(x any)   { *h = append(*h, x.(expiry)) }
func (h *expiries) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// sortOps orders ops by ID (Live's map order is random).
func sortOps(ops []Op) {
	slices.SortFunc(ops, func(a, b Op) int { return cmp.Compare(a.ID, b.ID) })
}
