package fleet

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/internal/tier"
)

// State is the fleet state core: the endpoints the sidecars offer, the
// ones refused and why, and per identity group and tier the bit-sliced
// index of every endpoint's summary. It does no I/O, reads no clock (every
// time it records is an argument) and holds no lock: it is not safe for
// concurrent use. Its caller serialises access; the read-only methods
// (Match, Endpoints, GroupEndpoints, Refused, Positions) may run concurrently with one
// another, never with any other method; Roster may run concurrently
// with those, not with itself.
type State struct {
	cfg       Config
	params    string             // cfg.Params.String(): what sidecars must advertise
	groups    map[string]*group  // by group ID
	endpoints map[string]*entry  // by URL
	refused   map[string]Refused // by URL, until taken or their sidecar forgotten
	version   uint64             // changes made to endpoints (Roster.Version)
}

// group is one identity group: its endpoints' slots and, per tier, the
// index of their summaries.
type group struct {
	tiers [tier.Count]*summary.Fleet // nil until the tier's first summary
	slots []string                   // slot → endpoint URL ("" free)
	held  []*entry                   // slot → endpoint (nil free), beside slots
	byURL []*entry                   // the held endpoints sorted by URL
	// version is the state's version at the group's last change,
	// membership at its last change of endpoints (byURL), and roster the
	// last roster built (rebuilt on read when older). dirty are the
	// entries changed since (some perhaps already in roster: their
	// changedAt says), dirtyTop the version of the last one marked.
	version, membership uint64
	roster              *Roster
	dirty               []*entry
	dirtyTop            uint64
}

func byURL(e *entry, url string) int { return strings.Compare(e.URL, url) }

// entry is one endpoint as the state holds it.
//
// The endpoint states of DESIGN.md §11 (cached, load-only, draining, down,
// each with its reason) belong here, beside the signals they are judged
// from: the stream's health as the sidecar reports it (Info.Partial, and
// what the stream will say of replay and silence), the last update and
// load report (LastUpdate, LoadAt), and the picker's passive checks. The
// judgement itself stays in one place, Endpoint.HealthAt (health.go),
// which every caller asks.
type entry struct {
	Endpoint
	slot int
	g    *group // its group, while held
	pos  int    // its index in g.byURL
	// pub is the shared copy of Endpoint that rosters point to: nil
	// after a change (State.changed), made again at the next read;
	// changedAt is the state's version at that change.
	pub       *Endpoint
	changedAt uint64
	// judged is the health last reported by Judge (for transitions).
	judged Health
	// ejections counts ejections since the endpoint last stayed in for
	// EjectMax; readmitted is when it last came back.
	ejections  int
	readmitted time.Time
	// epoch is the engine epoch of the endpoint's last snapshot (hasEpoch:
	// one came): a new one is a restarted or cleared engine (newEpoch).
	epoch    uint64
	hasEpoch bool
	// lags are the recent event-to-routable lags, a ring.
	lags [lagRing]time.Duration
	nlag int
}

// lagRing is how many recent lags an endpoint keeps.
const lagRing = 16

// New returns an empty state. cfg must be valid (see Config).
func New(cfg Config) (*State, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &State{cfg: cfg, params: cfg.Params.String(), groups: map[string]*group{},
		endpoints: map[string]*entry{}, refused: map[string]Refused{}}, nil
}

// The reasons an endpoint is refused (Refused.Reason).
const (
	// ReasonSummaryParams: its sidecar's summary parameters are not the
	// fleet's.
	ReasonSummaryParams = "summary_params"
	// ReasonGroupFull: its identity group has no free slot.
	ReasonGroupFull = "group_full"
	// ReasonOtherOwner: another sidecar, whose stream is live, already
	// owns it.
	ReasonOtherOwner = "other_owner"
)

// Position is where the state's summary of one endpoint in one tier
// stands: a stream resumes from it.
type Position struct {
	Endpoint string
	Tier     tier.Tier
	Epoch    uint64
	Seq      uint64
}

