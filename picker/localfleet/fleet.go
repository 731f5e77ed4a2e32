package localfleet

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
)

// ErrNotFollowed is Register's refusal of an endpoint whose model is not
// among Config.Models.
var ErrNotFollowed = errors.New("localfleet: the endpoint's model is not among the models followed")

// SidecarPrefix starts the sidecar name every endpoint is registered
// under (fleet.Endpoint.Sidecar): one in-process sidecar per endpoint,
// named SidecarPrefix + its URL.
const SidecarPrefix = "inproc:"

// Fleet is a picker's fleet fed in-process: the fleet state core
// (picker/fleet.State) with the updates a sidecar would stream to it,
// handed over as values. It owns the sidecars of the endpoints added with
// Add (Apply feeds their events, Publish streams their updates) and takes
// the updates of sidecars it does not own (Register, Receive). It is safe
// for concurrent use: one RWMutex, the reads under its read lock.
type Fleet struct {
	cfg    Config
	models map[string]bool // nil: every model

	mu    sync.RWMutex
	state *fleet.State
	// rosterMu serialises the state's Roster calls (under mu's read
	// lock): the core keeps the rosters it builds.
	rosterMu sync.Mutex
	own      map[string]*Sidecar // by endpoint URL: the sidecars Add made
}

// New returns an empty fleet. cfg must be valid (see Config).
func New(cfg Config) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	state, err := fleet.New(fleet.Config{Params: cfg.Params, Slots: cfg.Slots})
	if err != nil {
		return nil, err
	}
	cfg.Models = slices.Clone(cfg.Models)
	f := &Fleet{cfg: cfg, state: state, own: map[string]*Sidecar{}}
	if len(cfg.Models) > 0 {
		f.models = map[string]bool{}
		for _, m := range cfg.Models {
			f.models[m] = true
		}
	}
	return f, nil
}

// Add makes the in-process sidecar of the engine id describes (NewSidecar,
// with the fleet's summary parameters) and registers its endpoint at now.
// An endpoint already added is an error: Remove it first (a new engine
// process of the same endpoint is Restart).
func (f *Fleet) Add(id fleet.Identity, now time.Time) error {
	sc, err := NewSidecar(id, f.cfg.Params)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.own[id.Endpoint] != nil {
		return fmt.Errorf("localfleet: %s added twice", id.Endpoint)
	}
	if err := f.register(sc.Identity(), now); err != nil {
		return err
	}
	f.own[id.Endpoint] = sc
	return nil
}

// Register records an endpoint whose sidecar the fleet does not own (a
// Sidecar shared by several fleets, as the lab's pickers share an
// engine's sidecar), as fleetview registers a sidecar's endpoint: its
// summaries come through Receive. It returns ErrNotFollowed for a model
// not followed, and the state's refusal (other summary parameters, a full
// group) as an error. Registering an endpoint again replaces its identity
// and keeps its summaries while its identity group stays the same.
func (f *Fleet) Register(id fleet.Identity, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.register(id, now)
}

func (f *Fleet) register(id fleet.Identity, now time.Time) error {
	if f.models != nil && !f.models[id.Model] {
		return fmt.Errorf("%w: %s serves %q", ErrNotFollowed, id.Endpoint, id.Model)
	}
	reg, err := f.state.Register(SidecarPrefix+id.Endpoint, []fleet.Identity{id}, nil, now)
	if err != nil {
		return err
	}
	if len(reg.Refused) > 0 {
		return fmt.Errorf("localfleet: %s refused: %s", id.Endpoint, reg.Refused[0].Reason)
	}
	return nil
}

// Remove drops an endpoint, and its sidecar when the fleet owns it.
func (f *Fleet) Remove(url string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state.Forget(SidecarPrefix + url)
	delete(f.own, url)
}

// Sidecar returns the sidecar Add made for url, nil for none. It is the
// fleet's: use it only while no other goroutine calls the fleet.
func (f *Fleet) Sidecar(url string) *Sidecar {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.own[url]
}

// Apply feeds one batch of the engine's KV events to the sidecar of url
// (Sidecar.Apply), at now. The fleet state sees them at the next Publish:
// the two steps are apart so that a caller can model the delay between an
// event and the picker routing on it; Update does both.
func (f *Fleet) Apply(url string, b *kvevents.Batch, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sc := f.own[url]
	if sc == nil {
		return fmt.Errorf("localfleet: no sidecar for %s (Add it)", url)
	}
	return sc.Apply(b, now)
}

// Update is Apply then the publishing of url's sidecar alone: the batch
// is routable on return.
func (f *Fleet) Update(url string, b *kvevents.Batch, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sc := f.own[url]
	if sc == nil {
		return fmt.Errorf("localfleet: no sidecar for %s (Add it)", url)
	}
	return errors.Join(sc.Apply(b, now), f.publish(sc, now))
}

// Publish streams what every owned sidecar has taken since the last
// Publish (Sidecar.Take) to the fleet state, arrived at now, as the
// sidecar's delta tick and the view's stream do, endpoint by endpoint in
// URL order. An update the state refuses (which in-order delivery rules
// out) is answered as a restarted stream is: with the sidecar's
// snapshots; the error says so.
func (f *Fleet) Publish(now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for _, url := range slices.Sorted(maps.Keys(f.own)) {
		errs = append(errs, f.publish(f.own[url], now))
	}
	return errors.Join(errs...)
}

// publish hands sc's updates to the state. Callers hold f.mu.
func (f *Fleet) publish(sc *Sidecar, now time.Time) error {
	for _, u := range sc.Take() {
		if err := f.receive(u, now); err != nil {
			errs := []error{err}
			for _, s := range sc.Snapshots() { // they hold every delta just taken
				errs = append(errs, f.receive(s, now))
			}
			return errors.Join(errs...)
		}
	}
	return nil
}

