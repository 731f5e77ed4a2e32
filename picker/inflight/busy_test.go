package inflight

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestBusyCoversPending: over random bookings, moves, pulls, holds,
// releases and a peer's applied journal, every endpoint Busy does not
// name has a zero Pending at any report time, and every one Holding does
// not name holds no prefix; each is named once. A decision asks only the
// named endpoints (picker/bookings.go), so a miss here would hide load or
// a held prefix from it.
func TestBusyCoversPending(t *testing.T) {
	t0 := time.Unix(1000, 0)
	eps := make([]string, 12)
	for i := range eps {
		eps[i] = fmt.Sprintf("e%d", i)
	}
	chain := []uint64{11, 12, 13, 14}
	for seed := uint64(1); seed <= 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		b, _ := NewBookings(DefaultConfig())
		peer, _ := NewBookings(DefaultConfig())
		peer.Journal(true)
		var live []*Booking
		now := t0
		for step := 0; step < 200; step++ {
			now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
			ep := eps[rng.IntN(len(eps))]
			switch op := rng.IntN(9); {
			case op < 3:
				bk := b.Book(ep, float64(rng.IntN(1000)), rng.IntN(4) > 0, now)
				if rng.IntN(2) == 0 {
					b.Hold(&bk, chain[:1+rng.IntN(len(chain))])
				}
				live = append(live, &bk)
			case op == 3 && len(live) > 0:
				b.Pull(live[rng.IntN(len(live))], eps[rng.IntN(len(eps))])
			case op == 4 && len(live) > 0:
				b.FirstByte(live[rng.IntN(len(live))])
			case op == 5 && len(live) > 0:
				b.FirstToken(live[rng.IntN(len(live))])
			case op == 6 && len(live) > 0:
				i := rng.IntN(len(live))
				b.Done(live[i])
				live = append(live[:i], live[i+1:]...)
			case op == 7 && len(live) > 0:
				b.Move(live[rng.IntN(len(live))], ep, float64(rng.IntN(500)), now)
			case op == 8:
				x := peer.Book(ep, float64(rng.IntN(1000)), true, now)
				if rng.IntN(2) == 0 {
					peer.Pull(&x, eps[rng.IntN(len(eps))])
				}
				if rng.IntN(3) == 0 {
					peer.Done(&x)
				}
				ops, _ := peer.TakeJournal(now)
				b.Apply("peer", ops, now)
			}
			b.Expire(now)
			busy, holding := map[string]int{}, map[string]int{}
			n := b.Busy(func(e string) { busy[e]++ })
			b.Holding(func(e string) { holding[e]++ })
			if n != len(busy) || n > b.BusyAtMost() || len(holding) > b.HoldingAtMost() {
				t.Fatalf("seed %d step %d: Busy returned %d, named %d, at most %d; Holding named %d, at most %d", seed, step, n, len(busy), b.BusyAtMost(), len(holding), b.HoldingAtMost())
			}
			for e, c := range busy {
				if c != 1 {
					t.Fatalf("seed %d step %d: Busy named %s %d times", seed, step, e, c)
				}
			}
			for _, e := range eps {
				if busy[e] == 0 {
					for _, reported := range []time.Time{{}, now.Add(-time.Second), now} {
						if p := b.Pending(e, reported, now); p != (Pending{}) {
							t.Fatalf("seed %d step %d: %s not named by Busy has %+v (reported %v)", seed, step, e, p, reported)
						}
					}
				}
				if holding[e] == 0 && b.HeldPrefix(e, chain) != 0 {
					t.Fatalf("seed %d step %d: %s not named by Holding holds %d keys", seed, step, e, b.HeldPrefix(e, chain))
				}
			}
		}
	}
}
