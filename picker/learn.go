package picker

import (
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/predict"
)

// learner is the router's TTFT models, one per identity group
// (picker/predict), under their own lock: a decision reads a group's fit
// and its endpoints' factors into the snapshot, and the first token of
// every request the picker carries teaches the model it was predicted
// by; a nil learner (a router built by hand) keeps the prior and learns
// nothing. The engines' counters in the load reports are read at snapshot
// time, so a report teaches the model once it is seen.
//
// A decision reads its endpoints' factors index for index with its
// roster (decide.Snapshot.Factors). They are kept per group with the
// roster they were made for, and made again only for the endpoints whose
// copy in the roster changed since (fleet.Roster: an endpoint that did
// not change keeps its copy, so its counters were taken already), or all
// of them once the model learned from a first token.
type learner struct {
	cfg    predict.Config
	mu     sync.Mutex
	groups map[string]*predict.Model
	made   map[string]*factors // by group
}

// factors are a group's endpoints' learned factors, index for index with
// ro's endpoints, as the model stood after learns observations of the
// group. Shared by the snapshots given them: read only.
type factors struct {
	ro     *fleet.Roster
	learns uint64
	of     []predict.Endpoint
}

func newLearner(cfg predict.Config) *learner {
	return &learner{cfg: cfg, groups: map[string]*predict.Model{}, made: map[string]*factors{}}
}

// model is group's model, made at the prior on first use. Under mu.
func (l *learner) model(group string) *predict.Model {
	m := l.groups[group]
	if m == nil {
		m, _ = predict.New(l.cfg) // the config was validated with the router's
		l.groups[group] = m
	}
	return m
}

// into fills snap's model fields for group's endpoints, taking their
// engines' latest counters first.
func (l *learner) into(snap *decide.Snapshot, group string) {
	if l == nil { // a router built by hand (tests): the prior
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.model(group)
	snap.Factors = l.factors(m, group, snap.Roster)
	coef := m.Coefficients()
	snap.Model = &coef
	snap.MeanTokens = m.MeanTokens()
}

// factors are ro's endpoints' factors in m, their engines' counters
// reported first: those made for the group's last roster when ro is it,
// or shares its endpoints and the model has not learned since, with the
// endpoints whose copy changed reported and made again. Under mu.
func (l *learner) factors(m *predict.Model, group string, ro *fleet.Roster) []predict.Endpoint {
	if ro == nil {
		return nil
	}
	learns := uint64(m.Observations())
	last := l.made[group]
	if last != nil && last.ro == ro && last.learns == learns {
		return last.of
	}
	var of []predict.Endpoint
	if last != nil && ro.Version != 0 && last.ro.Version != 0 && last.ro.Membership == ro.Membership && last.learns == learns {
		of = slices.Clone(last.of) // the same endpoints in the same places
		for i, e := range ro.Endpoints {
			if e != last.ro.Endpoints[i] {
				of[i] = learn(m, e)
			}
		}
	} else {
		of = make([]predict.Endpoint, len(ro.Endpoints))
		for i, e := range ro.Endpoints {
			of[i] = learn(m, e)
		}
	}
	if ro.Version != 0 { // a roster of the fleet's, not a part of one
		l.made[group] = &factors{ro: ro, learns: learns, of: of}
	}
	return of
}

// learn reports e's engine's counters to m, and returns its factors.
func learn(m *predict.Model, e *fleet.Endpoint) predict.Endpoint {
	if e.Load.Engine.Have {
		m.Report(e.URL, e.Load.Engine)
	}
	return m.Endpoint(e.URL)
}

// observe teaches group's model one request's TTFT and returns what it
// had predicted.
func (l *learner) observe(group, url string, f predict.Features, ttft time.Duration) float64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.model(group).Observe(url, f, ttft.Seconds())
}

// state is every group's model, for /debug.
func (l *learner) state() map[string]predict.State {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]predict.State, len(l.groups))
	for g, m := range l.groups {
		out[g] = m.State()
	}
	return out
}

// TTFTModels is what the router's TTFT models learned, by identity group:
// their coefficients, observations, error and endpoints (as
// /debug/endpoints shows them).
func (r *Router) TTFTModels() map[string]predict.State { return r.learn.state() }