// Registration is what Register did with a sidecar's endpoints.
type Registration struct {
	// Positions are the positions held for the endpoints taken, in the
	// order offered and by tier, for every tier with a complete summary.
	Positions []Position
	// Refused are the endpoints this call refused, in the order offered,
	// for the caller to count and log (they are also listed by Refused).
	Refused []Refused
}

// Register records the endpoints a sidecar serves, as it listed them now:
// endpoints it listed before and no longer does are dropped; each listed
// one is taken (assigned a slot in its identity group) or refused.
//
// An endpoint is refused when its summary parameters are not the fleet's
// (summary_params), when another sidecar owns it and liveOwner says that
// sidecar's stream is live (other_owner: the first owner keeps it), or
// when its group has no free slot (group_full). An endpoint whose owner
// has no live stream passes to the new sidecar; one whose identity
// changed moves to its new group; either way it starts over, with no
// summary. An endpoint kept by the same sidecar in the same group keeps
// its summaries and its positions, returned for the stream to resume
// from; its Identity is replaced. A nil liveOwner counts no other owner
// as live.
//
// The error is the index failing to grow, which a valid Config rules out.
func (s *State) Register(sidecar string, eps []Identity, liveOwner func(sidecar string) bool, now time.Time) (Registration, error) {
	var reg Registration
	listed := map[string]bool{}
	for _, id := range eps {
		listed[id.Endpoint] = true
	}
	for url, e := range s.endpoints { // endpoints the sidecar no longer serves
		if e.Sidecar == sidecar && !listed[url] {
			s.remove(url)
		}
	}
	for url, r := range s.refused {
		if r.Sidecar == sidecar && !listed[url] {
			delete(s.refused, url)
		}
	}
	refuse := func(id Identity, reason string) {
		r := Refused{Info: id, Sidecar: sidecar, Reason: reason}
		s.refused[id.Endpoint] = r
		reg.Refused = append(reg.Refused, r)
	}
	for _, id := range eps {
		if id.SummaryParams != s.params {
			refuse(id, ReasonSummaryParams)
			continue
		}
		gid := id.Group()
		e := s.endpoints[id.Endpoint]
		if e != nil && e.Sidecar != sidecar && liveOwner != nil && liveOwner(e.Sidecar) {
			refuse(id, ReasonOtherOwner)
			continue
		}
		if e != nil && (e.Group != gid || e.Sidecar != sidecar) {
			s.remove(id.Endpoint) // identity or owner changed
			e = nil
		}
		if e == nil {
			g := s.groups[gid]
			if g == nil {
				g = &group{}
				s.groups[gid] = g
			}
			slot := slices.Index(g.slots, "")
			if slot < 0 && len(g.slots) < s.cfg.Slots { // slots grow with the group, up to Config.Slots
				slot = len(g.slots)
				g.slots, g.held = append(g.slots, ""), append(g.held, nil)
			}
			if slot < 0 {
				refuse(id, ReasonGroupFull)
				continue
			}
			// Fleets hold 64 slots per row word; grow them as endpoints come.
			for _, f := range g.tiers {
				if f == nil || slot < f.Slots() {
					continue
				}
				if err := f.Grow(grownSlots(f.Slots(), slot+1, s.cfg.Slots)); err != nil {
					return reg, err
				}
			}
			g.slots[slot] = id.Endpoint
			e = &entry{Endpoint: Endpoint{URL: id.Endpoint, Sidecar: sidecar, Group: gid, Since: now}, slot: slot, g: g}
			g.held[slot] = e
			i, _ := slices.BinarySearchFunc(g.byURL, e.URL, byURL)
			g.byURL = slices.Insert(g.byURL, i, e)
			s.reseat(g)
			s.endpoints[id.Endpoint] = e
		}
		e.Info = id
		e.StreamState, e.StreamReason = id.StreamState, id.StreamReason
		e.SidecarLost, e.EngineAnswers = time.Time{}, false
		s.changed(e)
		delete(s.refused, id.Endpoint)
		reg.Positions = append(reg.Positions, s.positions(e)...)
	}
	return reg, nil
}

