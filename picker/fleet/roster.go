package fleet

import (
	"slices"
	"strings"
	"time"

	"github.com/zeebo/xxh3"
)

// Roster is one identity group's endpoints as the state held them at one
// version, sorted by URL: what a decision reads of its group. It is built
// once after a change and shared by every reader until the next change;
// neither its slices nor the endpoints they point to are ever modified —
// not by the state, and not by a reader, which must copy what it means to
// change. A reader may keep it as long as it likes: the state's later
// changes make new rosters, never touch this one.
//
// Building one after a change copies only the endpoints that changed
// since the last roster (each endpoint's copy is shared until it
// changes) and the two slices, so a group whose endpoints report their
// loads several times a second costs a read a few endpoint copies, not
// the whole group.
type Roster struct {
	// Version is the state's change count when the roster was built: it
	// increases with every change to any endpoint of the state, so two
	// rosters of one group with the same version hold the same endpoints.
	// 0 for a roster made by NewRoster or Only.
	Version uint64
	// Membership is the version of the group's last change of membership
	// (an endpoint taken or dropped): two rosters of one group with the
	// same Membership hold the same endpoints, by URL, in the same order,
	// whatever else of them changed. 0 with Version.
	Membership uint64
	// Endpoints are the group's endpoints, sorted by URL. Read only.
	Endpoints []*Endpoint
	// Briefs are the same endpoints, index for index, as a decision reads
	// them (Endpoint.Brief): side by side in memory, where the endpoints
	// are apart. Read only.
	Briefs []Brief
	sorted bool // Endpoints are sorted by URL, each once (Index searches)
}

// NewRoster makes a roster of eps, in their order, with their briefs:
// for endpoints not read from a State (tests, tools). Version and
// Membership are 0. The roster points to eps' endpoints: they must not
// change while it is used.
func NewRoster(eps []*Endpoint) *Roster {
	r := &Roster{Endpoints: eps, Briefs: make([]Brief, len(eps)), sorted: true}
	for i, e := range eps {
		r.Briefs[i] = e.Brief()
		r.sorted = r.sorted && (i == 0 || eps[i-1].URL < e.URL)
	}
	return r
}

// Clone is a roster like r whose two slices are new (the endpoints they
// point to are r's): for a reader that means to replace some endpoints
// (and their briefs) in its own copy, keeping their order.
func (r *Roster) Clone() *Roster {
	c := *r
	c.Endpoints, c.Briefs = slices.Clone(r.Endpoints), slices.Clone(r.Briefs)
	return &c
}

// Index is the position of url's endpoint in r (false: r holds none).
// The state's rosters, sorted by URL, are searched; a roster of
// endpoints in another order is walked.
func (r *Roster) Index(url string) (int, bool) {
	if r.sorted {
		return slices.BinarySearchFunc(r.Briefs, url, func(b Brief, url string) int { return strings.Compare(b.URL, url) })
	}
	for i := range r.Briefs {
		if r.Briefs[i].URL == url {
			return i, true
		}
	}
	return 0, false
}

// Only is the roster of r's endpoints whose URL keep holds, in r's order
// (a new roster: r is shared); Version and Membership are 0.
func (r *Roster) Only(keep map[string]bool) *Roster {
	out := &Roster{Endpoints: make([]*Endpoint, 0, len(keep)), Briefs: make([]Brief, 0, len(keep)), sorted: r.sorted}
	for i, e := range r.Endpoints {
		if keep[e.URL] {
			out.Endpoints = append(out.Endpoints, e)
			out.Briefs = append(out.Briefs, r.Briefs[i])
		}
	}
	return out
}

// Brief is an endpoint as a decision reads it, in 80 bytes: its URL, its
// load report, and its health judged as far as that does not depend on
// the time, with when the endpoint was last heard from, from which
// StateAt judges the rest at the decision's now. A roster's briefs are
// made once per change of their endpoint, not per decision.
type Brief struct {
	URL string
	// Hash is xxh3.HashString(URL): what the rendezvous weights of the
	// endpoint start from (score.Candidate.IDHash).
	Hash uint64
	// heard is when anything last arrived for the endpoint (Endpoint's
	// LastUpdate, else Since); zero: never.
	heard time.Time
	// Waiting, Running and KVCacheUsage are the last load report's
	// (Endpoint.Load); HasLoad whether one arrived.
	Waiting, Running, KVCacheUsage float64
	HasLoad                        bool
	// P2P: the endpoint advertises a KV source (Identity.KVSource): it
	// runs vLLM's P2P tier.
	P2P bool
	// state is the verdict (Endpoint.verdict), fixed when the time does
	// not change it.
	state HealthState
	why   cause
	fixed bool
}

