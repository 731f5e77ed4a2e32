package fleet

// Roster is one identity group's endpoints as the state held them at one
// version, sorted by URL: what a decision reads of its group. It is built
// once after a change and shared by every reader until the next change;
// neither the slice nor the endpoints it points to are ever modified —
// not by the state, and not by a reader, which must copy what it means to
// change. A reader may keep it as long as it likes: the state's later
// changes make new rosters, never touch this one.
//
// Building one after a change copies only the endpoints that changed
// since the last roster (each endpoint's copy is shared until it
// changes) and the slice of pointers, so a group whose endpoints report
// their loads several times a second costs a read a few endpoint copies,
// not the whole group.
type Roster struct {
	// Version is the state's change count when the roster was built: it
	// increases with every change to any endpoint of the state, so two
	// rosters of one group with the same version hold the same endpoints.
	Version uint64
	// Endpoints are the group's endpoints, sorted by URL. Read only.
	Endpoints []*Endpoint
}

// Roster returns the endpoints of one identity group as of now (nil for a
// group not held): the roster of the last read when nothing of the group
// changed since, else a new one. Its cost is bounded by the group, never
// by the fleet. Roster only reads the state as its callers see it: it may
// run concurrently with the other read-only methods (under the caller's
// read lock), the rebuild itself being published atomically.
func (s *State) Roster(groupID string) *Roster {
	g := s.groups[groupID]
	if g == nil {
		return nil
	}
	if r := g.roster.Load(); r != nil && r.Version == g.version {
		return r
	}
	r := &Roster{Version: g.version, Endpoints: make([]*Endpoint, len(g.byURL))}
	for i, e := range g.byURL {
		r.Endpoints[i] = e.published()
	}
	g.roster.Store(r) // readers racing here built the same version
	return r
}

// published is e's shared copy, made on first read after a change.
func (e *entry) published() *Endpoint {
	if p := e.pub.Load(); p != nil {
		return p
	}
	c := e.Endpoint
	if e.pub.CompareAndSwap(nil, &c) {
		return &c
	}
	return e.pub.Load() // another reader's copy of the same version
}

// changed records that something of e's Endpoint (or its group's
// membership) changed: its shared copy is made again at the next read,
// and its group's roster rebuilt. Every write to an entry's Endpoint ends
// with it; it is called under the caller's write lock.
func (s *State) changed(e *entry) {
	s.version++
	e.pub.Store(nil)
	if e.g != nil {
		e.g.version = s.version
	}
}