// grownSlots is the slots an index of have grows to when it needs need, at
// most limit: by half again at least, so that a group of n endpoints
// arriving one by one copies its index O(log n) times, not n/64 times (a
// thousand endpoints: 7 copies of up to 128 MiB, not 15); the index is
// then at most half again what its endpoints need.
func grownSlots(have, need, limit int) int {
	return min(max(need, have+have/2), limit)
}

// Positions returns the positions held for one endpoint, by tier, for
// every tier with a complete summary; none for an endpoint not held.
func (s *State) Positions(url string) []Position {
	e := s.endpoints[url]
	if e == nil {
		return nil
	}
	return s.positions(e)
}

func (s *State) positions(e *entry) []Position {
	g := s.groups[e.Group]
	var out []Position
	for t, f := range g.tiers {
		if f == nil {
			continue
		}
		if epoch, seq, ok := f.Position(e.slot); ok {
			out = append(out, Position{Endpoint: e.URL, Tier: tier.Tier(t), Epoch: epoch, Seq: seq})
		}
	}
	return out
}

// Forget drops every endpoint a sidecar owns from every index, and its
// refusals: the sidecar left or is no longer followed.
func (s *State) Forget(sidecar string) {
	for url, e := range s.endpoints {
		if e.Sidecar == sidecar {
			s.remove(url)
		}
	}
	for url, r := range s.refused {
		if r.Sidecar == sidecar {
			delete(s.refused, url)
		}
	}
}

// remove drops an endpoint from its group (and the group, once empty:
// its indexes' memory goes with it).
func (s *State) remove(url string) {
	e := s.endpoints[url]
	if e == nil {
		return
	}
	s.changed(e) // the group's roster loses it
	e.g = nil
	if g := s.groups[e.Group]; g != nil {
		for _, f := range g.tiers {
			if f != nil {
				f.Remove(e.slot)
			}
		}
		g.slots[e.slot], g.held[e.slot] = "", nil
		if i, ok := slices.BinarySearchFunc(g.byURL, url, byURL); ok {
			g.byURL = slices.Delete(g.byURL, i, i+1)
		}
		s.reseat(g)
		empty := true
		for _, u := range g.slots {
			empty = empty && u == ""
		}
		if empty {
			delete(s.groups, e.Group)
		}
	}
	delete(s.endpoints, url)
}

// held returns the endpoint at url if sidecar owns it, recording that an
// update arrived for it at now; nil if the state does not hold it for
// that sidecar (refused, forgotten, or another sidecar's).
func (s *State) held(sidecar, url string, now time.Time) *entry {
	e := s.endpoints[url]
	if e == nil || e.Sidecar != sidecar {
		return nil
	}
	e.LastUpdate = now
	s.changed(e)
	return e
}

// Touch records that an update with nothing to apply arrived at now for
// an endpoint the sidecar owns, and reports whether it owns it.
func (s *State) Touch(sidecar, url string, now time.Time) bool {
	return s.held(sidecar, url, now) != nil
}

// ApplyLoad records a load report that arrived at now, and reports
// whether it was applied (false: the sidecar does not own the endpoint;
// the report is ignored).
func (s *State) ApplyLoad(sidecar, url string, l Load, now time.Time) bool {
	e := s.held(sidecar, url, now)
	if e == nil {
		return false
	}
	e.Load, e.LoadAt = l, now
	if l.StreamState != "" {
		e.StreamState, e.StreamReason = l.StreamState, l.StreamReason
	}
	s.changed(e)
	return true
}

// Fault is why an update was not applied.
type Fault uint8

