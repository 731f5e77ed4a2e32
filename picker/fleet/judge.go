package fleet

import (
	"slices"
	"time"
)

// LoseSidecar records that the sidecar owning some endpoints is lost (its
// stream ended for good, or gossip declared it dead) at now. Its endpoints
// stay, load-only while their engines answer the picker's health probe
// (EngineAnswered), until Judge drops them after HealthConfig.SidecarGrace;
// a sidecar that registers them again takes them back. Its refusals go.
// Until the first probe answers, an engine counts as answering unless its
// sidecar last reported it down.
func (s *State) LoseSidecar(sidecar string, now time.Time) {
	for _, e := range s.endpoints {
		if e.Sidecar == sidecar && e.SidecarLost.IsZero() {
			e.SidecarLost, e.EngineAnswers = now, !e.Load.EngineDown
			s.changed(e)
		}
	}
	for url, r := range s.refused {
		if r.Sidecar == sidecar {
			delete(s.refused, url)
		}
	}
}

// Lost lists the URLs of endpoints whose sidecar is lost: the engines the
// shell probes.
func (s *State) Lost() []string {
	var out []string
	for url, e := range s.endpoints {
		if !e.SidecarLost.IsZero() {
			out = append(out, url)
		}
	}
	slices.Sort(out)
	return out
}

// EngineAnswered records the picker's own health probe of an engine whose
// sidecar is lost.
func (s *State) EngineAnswered(url string, ok bool) {
	if e := s.endpoints[url]; e != nil && !e.SidecarLost.IsZero() {
		e.EngineAnswers = ok
		s.changed(e)
	}
}

// Failed records a failure reaching an endpoint's engine at now (the
// picker's passive outlier detection): the endpoint is ejected for
// EjectBase, doubled for each ejection since it last stayed in for
// EjectMax, at most EjectMax. An endpoint already ejected is not ejected
// again (its backoff runs). It reports whether this call ejected it.
func (s *State) Failed(url string, now time.Time, reason string, c HealthConfig) bool {
	e := s.endpoints[url]
	if e == nil || e.Ejected {
		return false
	}
	if !e.readmitted.IsZero() && now.Sub(e.readmitted) > c.EjectMax {
		e.ejections = 0
	}
	backoff := c.EjectBase
	for i := 0; i < e.ejections && backoff < c.EjectMax; i++ {
		backoff *= 2
	}
	e.ejections++
	e.Ejected, e.EjectedUntil, e.EjectReason = true, now.Add(min(backoff, c.EjectMax)), reason
	s.changed(e)
	return true
}

// ProbeDue lists the ejected endpoints whose backoff has ended at now: the
// engines the shell probes before readmitting them.
func (s *State) ProbeDue(now time.Time) []string {
	var out []string
	for url, e := range s.endpoints {
		if e.Ejected && !now.Before(e.EjectedUntil) {
			out = append(out, url)
		}
	}
	slices.Sort(out)
	return out
}

// Probed records a readmission probe of an ejected endpoint at now: a
// success brings it back, a failure ejects it again with a longer backoff.
func (s *State) Probed(url string, ok bool, now time.Time, reason string, c HealthConfig) {
	e := s.endpoints[url]
	if e == nil || !e.Ejected || now.Before(e.EjectedUntil) {
		return
	}
	e.Ejected = false
	if ok {
		e.EjectedUntil, e.EjectReason, e.readmitted = time.Time{}, "", now
		s.changed(e)
		return
	}
	s.changed(e)
	e.readmitted = time.Time{} // still failing: the backoff keeps growing
	s.Failed(url, now, reason, c)
}

// RecordLag records one event-to-routable lag measured for an endpoint.
func (s *State) RecordLag(url string, d time.Duration) {
	e := s.endpoints[url]
	if e == nil {
		return
	}
	e.lags[e.nlag%lagRing] = max(d, 0)
	e.nlag++
	n := min(e.nlag, lagRing)
	recent := slices.Clone(e.lags[:n])
	slices.Sort(recent)
	e.Lag = recent[n/2]
	s.changed(e)
}

// Transition is one endpoint's health changing between two Judge calls;
// Dropped is set when the endpoint left the state (its sidecar's grace
// period ended).
type Transition struct {
	Endpoint string
	From, To Health
	Dropped  bool
}

// Judge judges every endpoint at now, drops those whose sidecar has been
// lost for longer than c.SidecarGrace, or lost after it announced a drain,
// and returns what changed since the
// previous call, sorted by endpoint: each endpoint whose state changed (a
// new reason within the same state is not a transition). A new endpoint
// is taken as Cached before it is judged.
func (s *State) Judge(now time.Time, c HealthConfig) []Transition {
	var out []Transition
	for url, e := range s.endpoints {
		if lost := !e.SidecarLost.IsZero(); lost && (e.Load.Draining || now.Sub(e.SidecarLost) > c.SidecarGrace) {
			why := "dropped: the sidecar is lost beyond the grace period"
			if e.Load.Draining {
				why = "dropped: the sidecar left after announcing a drain"
			}
			out = append(out, Transition{Endpoint: url, From: e.judged, To: Health{Down, why}, Dropped: true})
			s.remove(url)
			continue
		}
		h := e.HealthAt(now, c)
		if h.State != e.judged.State {
			out = append(out, Transition{Endpoint: url, From: e.judged, To: h})
		}
		e.judged = h
	}
	slices.SortFunc(out, func(a, b Transition) int {
		if a.Endpoint < b.Endpoint {
			return -1
		}
		if a.Endpoint > b.Endpoint {
			return 1
		}
		return 0
	})
	return out
}
