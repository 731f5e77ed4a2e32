package inflight

import "time"

// Bookings are a picker's picks in flight, everything its decisions and
// its admission count of them: the Ledger (picks no load report covers
// yet) and, per endpoint, the prefill work of the picks the picker
// carries to the engine (a proxied request, the endpoint picker's) until
// their first byte. It is not safe for concurrent use.
type Bookings struct {
	ledger   *Ledger
	prefill  map[string]float64        // endpoint → uncached prompt tokens of carried picks before their first byte
	prefillN map[string]int            // endpoint → how many such picks
	await    map[string]float64        // endpoint → uncached prompt tokens of carried picks before their first output token
	awaitN   map[string]int            // endpoint → how many such picks
	held     map[string]map[uint64]int // endpoint → block key → such picks whose prompt has it
	pulls    map[string]int            // source endpoint → carried picks pulling from it before their first output token

	// This picker's own bookings as shared with its peers (peers.go).
	journalOn bool
	journal   []Op
	overflow  bool
	live      map[uint64]*Op // this picker's bookings that count, by ID, as Live sends them
	liveLoose []looseAdd     // the live picks not carried, oldest first
	// The peers' bookings applied here (peers.go).
	peers     map[string]map[uint64]*Booking
	peerStats map[string]*PeerStat
	expiries  expiries
}

// Booking is one pick as booked: where, its Ledger record, and the
// prefill it counts until its first byte (zero: none, or ended).
type Booking struct {
	Endpoint string
	send     uint64
	Prefill  float64
	// Await is the uncached prompt a carried pick counts until its first
	// output token (FirstToken), and awaiting whether it still does.
	Await    float64
	awaiting bool
	chain    []uint64 // its prompt's block keys, held until its first output token (Hold)
	// Source is the endpoint the pick pulls its prefix from (Pull), until
	// its first output token; "" for none.
	Source string
	// peer is the picker a booking applied from another picker's is of
	// ("": this picker's own), and predicted the prefill it predicted.
	peer      string
	predicted float64
}

// NewBookings returns empty bookings; cfg is the Ledger's.
func NewBookings(cfg Config) (*Bookings, error) {
	l, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Bookings{ledger: l, prefill: map[string]float64{}, prefillN: map[string]int{}, await: map[string]float64{}, awaitN: map[string]int{},
		held: map[string]map[uint64]int{}, pulls: map[string]int{}, peers: map[string]map[uint64]*Booking{}, peerStats: map[string]*PeerStat{}}, nil
}

// Book records a pick of endpoint at now with uncached prompt tokens; a
// carried pick's tokens also count as prefill in flight until FirstByte
// or Done.
func (b *Bookings) Book(endpoint string, uncached float64, carried bool, now time.Time) Booking {
	bk := b.book(endpoint, uncached, carried, now)
	b.journalOp(&bk, Op{Kind: OpAdd, Endpoint: endpoint, Uncached: max(uncached, 0), Carried: carried, At: now})
	return bk
}

func (b *Bookings) book(endpoint string, uncached float64, carried bool, now time.Time) Booking {
	bk := Booking{Endpoint: endpoint, send: b.ledger.Record(endpoint, uncached, now)}
	if carried {
		bk.Await, bk.awaiting = max(uncached, 0), true
		b.await[endpoint] += bk.Await
		b.awaitN[endpoint]++
	}
	if carried && uncached > 0 {
		bk.Prefill = uncached
		b.prefill[endpoint] += uncached
		b.prefillN[endpoint]++
	}
	return bk
}

// FirstByte ends bk's prefill in flight: its first byte came (or it
// ended). Once per booking: a second call does nothing.
func (b *Bookings) FirstByte(bk *Booking) {
	if b.firstByte(bk) {
		b.journalOp(bk, Op{Kind: OpFirstByte})
	}
}

func (b *Bookings) firstByte(bk *Booking) bool {
	if bk.Prefill <= 0 {
		return false
	}
	if left := b.prefill[bk.Endpoint] - bk.Prefill; left > 0.5 && b.prefillN[bk.Endpoint] > 1 {
		b.prefill[bk.Endpoint] = left
		b.prefillN[bk.Endpoint]--
	} else {
		delete(b.prefill, bk.Endpoint)
		delete(b.prefillN, bk.Endpoint)
	}
	bk.Prefill = 0
	return true
}

// Hold records the block keys of a carried pick's prompt as about to be
// cached on its endpoint: once it is prefilled there, a request with the
// same prefix finds them, though no KV event has said so yet. They are
// held until its first output token (by then the engine has stored them
// and says so), or its end. A pick not carried, or already past its first
// token, holds nothing.
func (b *Bookings) Hold(bk *Booking, chain []uint64) {
	if !bk.awaiting || bk.chain != nil || len(chain) == 0 {
		return
	}
	bk.chain = chain
	m := b.held[bk.Endpoint]
	if m == nil {
		m = make(map[uint64]int, len(chain))
		b.held[bk.Endpoint] = m
	}
	for _, k := range chain {
		m[k]++
	}
}

// HeldPrefix is how many leading keys of chain the carried picks to
// endpoint before their first output token hold (Hold). Block keys are
// chained (a block's key covers every block before it), so a set of them
// answers for prefixes.
func (b *Bookings) HeldPrefix(endpoint string, chain []uint64) int {
	m := b.held[endpoint]
	if m == nil {
		return 0
	}
	n := 0
	for n < len(chain) && m[chain[n]] > 0 {
		n++
	}
	return n
}

