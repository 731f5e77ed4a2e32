package picker

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute/picker/admit"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/inflight"
)

// bookings is the router's one lock and what it guards: the bookings of
// its picks in flight (picker/inflight.Bookings) and, when a peer's
// policy routes (comparison runs), that policy's state. No other file
// takes the lock: they book, end and read through these methods, each
// short and free of I/O, so the decide and book steps never wait on
// anything but each other.
type bookings struct {
	mu   sync.Mutex
	b    *inflight.Bookings
	peer *peerPolicy // nil: kvroute's own policies
	// admitAll: admission is told of no routable endpoint's load, so it
	// never judges a group saturated (Router.AdmitAll).
	admitAll bool
	// expired counts the other pickers' bookings dropped at their
	// lifetime before their first token (set by the router; nil: none).
	expired func(n int)
}

// book records p's pick of its endpoint at now: uncached prompt tokens,
// counted as prefill in flight until its first byte when carried.
func (k *bookings) book(p *Pick, uncached float64, carried bool, now time.Time) {
	k.mu.Lock()
	p.booking = k.b.Book(p.Endpoint, uncached, carried, now)
	if carried && len(p.chain) > 0 {
		k.b.Hold(&p.booking, p.chain)
	}
	if carried && p.source.url != "" {
		k.b.Pull(&p.booking, p.source.url)
	}
	if p.PredictedTTFTMs > 0 {
		k.b.Predict(&p.booking, p.PredictedTTFTMs/1000)
	}
	k.mu.Unlock()
}

