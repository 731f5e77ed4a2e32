package inflight

import (
	"testing"
	"time"
)

// TestPeerBookings: a peer's journal, applied here, counts as this
// picker's own picks do, and its releases end them.
func TestPeerBookings(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a, _ := NewBookings(DefaultConfig())
	b, _ := NewBookings(DefaultConfig())
	a.Journal(true)
	x := a.Book("e", 1000, true, t0)
	a.Predict(&x, 0.2)
	a.Pull(&x, "s")
	a.Book("e", 300, false, t0) // a decision-API pick
	ops, over := a.TakeJournal(t0)
	if over || len(ops) != 3 || ops[0].Kind != OpAdd || ops[0].Predicted != 0.2 || ops[1].Kind != OpPull || ops[2].Carried {
		t.Fatalf("journal = %+v (overflow %v)", ops, over)
	}
	b.Apply("a", ops, t0)
	p := b.Pending("e", time.Time{}, t0)
	if p.Count != 2 || p.Tokens != 1300 || p.AwaitCount != 1 || p.AwaitTokens != 1000 || b.Pending("s", time.Time{}, t0).PullsOut != 1 || b.Prefill("e") != 1000 {
		t.Fatalf("b holds %+v, pulls out of s %d, prefill %v", p, b.Pending("s", time.Time{}, t0).PullsOut, b.Prefill("e"))
	}
	if st := b.Peers()["a"]; st.Live != 2 || st.Awaiting != 1 || st.Predicted != 0.2 || st.Added != 2 {
		t.Fatalf("peer figures %+v", st)
	}
	// A report after the picks covers them (and drops them from the
	// ledger); the carried one awaits still.
	if p := b.Pending("e", t0.Add(time.Millisecond), t0.Add(2*time.Millisecond)); p.Count != 0 || p.AwaitCount != 1 {
		t.Fatalf("after a report: %+v", p)
	}
	a.FirstToken(&x)
	a.Done(&x)
	ops, _ = a.TakeJournal(t0)
	b.Apply("a", ops, t0.Add(time.Second))
	if p := b.Pending("e", time.Time{}, t0.Add(time.Second)); p.AwaitCount != 0 || p.Count != 0 || b.Pending("s", time.Time{}, t0).PullsOut != 0 || b.Prefill("e") != 0 {
		t.Fatalf("after the release: %+v", p)
	}
	// What b holds of a is never shared on: b journals its own picks only.
	b.Journal(true)
	b.Apply("a", []Op{{Kind: OpAdd, ID: 99, Endpoint: "e", Uncached: 5, Carried: true, At: t0}}, t0)
	if ops, _ := b.TakeJournal(t0); len(ops) != 0 {
		t.Fatalf("b journalled a's booking: %+v", ops)
	}
}

// TestPeerBookingsLost: a lost release leaves no phantom past the
// lifetime; a release whose add was lost changes nothing; a peer's Live
// applied over its journal counts each pick once.
func TestPeerBookingsLost(t *testing.T) {
	t0 := time.Unix(1000, 0)
	cfg := DefaultConfig()
	cfg.PeerLifetime = 10 * time.Second
	a, _ := NewBookings(cfg)
	b, _ := NewBookings(cfg)
	a.Journal(true)
	x := a.Book("e", 800, true, t0)
	a.Book("e", 100, false, t0)
	ops, _ := a.TakeJournal(t0)
	b.Apply("a", ops, t0)
	a.Done(&x)
	a.TakeJournal(t0) // the release is lost
	if n := b.Expire(t0.Add(9 * time.Second)); n != 0 || b.Pending("e", t0, t0).AwaitCount != 1 {
		t.Fatalf("expired before the lifetime: %d", n)
	}
	if n := b.Expire(t0.Add(10 * time.Second)); n != 1 {
		t.Fatalf("phantoms expired at the lifetime = %d, want 1 (the uncarried pick is not one)", n)
	}
	if p := b.Pending("e", time.Time{}, t0.Add(10*time.Second)); p != (Pending{}) {
		t.Fatalf("after the lifetime: %+v", p)
	}
	if st := b.Peers()["a"]; st.Expired != 1 || st.Live != 0 {
		t.Fatalf("peer figures %+v", st)
	}

	// A lost add: its release and its first token are ignored.
	y := a.Book("f", 500, true, t0)
	a.TakeJournal(t0) // lost
	a.FirstToken(&y)
	a.Done(&y)
	ops, _ = a.TakeJournal(t0)
	b.Apply("a", ops, t0)
	if p := b.Pending("f", time.Time{}, t0); p != (Pending{}) {
		t.Fatalf("a release without its add: %+v", p)
	}

	// An add too old to count is not added.
	b.Apply("a", []Op{{Kind: OpAdd, ID: 500, Endpoint: "g", Uncached: 1, Carried: true, At: t0}}, t0.Add(11*time.Second))
	if p := b.Pending("g", time.Time{}, t0.Add(11*time.Second)); p != (Pending{}) {
		t.Fatalf("an expired add counted: %+v", p)
	}

	// Live over the journal: once each, with the state it reached.
	z := a.Book("h", 200, true, t0)
	a.Pull(&z, "s")
	a.FirstByte(&z)
	w := a.Book("h", 300, true, t0)
	a.FirstToken(&w)
	ops, _ = a.TakeJournal(t0)
	c, _ := NewBookings(cfg)
	c.Apply("a", ops, t0)
	c.Apply("a", a.Live(), t0)
	if p := c.Pending("h", time.Time{}, t0); p.Count != 2 || p.AwaitCount != 1 || p.AwaitTokens != 200 || c.Pending("s", time.Time{}, t0).PullsOut != 1 || c.Prefill("h") != 0 {
		t.Fatalf("journal then Live: %+v", p)
	}
	d, _ := NewBookings(cfg)
	d.Apply("a", a.Live(), t0)
	if p, q := d.Pending("h", time.Time{}, t0), c.Pending("h", time.Time{}, t0); p != q {
		t.Fatalf("Live alone %+v, journal and Live %+v", p, q)
	}
	d.DropPeer("a", true)
	if p := d.Pending("h", time.Time{}, t0); p != (Pending{}) || len(d.Peers()) != 0 {
		t.Fatalf("after dropping the peer: %+v", p)
	}
}

// TestJournalBounds: an overflowing journal says so, and live picks not
// carried are forgotten after Forget.
func TestJournalBounds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a, _ := NewBookings(DefaultConfig())
	a.Journal(true)
	for i := 0; i <= JournalLimit; i++ {
		a.Book("e", 1, false, t0)
	}
	if ops, over := a.TakeJournal(t0); !over || len(ops) != 0 {
		t.Fatalf("overflow %v with %d ops", over, len(ops))
	}
	if n := len(a.Live()); n != JournalLimit+1 {
		t.Fatalf("live %d", n)
	}
	a.TakeJournal(t0.Add(31 * time.Second))
	if n := len(a.Live()); n != 0 {
		t.Fatalf("live after Forget: %d", n)
	}
	a.Journal(false)
	a.Book("e", 1, true, t0)
	if ops, _ := a.TakeJournal(t0); ops != nil || a.Live() != nil {
		t.Fatal("journal off still records")
	}
}
