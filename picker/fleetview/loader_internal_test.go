package fleetview

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/test/testnet"
)

// TestLoaderLaps: loads handed over while a load of the same index is
// being written join its lap rather than wait for it to end — one lap
// for them all, whatever their row words — one per slot (a later load of
// a slot joins once the earlier, which it overtakes, has left); a load
// whose stream ended is dropped, its slot absent; an overtaken load is
// answered ErrAbandoned; every other slot ends holding exactly its
// snapshot.
func TestLoaderLaps(t *testing.T) {
	p := summary.ForCapacity(65536) // 16Ki words: a lap of 16 steps for one row word
	f, err := summary.NewFleet(p, 128)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // the view's lock
	var sizesMu sync.Mutex
	var sizes []int
	ld := newLoader(&mu, func(n int) { sizesMu.Lock(); sizes = append(sizes, n); sizesMu.Unlock() })
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); ld.run(ctx) }()
	defer func() { stop(); wg.Wait() }()

	rng := rand.New(rand.NewPCG(5, 5))
	keys := map[int][]blockkey.Key{}
	snapOf := func(slot int) summary.Snapshot {
		c := summary.NewCounting(p)
		keys[slot] = nil
		for range 20 {
			k := blockkey.Key(rng.Uint64())
			keys[slot] = append(keys[slot], k)
			c.Add(k)
		}
		c.TakeDelta()
		return c.Snapshot()
	}
	// pendingIs waits until handed loads have been handed over and n of
	// them are pending (the rest taken); the test holds mu meanwhile.
	pendingIs := func(handed, n int) {
		t.Helper()
		waited := false
		defer func() {
			if !waited {
				mu.Unlock() // the wait failed: let the loader finish
			}
		}()
		testnet.Await(t, 10*time.Second, time.Millisecond, func() error {
			ld.mu.Lock()
			k := len(ld.pending)
			ld.mu.Unlock()
			if w := ld.waiting.Load(); w != int64(handed) || k != n {
				return fmt.Errorf("%d loads pending of %d handed over, want %d of %d", k, w, n, handed)
			}
			return nil
		})
		waited = true
	}
	type result struct {
		slot int
		err  error
	}
	results := make(chan result, 100)
	hand := func(ctx context.Context, slot int, epoch uint64) {
		l, err := f.LoadSnapshot(slot, epoch, snapOf(slot)) // the test holds mu: the loader waits
		if err != nil {
			t.Fatal(err)
		}
		go func() { results <- result{slot, ld.load(ctx, l)} }()
	}

	mu.Lock()
	hand(context.Background(), 0, 1)
	pendingIs(1, 0) // taken: the loader waits for the lock to write its first step
	cut, cutStop := context.WithCancel(context.Background())
	n := 0
	for slot := 1; slot < 64; slot++ {
		c := context.Background()
		if slot == 5 {
			c = cut
		}
		hand(c, slot, 1)
		n++
		pendingIs(1+n, n)
	}
	first7 := keys[7]
	hand(context.Background(), 7, 2) // overtakes the load of slot 7 pending; joins once that one has left
	hand(context.Background(), 64, 1)
	hand(context.Background(), 65, 1)
	pendingIs(1+n+3, n+3)
	cutStop()
	mu.Unlock()

	got := map[int][]error{}
	for range 67 {
		select {
		case r := <-results:
			got[r.slot] = append(got[r.slot], r.err)
		case <-time.After(30 * time.Second):
			t.Fatalf("loads unanswered; answered: %v", got)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if w := ld.waiting.Load(); w != 0 {
		t.Errorf("%d loads waiting once all are answered", w)
	}
	testnet.Await(t, 10*time.Second, time.Millisecond, func() error { // observed once the last load is answered
		sizesMu.Lock()
		defer sizesMu.Unlock()
		if !slices.Equal(sizes, []int{66}) {
			return fmt.Errorf("laps of %v loads, want one of 66 (slots 0..65 but 5, and slot 7's second)", sizes)
		}
		return nil
	})
	if e := got[5]; len(e) != 1 || !errors.Is(e[0], context.Canceled) {
		t.Errorf("slot 5 (its stream ended): %v", e)
	}
	if _, _, ok := f.Position(5); ok {
		t.Error("slot 5 holds a summary: a dropped load was finished")
	}
	if e := got[7]; len(e) != 2 || !(errors.Is(e[0], summary.ErrAbandoned) && e[1] == nil || errors.Is(e[1], summary.ErrAbandoned) && e[0] == nil) {
		t.Errorf("slot 7's two loads: %v, want one abandoned and one written", e)
	}
	matched := make([]int, f.Slots())
	for slot := range 66 {
		if slot == 5 {
			continue
		}
		if slot != 7 && (len(got[slot]) != 1 || got[slot][0] != nil) {
			t.Errorf("slot %d: %v", slot, got[slot])
		}
		want := uint64(1)
		if slot == 7 {
			want = 2
		}
		if e, _, ok := f.Position(slot); !ok || e != want {
			t.Errorf("slot %d at epoch %d (%v), want %d", slot, e, ok, want)
		}
		if f.MatchLinear(keys[slot], matched); matched[slot] != len(keys[slot]) {
			t.Errorf("slot %d matches %d of its %d keys", slot, matched[slot], len(keys[slot]))
		}
	}
	if f.MatchLinear(first7, matched); matched[7] == len(first7) {
		t.Error("slot 7 holds its overtaken snapshot")
	}
}
