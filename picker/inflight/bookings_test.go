package inflight

import (
	"testing"
	"time"
)

func TestBookings(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b, err := NewBookings(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	carried := b.Book("a", 300, true, t0)
	decision := b.Book("a", 200, false, t0)
	if got := b.Prefill("a"); got != 300 {
		t.Fatalf("prefill after a carried and a decision-API booking = %v, want 300 (only the carried one)", got)
	}
	if p := b.Pending("a", time.Time{}, t0); p.Count != 2 || p.Tokens != 500 {
		t.Fatalf("pending = %+v, want 2 picks, 500 tokens", p)
	}
	b.FirstByte(&carried)
	b.FirstByte(&carried) // once only
	if got := b.Prefill("a"); got != 0 {
		t.Fatalf("prefill after the first byte = %v, want 0", got)
	}
	if p := b.Pending("a", time.Time{}, t0); p.Count != 2 {
		t.Fatalf("the first byte ended the ledger record: %+v", p)
	}
	b.Done(&carried)
	b.Done(&decision)
	if p := b.Pending("a", time.Time{}, t0); p.Count != 0 {
		t.Fatalf("pending after both done = %+v", p)
	}

	// A move before the first byte carries the prefill to the fallback.
	m := b.Book("a", 100, true, t0)
	b.Move(&m, "b", 40, t0)
	if b.Prefill("a") != 0 || b.Prefill("b") != 40 || m.Endpoint != "b" {
		t.Fatalf("after a move: a %v, b %v, booking %+v", b.Prefill("a"), b.Prefill("b"), m)
	}
	if p := b.Pending("a", time.Time{}, t0); p.Count != 0 {
		t.Fatalf("the old endpoint still counts the moved pick: %+v", p)
	}
	// After its first byte, a move carries no prefill.
	b.FirstByte(&m)
	b.Move(&m, "c", 40, t0)
	if b.Prefill("c") != 0 || b.Pending("c", time.Time{}, t0).Count != 1 {
		t.Fatalf("a move after the first byte: prefill %v, pending %+v", b.Prefill("c"), b.Pending("c", time.Time{}, t0))
	}
	// A booking with nothing uncached carries no prefill.
	z := b.Book("d", 0, true, t0)
	if z.Prefill != 0 || b.Prefill("d") != 0 {
		t.Fatalf("a fully cached pick counted prefill: %+v", z)
	}
}

// TestPendingCountsAwaiting: Pending carries the carried picks before
// their first output token, reported or not, and their tokens; a first
// byte does not end one (a Responses stream opens before its prefill), a
// first token or the end does.
func TestPendingCountsAwaiting(t *testing.T) {
	b, err := NewBookings(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(100, 0)
	x := b.Book("e", 1000, true, t0)
	y := b.Book("e", 500, true, t0)
	b.Book("e", 700, false, t0)                                     // a decision API pick: not carried
	p := b.Pending("e", t0.Add(time.Second), t0.Add(2*time.Second)) // a report covers all three
	if p.Count != 0 || p.AwaitCount != 2 || p.AwaitTokens != 1500 {
		t.Fatalf("covered: %+v, want no uncovered pick and 2 carried (1,500 tokens) before their first token", p)
	}
	b.FirstByte(&x)
	if p := b.Pending("e", t0, t0); p.AwaitCount != 2 {
		t.Fatalf("a first byte ended a wait for the first token: %+v", p)
	}
	b.FirstToken(&x)
	b.FirstToken(&x) // once
	if p := b.Pending("e", t0, t0); p.AwaitCount != 1 || p.AwaitTokens != 500 {
		t.Fatalf("after one first token: %+v", p)
	}
	b.Move(&y, "f", 300, t0)
	if p := b.Pending("f", t0, t0); p.AwaitCount != 1 || p.AwaitTokens != 300 || b.Pending("e", t0, t0).AwaitCount != 0 {
		t.Fatalf("after a move: %+v", p)
	}
	b.Done(&y)
	if p := b.Pending("f", t0, t0); p.AwaitCount != 0 {
		t.Fatalf("after the end: %+v", p)
	}
}

// TestHold: a carried pick holds its prompt's block keys on its endpoint
// until its first output token — a sibling finds their leading run there
// — and a move carries the hold; a pick not carried holds nothing.
func TestHold(t *testing.T) {
	b, err := NewBookings(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(100, 0)
	x := b.Book("e", 1000, true, t0)
	b.Hold(&x, []uint64{1, 2, 3})
	y := b.Book("e", 1000, true, t0)
	b.Hold(&y, []uint64{1, 2, 9})
	api := b.Book("e", 10, false, t0)
	b.Hold(&api, []uint64{7})
	for _, tc := range []struct {
		chain []uint64
		want  int
	}{
		{[]uint64{1, 2, 3, 4}, 3}, {[]uint64{1, 2, 9}, 3}, {[]uint64{1, 5}, 1}, {[]uint64{4, 2}, 0}, {[]uint64{7}, 0}, {nil, 0},
	} {
		if got := b.HeldPrefix("e", tc.chain); got != tc.want {
			t.Errorf("held prefix of %v: %d, want %d", tc.chain, got, tc.want)
		}
	}
	b.FirstToken(&x)
	if got := b.HeldPrefix("e", []uint64{1, 2, 3}); got != 2 {
		t.Errorf("after x's first token: %d held, want 2 (y's)", got)
	}
	b.Move(&y, "f", 500, t0)
	if b.HeldPrefix("e", []uint64{1}) != 0 || b.HeldPrefix("f", []uint64{1, 2, 9}) != 3 {
		t.Errorf("after a move: e %d, f %d", b.HeldPrefix("e", []uint64{1}), b.HeldPrefix("f", []uint64{1, 2, 9}))
	}
	b.Done(&y)
	if b.HeldPrefix("f", []uint64{1}) != 0 || len(b.held) != 0 {
		t.Errorf("after the end: %v still held", b.held)
	}
}

// TestPullsOut counts the carried picks pulling from a source until their
// first output token, whichever ends them; a pick not carried pulls
// nothing here; a move keeps the pull unless it moves onto the source.
func TestPullsOut(t *testing.T) {
	b, _ := NewBookings(DefaultConfig())
	t0 := time.Unix(100, 0)
	x := b.Book("a", 1000, true, t0)
	b.Pull(&x, "s")
	y := b.Book("b", 1000, true, t0)
	b.Pull(&y, "s")
	b.Pull(&y, "s") // once per booking
	api := b.Book("c", 10, false, t0)
	b.Pull(&api, "s")
	z := b.Book("c", 1000, true, t0)
	b.Pull(&z, "r")
	out := func(e string) int { return b.Pending(e, time.Time{}, t0).PullsOut }
	if out("s") != 2 || out("r") != 1 || out("a") != 0 {
		t.Fatalf("pulls out: s %d, r %d, a %d; want 2, 1, 0", out("s"), out("r"), out("a"))
	}
	b.FirstToken(&x)
	b.Done(&y)
	if out("s") != 0 {
		t.Errorf("after first token and done: s %d, want 0", out("s"))
	}
	b.Move(&z, "d", 500, t0)
	if out("r") != 1 || z.Source != "r" {
		t.Errorf("a moved pick keeps its pull: r %d, source %q", out("r"), z.Source)
	}
	b.Move(&z, "r", 500, t0)
	if out("r") != 0 {
		t.Errorf("a pick moved onto its source pulls nothing: r %d", out("r"))
	}
	if len(b.pulls) != 0 {
		t.Errorf("left over: %v", b.pulls)
	}
}