// The faults.
const (
	// Resync: a delta that does not follow the position held (one lost,
	// a new epoch, no snapshot yet). The endpoint's summary in that tier
	// is dropped until a snapshot comes: the stream must restart from the
	// positions held.
	Resync Fault = iota + 1
	// Malformed: an update that cannot be applied (no known tier, a flip
	// beyond m, a snapshot of other parameters). The endpoint's summary
	// in that tier is dropped so that nothing routes on a broken base.
	Malformed
)

func (f Fault) String() string {
	switch f {
	case Resync:
		return "resync"
	case Malformed:
		return "malformed"
	}
	return "unknown"
}

// UpdateError is an update the state did not apply.
type UpdateError struct {
	Fault    Fault
	Endpoint string
	Tier     tier.Tier
	Err      error // the cause
}

func (e *UpdateError) Error() string {
	return fmt.Sprintf("fleet: %s update of %s (tier %s): %v", e.Fault, e.Endpoint, e.Tier, e.Err)
}

func (e *UpdateError) Unwrap() error { return e.Err }

// FaultOf returns the fault an error reports: Resync or Malformed for an
// UpdateError (wrapped or not), 0 for any other error.
func FaultOf(err error) Fault {
	var ue *UpdateError
	if errors.As(err, &ue) {
		return ue.Fault
	}
	return 0
}

// newEpoch notes the engine epoch of a snapshot for e at now. A sidecar
// bumps an endpoint's epoch when its engine restarts (or clears its
// cache): the failures behind e's ejections were the old process's, so
// its ejection history starts over (the next ejection backs off
// EjectBase), and an ejection still running ends now — the new process
// is probed at once (ProbeDue) rather than after a backoff doubled for
// its predecessor.
func (s *State) newEpoch(e *entry, epoch uint64, now time.Time) {
	if e.hasEpoch && epoch != e.epoch {
		e.ejections, e.readmitted = 0, time.Time{}
		if e.Ejected && now.Before(e.EjectedUntil) {
			e.EjectedUntil = now
			s.changed(e)
		}
	}
	e.epoch, e.hasEpoch = epoch, true
}

// StartSnapshot starts replacing an endpoint's summary in tier t with snap
// (of epoch, at snap.Seq), arrived at now, and returns the load for the
// caller to step (summary.SnapshotLoad.Step) while it holds its lock,
// releasing it between steps if it likes: the endpoint reads as absent in
// that tier until the last step, and any change to the endpoint
// meanwhile abandons the load (summary.ErrAbandoned: the stream must
// restart). It returns nil, nil when the sidecar does not own the
// endpoint (the snapshot is ignored), and a Malformed UpdateError, the
// endpoint's summary in t dropped, when the snapshot cannot be applied.
// An invalid t (!t.Valid()) is malformed.
func (s *State) StartSnapshot(sidecar, url string, t tier.Tier, epoch uint64, snap summary.Snapshot, now time.Time) (*summary.SnapshotLoad, error) {
	e := s.held(sidecar, url, now)
	if e == nil {
		return nil, nil
	}
	s.newEpoch(e, epoch, now)
	f, err := s.fleet(e, t)
	if err != nil {
		return nil, s.fault(e, t, Malformed, err)
	}
	load, err := f.LoadSnapshot(e.slot, epoch, snap)
	if err != nil {
		f.Remove(e.slot)
		return nil, s.fault(e, t, Malformed, err)
	}
	return load, nil
}

// ApplyDelta applies a delta (of epoch) to an endpoint's summary in tier
// t, arrived at now, and reports whether it was applied: false with no
// error when the sidecar does not own the endpoint (ignored). A delta
// that does not follow the position held is a Resync UpdateError, one
// that cannot be applied (or an invalid t) a Malformed one; either way
// the endpoint's summary in t is dropped.
func (s *State) ApplyDelta(sidecar, url string, t tier.Tier, epoch uint64, d summary.Delta, now time.Time) (bool, error) {
	e := s.held(sidecar, url, now)
	if e == nil {
		return false, nil
	}
	f, err := s.fleet(e, t)
	if err != nil {
		return false, s.fault(e, t, Malformed, err)
	}
	if err := f.ApplyDelta(e.slot, epoch, d); err != nil {
		f.Remove(e.slot) // stale or broken: drop it until a snapshot arrives
		var se *summary.SeqError
		if errors.As(err, &se) {
			return false, s.fault(e, t, Resync, err)
		}
		return false, s.fault(e, t, Malformed, err)
	}
	return true, nil
}

