package render

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/picker/intake"
)

// Key names what a render's answer depends on apart from the engine: the
// identity group (whose engines render alike), the kind, the body and the
// attempt (a fallback to another engine must not join the call it is
// falling back from).
type Key struct {
	Group   string
	Kind    intake.Kind
	Attempt int
	hash    xxh3.Uint128
}

// KeyOf is the coalescing key of body.
func KeyOf(group string, kind intake.Kind, attempt int, body []byte) Key {
	return Key{Group: group, Kind: kind, Attempt: attempt, hash: xxh3.Hash128(body)}
}

// maxRetries bounds how often a caller starts the call again after being
// handed a cancellation that was not its own.
const maxRetries = 2

// Coalescer shares one render call among identical concurrent callers. The
// zero value is not usable; use NewCoalescer.
type Coalescer struct {
	limit  time.Duration
	onJoin func() // called as a caller joins another's call (nil: none)
	mu     sync.Mutex
	calls  map[Key]*call
}

// call is one shared render in flight.
type call struct {
	body   []byte // the key's body, compared on joining (a hash collision does not join)
	refs   int    // callers still waiting (c.mu)
	cancel context.CancelFunc
	done   chan struct{} // closed once r and err are set
	r      Rendered
	err    error
}

// NewCoalescer returns a coalescer whose shared calls take at most limit
// (0: no bound of its own; the function's client bounds them); onJoin, if
// not nil, is called (under the table's lock: keep it short) each time a
// caller joins another's call in flight.
func NewCoalescer(limit time.Duration, onJoin func()) *Coalescer {
	return &Coalescer{limit: limit, onJoin: onJoin, calls: map[Key]*call{}}
}

// InFlight is the number of shared calls in flight.
func (c *Coalescer) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// Do returns fn's answer for key and body: from a call of its own, or
// from an identical one in flight (joined reports that it joined
// another's). fn runs in a goroutine of its own with a context that keeps
// ctx's values, ends when every caller has left or the limit passes, and
// nothing else. A caller leaves when its ctx ends, with ctx.Err(), whether
// or not it started the call. Every caller gets its own copy of the token
// ids and media items.
func (c *Coalescer) Do(ctx context.Context, key Key, body []byte, fn func(context.Context) (Rendered, error)) (r Rendered, joined bool, err error) {
	for try := 0; ; try++ {
		if err := ctx.Err(); err != nil {
			return Rendered{}, joined, err
		}
		cl, j := c.join(ctx, key, body, fn)
		joined = joined || j
		if cl == nil { // a different body with the same hash: not shared
			r, err = fn(ctx)
			return r, joined, err
		}
		select {
		case <-cl.done:
		case <-ctx.Done():
			c.leave(key, cl)
			return Rendered{}, joined, ctx.Err()
		}
		c.leave(key, cl)
		// A cancellation that is not this caller's (fn used a context
		// other than its own, which its leader's leaving ended): start
		// again rather than fail for another's client.
		if errors.Is(cl.err, context.Canceled) && ctx.Err() == nil && try < maxRetries {
			continue
		}
		return cl.r.clone(), joined, cl.err
	}
}

// join finds key's call or starts one; nil when key is taken by another
// body.
func (c *Coalescer) join(ctx context.Context, key Key, body []byte, fn func(context.Context) (Rendered, error)) (*call, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.calls[key]; ok {
		if !bytes.Equal(cl.body, body) {
			return nil, false
		}
		cl.refs++
		if c.onJoin != nil {
			c.onJoin()
		}
		return cl, true
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if c.limit > 0 {
		cctx, cancel = withTimeout(cctx, cancel, c.limit)
	}
	cl := &call{body: body, refs: 1, cancel: cancel, done: make(chan struct{})}
	c.calls[key] = cl
	go func() {
		r, err := fn(cctx)
		c.mu.Lock()
		if c.calls[key] == cl {
			delete(c.calls, key)
		}
		c.mu.Unlock()
		cl.r, cl.err = r, err
		cancel()
		close(cl.done)
	}()
	return cl, false
}

// leave drops a caller; the last one out ends the call (and its entry,
// so no later caller joins a call nobody waits for).
func (c *Coalescer) leave(key Key, cl *call) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl.refs--
	if cl.refs > 0 {
		return
	}
	if c.calls[key] == cl {
		delete(c.calls, key)
	}
	cl.cancel()
}

func withTimeout(ctx context.Context, cancel0 context.CancelFunc, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, func() { cancel(); cancel0() }
}

// clone copies r's slices, so callers sharing an answer share no memory.
func (r Rendered) clone() Rendered {
	r.TokenIDs = slices.Clone(r.TokenIDs)
	r.MM = slices.Clone(r.MM)
	return r
}
