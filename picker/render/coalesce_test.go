package render_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/render"
)

// gated is a render function that blocks until release is closed, counts
// its calls and records whether its context ended.
type gated struct {
	release   chan struct{}
	calls     atomic.Int32
	cancelled atomic.Int32
	answer    render.Rendered
	err       error
}

func newGated() *gated {
	return &gated{release: make(chan struct{}), answer: render.Rendered{TokenIDs: []uint32{1, 2, 3}, Via: render.ViaChatRender}}
}

func (g *gated) fn(ctx context.Context) (render.Rendered, error) {
	g.calls.Add(1)
	select {
	case <-g.release:
		return g.answer, g.err
	case <-ctx.Done():
		g.cancelled.Add(1)
		return render.Rendered{}, ctx.Err()
	}
}

type outcome struct {
	r      render.Rendered
	joined bool
	err    error
}

// start runs Do in a goroutine; its outcome arrives on the channel.
func start(ctx context.Context, c *render.Coalescer, key render.Key, body []byte, fn func(context.Context) (render.Rendered, error)) <-chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		r, j, err := c.Do(ctx, key, body, fn)
		ch <- outcome{r, j, err}
	}()
	return ch
}

var body = []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)

func TestCoalesceIdenticalShareOneCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := render.NewCoalescer(time.Minute, nil), newGated()
		key := render.KeyOf("g", intake.Chat, 0, body)
		const n = 8
		var chs []<-chan outcome
		for range n {
			chs = append(chs, start(t.Context(), c, key, body, g.fn))
			synctest.Wait() // the first is the leader
		}
		if c.InFlight() != 1 {
			t.Fatalf("in flight %d, want 1", c.InFlight())
		}
		close(g.release)
		joined := 0
		var got [][]uint32
		for _, ch := range chs {
			o := <-ch
			if o.err != nil || !slices.Equal(o.r.TokenIDs, g.answer.TokenIDs) || o.r.Via != render.ViaChatRender {
				t.Fatalf("outcome %+v", o)
			}
			if o.joined {
				joined++
			}
			got = append(got, o.r.TokenIDs)
		}
		if g.calls.Load() != 1 || joined != n-1 {
			t.Fatalf("%d engine calls, %d joined; want 1 and %d", g.calls.Load(), joined, n-1)
		}
		got[0][0] = 99 // callers share no memory
		for _, ids := range got[1:] {
			if ids[0] != 1 {
				t.Fatal("callers share token ids")
			}
		}
		if g.answer.TokenIDs[0] != 1 {
			t.Fatal("a caller's copy is the function's slice")
		}
		if c.InFlight() != 0 {
			t.Fatalf("in flight %d after the call", c.InFlight())
		}
	})
}

func TestCoalesceDifferentKeysSeparate(t *testing.T) {
	other := []byte(`{"model":"m","messages":[{"role":"user","content":"ho"}]}`)
	for _, tc := range []struct {
		name string
		key  render.Key
		body []byte
	}{
		{"group", render.KeyOf("h", intake.Chat, 0, body), body},
		{"kind", render.KeyOf("g", intake.Completion, 0, body), body},
		{"attempt", render.KeyOf("g", intake.Chat, 1, body), body},
		{"body", render.KeyOf("g", intake.Chat, 0, other), other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, g := render.NewCoalescer(0, nil), newGated()
				a := start(t.Context(), c, render.KeyOf("g", intake.Chat, 0, body), body, g.fn)
				b := start(t.Context(), c, tc.key, tc.body, g.fn)
				synctest.Wait()
				if g.calls.Load() != 2 || c.InFlight() != 2 {
					t.Fatalf("%d calls, %d in flight; want 2 and 2", g.calls.Load(), c.InFlight())
				}
				close(g.release)
				if oa, ob := <-a, <-b; oa.err != nil || ob.err != nil || oa.joined || ob.joined {
					t.Fatalf("outcomes %+v %+v", oa, ob)
				}
			})
		})
	}
}

func TestCoalesceWaiterLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := render.NewCoalescer(0, nil), newGated()
		key := render.KeyOf("g", intake.Chat, 0, body)
		leader := start(t.Context(), c, key, body, g.fn)
		synctest.Wait()
		wctx, cancel := context.WithCancel(t.Context())
		waiter := start(wctx, c, key, body, g.fn)
		synctest.Wait()
		cancel()
		if o := <-waiter; !errors.Is(o.err, context.Canceled) || !o.joined {
			t.Fatalf("waiter %+v, want its own cancellation", o)
		}
		if g.cancelled.Load() != 0 || c.InFlight() != 1 {
			t.Fatal("a waiter leaving ended the call")
		}
		close(g.release)
		if o := <-leader; o.err != nil || len(o.r.TokenIDs) != 3 {
			t.Fatalf("leader %+v", o)
		}
	})
}

func TestCoalesceLeaderLeavesWaitersServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := render.NewCoalescer(0, nil), newGated()
		key := render.KeyOf("g", intake.Chat, 0, body)
		lctx, cancel := context.WithCancel(t.Context())
		leader := start(lctx, c, key, body, g.fn)
		synctest.Wait()
		waiter := start(t.Context(), c, key, body, g.fn)
		synctest.Wait()
		cancel()
		if o := <-leader; !errors.Is(o.err, context.Canceled) || o.joined {
			t.Fatalf("leader %+v, want its own cancellation", o)
		}
		synctest.Wait()
		if g.cancelled.Load() != 0 {
			t.Fatal("the leader's client leaving cancelled the shared call")
		}
		close(g.release)
		if o := <-waiter; o.err != nil || len(o.r.TokenIDs) != 3 || !o.joined {
			t.Fatalf("waiter %+v", o)
		}
		if g.calls.Load() != 1 {
			t.Fatalf("%d calls, want 1", g.calls.Load())
		}
	})
}

func TestCoalesceLastOutEndsCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := render.NewCoalescer(0, nil), newGated()
		key := render.KeyOf("g", intake.Chat, 0, body)
		ctx, cancel := context.WithCancel(t.Context())
		a, b := start(ctx, c, key, body, g.fn), start(ctx, c, key, body, g.fn)
		synctest.Wait()
		cancel()
		<-a
		<-b
		synctest.Wait()
		if g.cancelled.Load() != 1 || c.InFlight() != 0 {
			t.Fatalf("cancelled %d, in flight %d; want the call ended and gone", g.cancelled.Load(), c.InFlight())
		}
		// A new caller starts afresh.
		close(g.release)
		if r, joined, err := c.Do(t.Context(), key, body, g.fn); err != nil || joined || len(r.TokenIDs) != 3 {
			t.Fatalf("after: %v %v %v", r, joined, err)
		}
	})
}

func TestCoalesceErrorsShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := render.NewCoalescer(0, nil), newGated()
		g.err = &render.RefusedError{Status: 400, Body: []byte("no")}
		key := render.KeyOf("g", intake.Chat, 0, body)
		a := start(t.Context(), c, key, body, g.fn)
		synctest.Wait()
		b := start(t.Context(), c, key, body, g.fn)
		synctest.Wait()
		close(g.release)
		for _, ch := range []<-chan outcome{a, b} {
			var re *render.RefusedError
			if o := <-ch; !errors.As(o.err, &re) || re.Status != 400 {
				t.Fatalf("outcome %+v, want the refusal", o)
			}
		}
		if g.calls.Load() != 1 || c.InFlight() != 0 {
			t.Fatalf("%d calls, %d in flight", g.calls.Load(), c.InFlight())
		}
	})
}

// A cancellation handed over from another caller's context (a function
// that ignored its own) is retried, a bounded number of times.
func TestCoalesceForeignCancellationRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := render.NewCoalescer(0, nil)
		key := render.KeyOf("g", intake.Chat, 0, body)
		var calls atomic.Int32
		flaky := func(context.Context) (render.Rendered, error) {
			if calls.Add(1) == 1 {
				return render.Rendered{}, context.Canceled
			}
			return render.Rendered{TokenIDs: []uint32{7}}, nil
		}
		if r, _, err := c.Do(t.Context(), key, body, flaky); err != nil || !slices.Equal(r.TokenIDs, []uint32{7}) {
			t.Fatalf("got %v %v, want the retry's tokens", r, err)
		}
		calls.Store(0)
		always := func(context.Context) (render.Rendered, error) {
			calls.Add(1)
			return render.Rendered{}, context.Canceled
		}
		if _, _, err := c.Do(t.Context(), key, body, always); !errors.Is(err, context.Canceled) || calls.Load() != 3 {
			t.Fatalf("err %v after %d calls, want cancelled after 3", err, calls.Load())
		}
	})
}

func TestCoalesceCallLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, g := render.NewCoalescer(time.Second, nil), newGated()
		key := render.KeyOf("g", intake.Chat, 0, body)
		a, b := start(t.Context(), c, key, body, g.fn), start(t.Context(), c, key, body, g.fn)
		for _, ch := range []<-chan outcome{a, b} {
			if o := <-ch; !errors.Is(o.err, context.DeadlineExceeded) {
				t.Fatalf("outcome %+v, want the call's own timeout", o)
			}
		}
		if g.calls.Load() != 1 || c.InFlight() != 0 {
			t.Fatalf("%d calls, %d in flight", g.calls.Load(), c.InFlight())
		}
	})
}

func BenchmarkCoalesceParallel(b *testing.B) {
	c := render.NewCoalescer(0, nil)
	key := render.KeyOf("g", intake.Chat, 0, body)
	ans := render.Rendered{TokenIDs: make([]uint32, 2048)}
	var mu sync.Mutex
	fn := func(context.Context) (render.Rendered, error) { mu.Lock(); defer mu.Unlock(); return ans, nil }
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := c.Do(context.Background(), key, body, fn); err != nil {
				b.Fatal(err)
			}
		}
	})
}