func (b *Bookings) release(bk *Booking) {
	m := b.held[bk.Endpoint]
	for _, k := range bk.chain {
		if m[k]--; m[k] <= 0 {
			delete(m, k)
		}
	}
	if len(m) == 0 {
		delete(b.held, bk.Endpoint)
	}
	bk.chain = nil
}

// Pull records that a carried pick pulls its prefix from source's CPU
// tier: the pull runs before its first output token, and until then it
// shares source's link with the other pulls from it (Pending's
// PullsOut). A pick not carried, past its first token, or already
// pulling is left alone.
func (b *Bookings) Pull(bk *Booking, source string) {
	if !bk.awaiting || bk.Source != "" || source == "" {
		return
	}
	bk.Source = source
	b.pulls[source]++
	b.journalOp(bk, Op{Kind: OpPull, Source: source})
}

// FirstToken ends bk's wait for its first output token (a stream's
// first byte may come before it: a Responses stream opens with
// response.created), and its hold on its prompt's blocks. Once per
// booking.
func (b *Bookings) FirstToken(bk *Booking) {
	if b.firstToken(bk) {
		b.journalOp(bk, Op{Kind: OpFirstToken})
	}
}

func (b *Bookings) firstToken(bk *Booking) bool {
	if !bk.awaiting {
		return false
	}
	b.release(bk)
	bk.awaiting = false
	if bk.Source != "" {
		if b.pulls[bk.Source]--; b.pulls[bk.Source] <= 0 {
			delete(b.pulls, bk.Source)
		}
		bk.Source = ""
	}
	if b.awaitN[bk.Endpoint] > 1 {
		b.await[bk.Endpoint] = max(0, b.await[bk.Endpoint]-bk.Await)
		b.awaitN[bk.Endpoint]--
	} else {
		delete(b.await, bk.Endpoint)
		delete(b.awaitN, bk.Endpoint)
	}
	return true
}

// Done ends bk: its request finished.
func (b *Bookings) Done(bk *Booking) {
	b.ledger.Done(bk.Endpoint, bk.send)
	b.firstByte(bk)
	b.firstToken(bk)
	b.journalOp(bk, Op{Kind: OpDone})
}

// Move moves bk to endpoint, with that endpoint's uncached tokens, at
// now: a gateway reports that a fallback served the request. Its prefill
// in flight moves with it only while it had one (before its first byte),
// its wait for a first token only while it waited.
func (b *Bookings) Move(bk *Booking, endpoint string, uncached float64, now time.Time) {
	prefill, awaiting, chain, source := bk.Prefill > 0, bk.awaiting, bk.chain, bk.Source
	b.Done(bk)
	*bk = b.Book(endpoint, uncached, awaiting, now)
	if !prefill {
		b.FirstByte(bk)
	}
	b.Hold(bk, chain)
	if source != endpoint {
		b.Pull(bk, source)
	}
}

// Pending is what endpoint has in flight at now from this picker, given
// its last load report arrived at reported (Ledger.Pending), with the
// carried picks still before their first output token (AwaitCount,
// AwaitTokens), reported or not, and the pulls from its CPU tier those
// picks make elsewhere (PullsOut).
func (b *Bookings) Pending(endpoint string, reported, now time.Time) Pending {
	p := b.ledger.Pending(endpoint, reported, now)
	p.AwaitCount, p.AwaitTokens = b.awaitN[endpoint], b.await[endpoint]
	p.PullsOut = b.pulls[endpoint]
	return p
}

// Busy calls fn once for each endpoint whose Pending may be other than
// zero (the others' is zero whatever the times), in no particular order,
// and returns how many it called: a caller asking about many endpoints
// asks Pending of these alone. fn must not change b.
func (b *Bookings) Busy(fn func(endpoint string)) int {
	n := 0
	for e := range b.ledger.sends {
		fn(e)
		n++
	}
	for e := range b.awaitN {
		if _, seen := b.ledger.sends[e]; !seen {
			fn(e)
			n++
		}
	}
	for e := range b.await {
		_, seen := b.ledger.sends[e]
		if _, counted := b.awaitN[e]; !seen && !counted {
			fn(e)
			n++
		}
	}
	for e := range b.pulls {
		_, seen := b.ledger.sends[e]
		_, counted := b.awaitN[e]
		if _, tokens := b.await[e]; !seen && !counted && !tokens {
			fn(e)
			n++
		}
	}
	return n
}

// BusyAtMost bounds how many endpoints Busy calls: cheap, for choosing
// between asking Busy's endpoints and asking every endpoint of a group.
func (b *Bookings) BusyAtMost() int {
	return len(b.ledger.sends) + len(b.awaitN) + len(b.await) + len(b.pulls)
}

// Holding calls fn once for each endpoint whose HeldPrefix may be other
// than zero, in no particular order. fn must not change b.
func (b *Bookings) Holding(fn func(endpoint string)) {
	for e := range b.held {
		fn(e)
	}
}

// HoldingAtMost is how many endpoints Holding calls.
func (b *Bookings) HoldingAtMost() int { return len(b.held) }

// Prefill is the prefill work of the carried picks to endpoint before
// their first byte.
func (b *Bookings) Prefill(endpoint string) float64 { return b.prefill[endpoint] }