func (s *State) fault(e *entry, t tier.Tier, f Fault, err error) error {
	return &UpdateError{Fault: f, Endpoint: e.URL, Tier: t, Err: err}
}

// fleet returns the index of e's group in tier t, made on first use and
// sized to the group's slots in use.
func (s *State) fleet(e *entry, t tier.Tier) (*summary.Fleet, error) {
	if !t.Valid() {
		return nil, errors.New("summary update without a known tier")
	}
	g := s.groups[e.Group]
	if f := g.tiers[t]; f != nil {
		return f, nil
	}
	used := 0
	for i, u := range g.slots {
		if u != "" {
			used = i + 1
		}
	}
	f, err := summary.NewFleet(s.cfg.Params, max(used, 1))
	if err != nil {
		return nil, err
	}
	g.tiers[t] = f
	return f, nil
}

// Match returns, for the endpoints of the group that hold a prefix of
// chain in tier t, its length in blocks (absent: none of it, so the map
// is as small as the prefix's holders, not the group); nil when the group
// holds no summary in t. The index searches over depth, which
// assumes prefix-closed caches; Match walks the leaders' chains to confirm
// them (DESIGN.md §6), longest first, until the longest match is a
// verified one, so a chain an endpoint holds with a gap reports only its
// verified prefix for the winner. Match only reads the state.
func (s *State) Match(groupID string, t tier.Tier, chain []blockkey.Key) map[string]int {
	g := s.groups[groupID]
	if g == nil || !t.Valid() || g.tiers[t] == nil {
		return nil
	}
	f := g.tiers[t]
	matched := make([]int, f.Slots())
	f.Match(chain, matched)
	matched = matched[:min(len(matched), len(g.slots))]
	verified := make([]bool, len(matched))
	for range matched {
		best, slot := 0, -1
		for sl, n := range matched {
			if n > best && !verified[sl] {
				best, slot = n, sl
			}
		}
		if slot < 0 {
			break
		}
		matched[slot], verified[slot] = f.Verify(chain, slot, best), true
		if matched[slot] == best {
			break // the longest match holds
		}
	}
	out := map[string]int{} // sparse: a request's prefix is held by few of a large group
	for slot, url := range g.slots {
		if url != "" && slot < len(matched) && matched[slot] > 0 {
			out[url] = matched[slot]
		}
	}
	return out
}

// Endpoints returns the endpoints held, sorted by URL: copies, safe to
// keep.
func (s *State) Endpoints() []Endpoint {
	out := make([]Endpoint, 0, len(s.endpoints))
	for _, e := range s.endpoints {
		out = append(out, e.Endpoint)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].URL < out[j].URL })
	return out
}

// GroupEndpoints returns the endpoints of one identity group, sorted by
// URL: copies, safe to keep; none for a group not held. Its cost is
// bounded by the group (its slots, at most Config.Slots), never by the
// fleet: a request reads only its own group's endpoints (issue 21).
// GroupEndpoints only reads the state.
func (s *State) GroupEndpoints(groupID string) []Endpoint {
	g := s.groups[groupID]
	if g == nil {
		return nil
	}
	out := make([]Endpoint, len(g.byURL))
	for i, e := range g.byURL {
		out[i] = e.Endpoint
	}
	return out
}

// Refused lists the endpoints offered but not taken, sorted by URL.
func (s *State) Refused() []Refused {
	out := make([]Refused, 0, len(s.refused))
	for _, r := range s.refused {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Info.Endpoint < out[j].Info.Endpoint })
	return out
}
