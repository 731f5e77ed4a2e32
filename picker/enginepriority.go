package picker

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fastjson"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/standing"
	"github.com/kvroute/kvroute/picker/tenant"
)

// priorityKey is the body member vLLM reads a request's priority from.
const priorityKey = "priority"

// enginePriority is the shell around package standing (Config.EnginePriority):
// one ledger per model group, under its own lock, and the engines that
// refused a priority (started without --scheduling-policy priority). A
// nil *enginePriority sets nothing.
type enginePriority struct {
	cfg standing.Config
	log *zap.Logger

	set     *prometheus.CounterVec // by standing: within, beyond
	within  prometheus.Counter     // set's series, resolved once
	beyond  prometheus.Counter
	refused *prometheus.CounterVec // by endpoint (or "all")

	mu      sync.Mutex
	groups  map[string]*standing.Ledger
	refuses map[string]bool // endpoints that refused a priority, logged once each
	perEP   bool            // name endpoints in refused (Config.PerEndpointMetrics)
}

func newEnginePriority(cfg Config, log *zap.Logger, reg prometheus.Registerer) *enginePriority {
	if !cfg.EnginePriority {
		return nil
	}
	ep := &enginePriority{cfg: cfg.Standing, log: log, groups: map[string]*standing.Ledger{}, refuses: map[string]bool{}, perEP: cfg.PerEndpointMetrics}
	ep.set = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "picker", Name: "engine_priority_total",
		Help: "Requests given an engine priority (--engine-priority), by their fairness key's standing against its fair share: within or beyond."}, []string{"standing"})
	ep.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "picker", Name: "engine_priority_refused_total",
		Help: "Requests an engine refused for their priority (it runs --scheduling-policy fcfs), each resent without one, by engine (all, unless --per-endpoint-metrics)."}, []string{"engine"})
	ep.within, ep.beyond = ep.set.WithLabelValues("within"), ep.set.WithLabelValues("beyond")
	if reg != nil {
		reg.MustRegister(ep.set, ep.refused)
	}
	return ep
}

// charge judges key's standing in group at now and charges it cost
// (prompt tokens).
func (ep *enginePriority) charge(group, key string, cost float64, now time.Time) standing.Standing {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	l := ep.groups[group]
	if l == nil {
		l, _ = standing.New(ep.cfg) // the config was validated with the router's
		ep.groups[group] = l
	}
	return l.Charge(key, cost, now)
}

// priority is the engine priority of a request of band whose key stands
// as s, counted.
func (ep *enginePriority) priority(band int, s standing.Standing) int {
	if s.Beyond {
		ep.beyond.Inc()
	} else {
		ep.within.Inc()
	}
	return standing.Priority(band, s)
}

// refusedBy records that endpoint refused a priority: counted, and
// logged the first time it does.
func (ep *enginePriority) refusedBy(endpoint string) {
	label := "all"
	if ep.perEP {
		label = endpoint
	}
	ep.refused.WithLabelValues(label).Inc()
	ep.mu.Lock()
	first := !ep.refuses[endpoint]
	if first && len(ep.refuses) < 4096 {
		ep.refuses[endpoint] = true
	}
	ep.mu.Unlock()
	if first {
		ep.log.Warn("an engine refused the request's priority: it does not run --scheduling-policy priority, which --engine-priority needs; its requests are resent without one",
			zap.String("endpoint", endpoint))
	}
}

// refusing lists the endpoints that refused a priority since the picker
// started, sorted (for /debug/endpoints).
func (ep *enginePriority) refusing() []string {
	if ep == nil {
		return nil
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	out := make([]string, 0, len(ep.refuses))
	for e := range ep.refuses {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

// priorityOf sets pick's engine priority (Config.EnginePriority) for a
// request prepared as p, admitted under opt, at now. A retry
// (opt.Priority set) is not charged again: it keeps its first priority.
func (r *Router) priorityOf(pick *Pick, p *Prepared, opt PickOptions, now time.Time) {
	if r.prio == nil {
		return
	}
	if opt.Priority != nil {
		v := *opt.Priority
		pick.Priority = &v
		return
	}
	st := p.standing // charged by Admit
	if st == nil {
		key, _ := fairnessKey(opt.Fairness, p.req.CacheSalt)
		s := r.prio.charge(p.group, key, admissionCost(p), now)
		st = &s
	}
	v := r.prio.priority(opt.Fairness.Priority, *st)
	pick.Priority = &v
}

// prioritizedBody is body with p's priority set; a body that is not a
// JSON object (not expected: the intake parsed it) goes as it is.
func (r *Router) prioritizedBody(p *Pick, body []byte) []byte {
	b, err := withPriority(body, *p.Priority)
	if err != nil {
		r.log.Debug("priority not set on the forwarded body", zap.String("endpoint", p.Endpoint), zap.Error(err))
		return body
	}
	return b
}

// withPriority returns body, a JSON object, with its priority member set
// to v: any priority the client sent is replaced (the picker decides it),
// as tenant.SetMembers sets members. A body that cannot hold one already
// (no "priority" and no escape in it), the common case, gets it spliced in
// before its closing brace, unparsed.
func withPriority(body []byte, v int) ([]byte, error) {
	if bytes.Contains(body, []byte(priorityKey)) || bytes.Contains(body, []byte(`\u`)) {
		return tenant.SetMembers(body, tenant.Int(priorityKey, v))
	}
	return spliceMember(body, 24, func(out []byte) []byte {
		return strconv.AppendInt(append(out, `"priority":`...), int64(v), 10)
	})
}

// withoutPriority returns body with no priority member (for an engine
// that refused one).
func withoutPriority(body []byte) []byte {
	var p fastjson.Parser
	val, err := p.ParseBytes(body)
	if err != nil {
		return body
	}
	o, err := val.Object()
	if err != nil {
		return body
	}
	for o.Get(priorityKey) != nil {
		o.Del(priorityKey)
	}
	return val.MarshalTo(nil)
}

// priorityRefusal reads resp, an engine's 400, and reports whether it
// refused the request's priority (vLLM's "Got priority N but Priority
// scheduling is not enabled."). The body it read is returned for the
// answer when it did not.
func priorityRefusal(resp *http.Response) (bool, []byte) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return bytes.Contains(b, []byte("Priority scheduling is not enabled")), b
}