// Brief is e as a decision reads it.
func (e *Endpoint) Brief() Brief {
	b := Brief{URL: e.URL, Hash: xxh3.HashString(e.URL), heard: e.heard(), Waiting: e.Load.Waiting, Running: e.Load.Running, KVCacheUsage: e.Load.KVCacheUsage,
		HasLoad: e.HasLoad(), P2P: e.Info.KVSource != ""}
	b.state, b.why, b.fixed = e.verdict()
	return b
}

// StateAt is the endpoint's state at now, as its HealthAt judges it.
func (b *Brief) StateAt(now time.Time, c HealthConfig) HealthState {
	if b.fixed {
		return b.state
	}
	state, _, _ := atTime(b.state, b.why, b.heard, now, c)
	return state
}

// Roster returns the endpoints of one identity group as of now (nil for a
// group not held): the roster of the last read when nothing of the group
// changed since, else a new one. Its cost is bounded by the group, never
// by the fleet. Roster changes nothing its callers see, but keeps the
// rosters it builds: it may run concurrently with the read-only methods
// (under the caller's read lock), not with itself (the caller serialises
// Roster calls, fleetview and localfleet with a mutex of their own) nor
// with any method that writes.
func (s *State) Roster(groupID string) *Roster {
	g := s.groups[groupID]
	if g == nil {
		return nil
	}
	prev := g.roster
	if prev != nil && prev.Version == g.version {
		return prev
	}
	r := &Roster{Version: g.version, Membership: g.membership, sorted: true}
	if prev != nil && prev.Membership == g.membership {
		// The same endpoints in the same places: those marked since prev
		// change, the others keep their copies.
		r.Endpoints, r.Briefs = slices.Clone(prev.Endpoints), slices.Clone(prev.Briefs)
		for _, e := range g.dirty {
			if e.changedAt > prev.Version && e.g == g {
				p := e.published()
				r.Endpoints[e.pos], r.Briefs[e.pos] = p, p.Brief()
			}
		}
	} else {
		r.Endpoints, r.Briefs = make([]*Endpoint, len(g.byURL)), make([]Brief, len(g.byURL))
		for i, e := range g.byURL {
			p := e.published()
			r.Endpoints[i], r.Briefs[i] = p, p.Brief()
		}
	}
	g.roster = r
	return r
}

// published is e's shared copy, made on first read after a change.
func (e *entry) published() *Endpoint {
	if e.pub == nil {
		c := e.Endpoint
		e.pub = &c
	}
	return e.pub
}

// changed records that something of e's Endpoint changed: its shared
// copy is made again at the next read, and the next roster of its group
// takes it. Every write to an entry's Endpoint ends with it; it is called
// under the caller's write lock.
func (s *State) changed(e *entry) {
	s.version++
	e.pub = nil
	e.changedAt = s.version
	g := e.g
	if g == nil {
		return
	}
	g.version = s.version
	if r := g.roster; r != nil && r.Version >= g.dirtyTop {
		g.dirty = g.dirty[:0] // every mark is in the last roster
	}
	if len(g.dirty) > len(g.byURL) { // unread for long: the next roster is built whole
		g.membership, g.dirty = s.version, g.dirty[:0]
	}
	g.dirty, g.dirtyTop = append(g.dirty, e), s.version
}

// reseat records a change of g's membership (an endpoint taken or
// dropped, byURL changed): the positions are renumbered and the next
// roster is built whole. Under the caller's write lock.
func (s *State) reseat(g *group) {
	s.version++
	g.version, g.membership, g.dirty = s.version, s.version, g.dirty[:0]
	for i, e := range g.byURL {
		e.pos = i
	}
}
