package fleetview

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/fleet"
)

// probeTimeout bounds one health probe of an engine.
const probeTimeout = 500 * time.Millisecond

// lostProbeEvery is how often an engine whose sidecar is lost is probed.
const lostProbeEvery = 500 * time.Millisecond

// healthMetrics are the view's health series.
type healthMetrics struct {
	v           *View
	transitions *prometheus.CounterVec
	ejections   prometheus.Counter
	probes      *prometheus.CounterVec
}

var (
	statesDesc = prometheus.NewDesc("kvroute_picker_endpoint_states", "Endpoints by health state (cached, load_only, draining, down).", []string{"state"}, nil)
	stateDesc  = prometheus.NewDesc("kvroute_picker_endpoint_state",
		"Each endpoint's health state, by engine (its URL): 1 for the current one (cached, load_only, draining, down); "+
			"with --per-endpoint-metrics also 0 for the others, else only the current one is exported.", []string{"engine", "state"}, nil)
)

func newHealthMetrics(v *View) healthMetrics {
	return healthMetrics{v: v,
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_picker_endpoint_transitions_total",
			Help: "Endpoint health transitions, by the state entered (dropped: the sidecar's grace period ended)."}, []string{"state"}),
		ejections: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_picker_ejections_total",
			Help: "Endpoints ejected by passive outlier detection (a failure reaching the engine)."}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvroute_picker_engine_probes_total",
			Help: "The picker's own health probes of engines (ejected ones before readmission, those whose sidecar is lost), by result."}, []string{"result"}),
	}
}

func (m healthMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.transitions, m.ejections, m.probes, m)
	for _, s := range fleet.HealthStates() {
		m.transitions.WithLabelValues(s.String())
	}
	m.transitions.WithLabelValues("dropped")
	for _, r := range []string{"ok", "failed"} {
		m.probes.WithLabelValues(r)
	}
}

func (m healthMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- statesDesc; ch <- stateDesc }

// Collect counts the endpoints by state, and gives each endpoint's state,
// when scraped: its current one at 1, and the others at 0 only with
// Config.PerEndpointMetrics (one series an endpoint, not four).
func (m healthMetrics) Collect(ch chan<- prometheus.Metric) {
	n := map[fleet.HealthState]int{}
	now := time.Now()
	for _, e := range m.v.Endpoints() {
		st := e.HealthAt(now, m.v.cfg.Health).State
		n[st]++
		for _, s := range fleet.HealthStates() {
			v := 0.0
			if s == st {
				v = 1
			} else if !m.v.cfg.PerEndpointMetrics {
				continue
			}
			ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, v, e.URL, s.String())
		}
	}
	for _, s := range fleet.HealthStates() {
		ch <- prometheus.MustNewConstMetric(statesDesc, prometheus.GaugeValue, float64(n[s]), s.String())
	}
}

// Health judges one endpoint now, as routing does.
func (v *View) Health(e *fleet.Endpoint) fleet.Health { return e.HealthAt(time.Now(), v.cfg.Health) }

// ReportFailure is the picker's passive outlier detection: a failure
// reaching an endpoint's engine (refused, reset, timed out, 502/503/504
// before any byte) ejects it for a backoff; it comes back after a
// successful probe. The transition is logged by the next judgement.
func (v *View) ReportFailure(url, reason string) {
	v.mu.Lock()
	ejected := v.state.Failed(url, time.Now(), reason, v.cfg.Health)
	v.mu.Unlock()
	if ejected {
		v.health.ejections.Inc()
		v.judge() // at once: the log and gauges need not wait for the tick
	}
}

// watchHealth judges every endpoint each HealthEvery: it logs every
// transition once, drops endpoints whose sidecar's grace ended, and probes
// the engines that need it (ejected ones whose backoff ended; those whose
// sidecar is lost), until ctx ends.
func (v *View) watchHealth(ctx context.Context) {
	t := time.NewTicker(v.cfg.HealthEvery)
	defer t.Stop()
	lastLost := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		v.judge()
		now := time.Now()
		v.mu.RLock()
		due := v.state.ProbeDue(now)
		var lost []string
		if now.Sub(lastLost) >= lostProbeEvery {
			lost, lastLost = v.state.Lost(), now
		}
		v.mu.RUnlock()
		v.probeAll(ctx, due, func(url string, err error) {
			reason := ""
			if err != nil {
				reason = "health probe: " + err.Error()
			}
			v.state.Probed(url, err == nil, time.Now(), reason, v.cfg.Health)
		})
		if len(due) > 0 {
			// At once, as ReportFailure does: a readmitted endpoint can fail
			// again before the next tick, and its transitions would go
			// unlogged and uncounted.
			v.judge()
		}
		v.probeAll(ctx, lost, func(url string, err error) { v.state.EngineAnswered(url, err == nil) })
	}
}

// probeParallel bounds the health probes in flight at once: a round of
// probes takes about one probeTimeout however many engines hang.
const probeParallel = 16

// probeAll probes urls' engines, at most probeParallel at a time, and
// hands each result to record under the write lock; it returns when every
// probe has.
func (v *View) probeAll(ctx context.Context, urls []string, record func(url string, err error)) {
	sem := make(chan struct{}, probeParallel)
	var wg sync.WaitGroup
	for _, url := range urls {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := v.probeEngine(ctx, url)
			v.mu.Lock()
			record(url, err)
			v.mu.Unlock()
			v.countProbe(err)
		}()
	}
	wg.Wait()
}

func (v *View) countProbe(err error) {
	if err != nil {
		v.health.probes.WithLabelValues("failed").Inc()
	} else {
		v.health.probes.WithLabelValues("ok").Inc()
	}
}

// judge runs one judgement and logs its transitions.
func (v *View) judge() {
	v.mu.Lock()
	tr := v.state.Judge(time.Now(), v.cfg.Health)
	v.mu.Unlock()
	for _, t := range tr {
		to := t.To.State.String()
		if t.Dropped {
			to = "dropped"
		}
		v.health.transitions.WithLabelValues(to).Inc()
		fields := []zap.Field{zap.String("endpoint", t.Endpoint), zap.String("from", t.From.State.String()), zap.String("to", to)}
		if t.To.Reason != "" {
			fields = append(fields, zap.String("reason", t.To.Reason))
		}
		switch {
		case t.To.State == fleet.Cached:
			v.log.Info("endpoint healthy: routed with cache knowledge", fields...)
		case t.To.State == fleet.Draining:
			v.log.Info("endpoint draining: no new requests, those in flight finish", fields...)
		case t.Dropped && t.From.State == fleet.Draining:
			v.log.Info("drained endpoint gone", fields...)
		default:
			v.log.Warn("endpoint health changed", fields...)
		}
	}
}

// probeEngine asks an engine's /health.
func (v *View) probeEngine(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := v.probe.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &statusError{resp.StatusCode}
	}
	return nil
}

type statusError struct{ status int }

func (e *statusError) Error() string { return "/health: status " + http.StatusText(e.status) }
