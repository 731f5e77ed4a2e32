package picker

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/predict"
)

// learner is the router's TTFT models, one per identity group
// (picker/predict), under their own lock: a decision reads a group's fit
// and its endpoints' factors into the snapshot, and the first token of
// every request the picker carries teaches the model it was predicted
// by; a nil learner (a router built by hand) keeps the prior and learns
// nothing. The engines' counters in the load reports are read at snapshot
// time, so a report teaches the model once it is seen.
type learner struct {
	cfg    predict.Config
	mu     sync.Mutex
	groups map[string]*predict.Model
}

func newLearner(cfg predict.Config) *learner {
	return &learner{cfg: cfg, groups: map[string]*predict.Model{}}
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
	eps := snap.Group()
	snap.Learned = make(map[string]predict.Endpoint, len(eps))
	for _, e := range eps {
		if e.Load.Engine.Have {
			m.Report(e.URL, e.Load.Engine)
		}
		snap.Learned[e.URL] = m.Endpoint(e.URL)
	}
	coef := m.Coefficients()
	snap.Model = &coef
	snap.MeanTokens = m.MeanTokens()
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