// Receive hands one update to the fleet state, arrived at now, as
// fleetview's stream does: a snapshot is loaded whole (the endpoint reads
// as absent in that tier until then: here, at once), a delta applied, an
// update with neither only heard (a heartbeat: it keeps an endpoint fresh
// when the fleet is not InSync). An update for an endpoint the fleet does
// not hold is ignored. A delta that
// does not follow the position held (lost, reordered, of an old epoch) or
// a malformed update drops the endpoint's summary in that tier and is
// returned as the state's fleet.UpdateError (fleet.FaultOf): the caller
// then delivers the sidecar's Snapshots, as a restarted stream would.
func (f *Fleet) Receive(u Update, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.receive(u, now)
}

func (f *Fleet) receive(u Update, now time.Time) error {
	sidecar := SidecarPrefix + u.Endpoint
	switch {
	case u.Snapshot != nil:
		load, err := f.state.StartSnapshot(sidecar, u.Endpoint, u.Tier, u.Epoch, *u.Snapshot, now)
		if load == nil || err != nil {
			return err
		}
		_, err = load.Step(len(u.Snapshot.Words)) // whole: nothing reads between steps
		return err
	case u.Delta != nil:
		ok, err := f.state.ApplyDelta(sidecar, u.Endpoint, u.Tier, u.Epoch, *u.Delta, now)
		if ok && !u.Oldest.IsZero() {
			f.state.RecordLag(u.Endpoint, now.Sub(u.Oldest))
		}
		return err
	}
	f.state.Touch(sidecar, u.Endpoint, now)
	return nil
}

// SetLoad records the engine's load at url as its sidecar's load report,
// arrived at now (the real sidecar scrapes the engine's /metrics every
// 100–250 ms; here the caller gives the figures). It reports whether the
// fleet holds the endpoint.
func (f *Fleet) SetLoad(url string, l fleet.Load, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.ApplyLoad(SidecarPrefix+url, url, l, now)
}

// Restart clears the owned sidecar of url for a new engine process (a new
// epoch: the next Publish sends its summaries as snapshots).
func (f *Fleet) Restart(url string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	sc := f.own[url]
	if sc == nil {
		return fmt.Errorf("localfleet: no sidecar for %s (Add it)", url)
	}
	sc.Restart()
	return nil
}

// ReportFailure is the picker's passive outlier detection
// (picker.Fleet): a failure reaching the engine at url ejects its
// endpoint at Clock() for the backoff of Config.Health, as fleetview
// does. Probe readmits it.
func (f *Fleet) ReportFailure(url, reason string) {
	now := f.cfg.Clock()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state.Failed(url, now, reason, f.cfg.Health)
}

// Probe is the readmission probe fleetview runs every tick, with answers
// standing for the engine's /health: each ejected endpoint whose backoff
// has ended at now is readmitted when answers(url) is true and ejected
// again, with a longer backoff, when it is false. It returns the URLs
// probed, sorted. An in-process fleet has no goroutine to probe on its
// own: an ejected endpoint stays out until a Probe.
func (f *Fleet) Probe(now time.Time, answers func(url string) bool) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	due := f.state.ProbeDue(now)
	for _, url := range due {
		f.state.Probed(url, answers(url), now, "health probe: the engine does not answer", f.cfg.Health)
	}
	return due
}

// Endpoints lists every endpoint held, sorted by URL (picker.Fleet).
func (f *Fleet) Endpoints() []fleet.Endpoint {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.fresh(f.state.Endpoints())
}

// GroupEndpoints lists one identity group's endpoints, sorted by URL, at
// a cost bounded by the group (picker.Fleet).
func (f *Fleet) GroupEndpoints(group string) []fleet.Endpoint {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.fresh(f.state.GroupEndpoints(group))
}

// Roster returns one identity group's endpoints as the state last
// published them (fleet.State.Roster), shared and immutable; nil for a
// group not held. In sync, the endpoints not heard from at Clock() are
// copies stamped so, with their briefs (the state's roster is never
// changed); the roster's Version and Membership are the state's.
func (f *Fleet) Roster(group string) *fleet.Roster {
	f.mu.RLock()
	defer f.mu.RUnlock()
	f.rosterMu.Lock()
	r := f.state.Roster(group)
	f.rosterMu.Unlock()
	if r == nil || !f.cfg.InSync {
		return r
	}
	now := f.cfg.Clock()
	out := r.Clone()
	for i, e := range r.Endpoints {
		if e.LastUpdate.Before(now) {
			c := *e
			c.LastUpdate = now
			out.Endpoints[i], out.Briefs[i] = &c, c.Brief()
		}
	}
	return out
}

// fresh stamps eps as heard from at Clock() when the fleet is in sync.
func (f *Fleet) fresh(eps []fleet.Endpoint) []fleet.Endpoint {
	if !f.cfg.InSync {
		return eps
	}
	now := f.cfg.Clock()
	for i := range eps {
		if eps[i].LastUpdate.Before(now) {
			eps[i].LastUpdate = now
		}
	}
	return eps
}

// Match returns, for each endpoint of the group holding a prefix of chain
// in tier t, its matched length in blocks (fleet.State.Match;
// picker.Fleet).
func (f *Fleet) Match(group string, t tier.Tier, chain []blockkey.Key) map[string]int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.state.Match(group, t, chain)
}

// Models returns the models followed, none for every model
// (picker.Fleet).
func (f *Fleet) Models() []string { return slices.Clone(f.cfg.Models) }