// held is, per endpoint of eps, how many leading blocks of chain this
// picker's carried picks there hold before their first token (absent:
// none).
func (k *bookings) held(ro *fleet.Roster, chain []uint64) map[string]int {
	out := map[string]int{}
	if ro == nil {
		return out
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	ask := func(url string) {
		if n := k.b.HeldPrefix(url, chain); n > 0 {
			out[url] = n
		}
	}
	if k.b.HoldingAtMost() < len(ro.Endpoints) { // sparse: the few endpoints holding anything
		k.b.Holding(func(url string) {
			if _, ok := ro.Index(url); ok {
				ask(url)
			}
		})
		return out
	}
	for _, e := range ro.Endpoints {
		ask(e.URL)
	}
	return out
}

// pending is what each of eps has in flight from this picker and the
// other pickers whose bookings it follows (theirs expired first) at now,
// judged by when its last load report arrived here (not by the sidecar's
// clock: clocks of different machines disagree). Sparse: absent is none.
//
// Only the endpoints with bookings are asked when they are fewer than the
// roster's (inflight.Bookings.Busy): every other endpoint's is zero, and
// a decision at 1,000 endpoints spent 80 µs asking each.
func (k *bookings) pending(ro *fleet.Roster, now time.Time) map[string]inflight.Pending {
	out := map[string]inflight.Pending{}
	k.mu.Lock()
	phantoms := k.b.Expire(now)
	if ro != nil {
		ask := func(e *fleet.Endpoint) {
			if pend := k.b.Pending(e.URL, e.LoadAt, now); pend != (inflight.Pending{}) {
				out[e.URL] = pend
			}
		}
		if k.b.BusyAtMost() < len(ro.Endpoints) {
			var busy []string // asked after the walk: Pending prunes what it reads
			k.b.Busy(func(url string) { busy = append(busy, url) })
			for _, url := range busy {
				if i, ok := ro.Index(url); ok {
					ask(ro.Endpoints[i])
				}
			}
		} else {
			for _, e := range ro.Endpoints {
				ask(e)
			}
		}
	}
	k.mu.Unlock()
	if phantoms > 0 && k.expired != nil {
		k.expired(phantoms)
	}
	return out
}

// admitLoads are the routable endpoints' loads at now as admission judges
// saturation: requests queued at the engine (its last reported waiting,
// plus this picker's picks that report does not cover when the engine
// was queuing or has not reported: picks an idle engine took run at
// once), its reported KV cache usage, and this picker's prefill tokens
// to it before their first byte.
func (k *bookings) admitLoads(eps []*fleet.Endpoint, now time.Time, health fleet.HealthConfig) []admit.Load {
	out := make([]admit.Load, 0, len(eps))
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.admitAll {
		return nil // no load: never saturated (admit.Config.Saturated)
	}
	for _, e := range eps {
		if !e.StateAt(now, health).Routable() {
			continue
		}
		l := admit.Load{PrefillTokens: k.b.Prefill(e.URL)}
		unreported := float64(k.b.Pending(e.URL, e.LoadAt, now).Count)
		switch {
		case !e.HasLoad():
			l.Queued = unreported
		case e.Load.Waiting >= 1:
			l.Queued = e.Load.Waiting + unreported
		}
		if e.HasLoad() {
			l.KVUsage = e.Load.KVCacheUsage
		}
		out = append(out, l)
	}
	return out
}

// firstToken ends p's wait for its first output token.
func (k *bookings) firstToken(p *Pick) {
	k.mu.Lock()
	k.b.FirstToken(&p.booking)
	k.mu.Unlock()
}

// firstByte ends p's prefill in flight.
func (k *bookings) firstByte(p *Pick) {
	k.mu.Lock()
	k.b.FirstByte(&p.booking)
	k.mu.Unlock()
}

// done ends p's booking, and its peer policy's.
func (k *bookings) done(p *Pick, now time.Time) {
	k.mu.Lock()
	k.b.Done(&p.booking)
	k.peerDoneLocked(p, now)
	k.mu.Unlock()
}

// move moves p's booking to endpoint (a fallback served it).
func (k *bookings) move(p *Pick, endpoint string, uncached float64, now time.Time) {
	k.mu.Lock()
	k.b.Move(&p.booking, endpoint, uncached, now)
	k.mu.Unlock()
}

// withPeer runs f on the peer policy's state, alone.
func (k *bookings) withPeer(f func(pp *peerPolicy)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f(k.peer)
}

// peerFirstChunk marks the first chunk of p's streamed answer for its
// peer booking (Router.FirstChunk).
func (k *bookings) peerFirstChunk(p *Pick, now time.Time) {
	if k.peer == nil || !p.peer.ok {
		return
	}
	k.mu.Lock()
	k.peer.policy.FirstChunk(p.peer.t, now)
	k.mu.Unlock()
}

// peerFirstToken marks the engine's first output token of p for its peer
// booking (Router.FirstToken).
func (k *bookings) peerFirstToken(p *Pick, now time.Time) {
	if k.peer == nil || !p.peer.ok {
		return
	}
	k.mu.Lock()
	k.peer.policy.FirstToken(p.peer.t, now)
	k.mu.Unlock()
}

// AdmitAll turns admission's saturation check off for the rest of the
// router's life: every request is admitted at once, as when every
// Config.Admission limit (--saturation-*) is 0. For comparison runs that
// measure routing alone (kvroute bench without --admission), whose fleet
// configuration sets only some of the limits; a router built with the
// limits at 0 needs no call.
func (r *Router) AdmitAll() {
	k := &r.bookings
	k.mu.Lock()
	k.admitAll = true
	k.mu.Unlock()
	r.admit.poke() // waiters, if any, are released
}

// peerDone ends p's peer booking alone: the decision API's, whose request
// the picker never sees (a peer policy books it and lets it go at once).
func (k *bookings) peerDone(p *Pick, now time.Time) {
	if k.peer == nil || !p.peer.ok {
		return // kvroute's own policies: no lock on the decision API's path
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.peerDoneLocked(p, now)
}

func (k *bookings) peerDoneLocked(p *Pick, now time.Time) {
	if k.peer != nil && p.peer.ok {
		k.peer.policy.Done(p.peer.t, now)
		p.peer.ok = false
	}
}
