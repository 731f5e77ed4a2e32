package picker

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/admit"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
)

// How a request left admission: the results of
// kvroute_picker_admission_total.
const (
	admitDirect    = "admitted"  // not saturated, nobody waiting: no wait
	admitQueued    = "queued"    // waited, then released
	admitShed      = "shed"      // the queue was full of higher priorities: 429
	admitDisplaced = "displaced" // the queue was full; it made room for a newcomer: 429
	admitExpired   = "expired"   // --queue-timeout passed: 429
	admitAbandoned = "abandoned" // its client left while it waited
	admitStopped   = "stopped"   // the picker shut down while it waited: 503
	admitAhead     = "ahead"     // saturated, but its key is well within its share: the engine runs it first (--engine-priority)
	// admitDecisionShed: a decision API request (Config.AdmitDecisions)
	// while its group was saturated or had requests waiting: 429 at once.
	admitDecisionShed = "decision_shed"
)

// PriorityHeader carries a request's priority band: a small integer,
// higher first, default 0.
const PriorityHeader = "X-Kvroute-Priority"

// maxPriority bounds a priority's magnitude.
const maxPriority = 100

// maxKeyLabels caps the fairness keys the admission metrics name; the
// rest are "other".
const maxKeyLabels = 32

// Fairness is a request's place in admission: its fairness key's source
// (the tenant header's value, else its cache_salt, else one shared key)
// and its priority band.
type Fairness struct {
	Tenant   string // the tenant header's value ("" none)
	Priority int
}

// fairnessOf reads a request's fairness headers: the tenant header
// (header), 1..128 visible ASCII characters, and PriorityHeader, an
// integer within ±maxPriority. A bad value is a 400.
func fairnessOf(h http.Header, header string) (Fairness, error) {
	var f Fairness
	if vs := h.Values(header); len(vs) > 0 {
		v := vs[0]
		if len(vs) > 1 || !visibleASCII(v, 128) {
			return f, &intake.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: header, Code: "invalid_tenant",
				Message: fmt.Sprintf("The %s header must be one value of 1 to 128 visible ASCII characters.", header)}
		}
		f.Tenant = v
	}
	if vs := h.Values(PriorityHeader); len(vs) > 0 {
		p, err := strconv.Atoi(vs[0])
		if len(vs) > 1 || err != nil || p < -maxPriority || p > maxPriority {
			return f, &intake.Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: PriorityHeader, Code: "invalid_priority",
				Message: fmt.Sprintf("The %s header must be one integer from %d to %d (higher goes first; default 0).", PriorityHeader, -maxPriority, maxPriority)}
		}
		f.Priority = p
	}
	return f, nil
}

func visibleASCII(s string, n int) bool {
	if len(s) == 0 || len(s) > n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// fairnessKey is the key a request is queued under, and the label its
// metrics carry (a salt only by its hash: a salt is a tenant's secret).
func fairnessKey(f Fairness, salt string) (key, label string) {
	switch {
	case f.Tenant != "":
		return "tenant\x00" + f.Tenant, "tenant:" + f.Tenant
	case salt != "":
		h := fmt.Sprintf("%016x", xxh3.HashString(salt))
		return "salt\x00" + h, "salt:" + h[:8]
	}
	return "shared", "shared"
}

// admission is the shell around the admission core (picker/admit): a
// queue per model group, one goroutine releasing waiters as the group
// gets room, the metrics, and one log line per saturation change. A nil
// *admission admits everything.
type admission struct {
	cfg admit.Config
	log *zap.Logger
	// load is the group's routable endpoints' loads at now: of eps, the
	// group's endpoints the caller has (nil: the fleet view's now).
	load func(group string, eps []*fleet.Endpoint, now time.Time) []admit.Load

	depth    *prometheus.GaugeVec     // by fairness key
	wait     *prometheus.HistogramVec // by fairness key
	results  *prometheus.CounterVec   // by fairness key, result
	satGauge *prometheus.GaugeVec     // by model

	wake chan struct{}
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	groups map[string]*admitGroup
	labels map[string]string // fairness key → metric label, at most maxKeyLabels
	nextID uint64
	closed bool
}

// admitGroup is one model group's admission state.
type admitGroup struct {
	model     string
	q         *admit.Queue
	waiters   map[uint64]*admitWaiter
	saturated bool
	releasing uint64    // the waiter released and not yet decided (0: none)
	released  time.Time // when
	rate      float64   // releases per second, smoothed
	last      time.Time // the last release
	standing  time.Time // since when the queue stands (zero: it does not)
}

type admitWaiter struct {
	ch     chan error // nil: go; else the refusal
	label  string
	queued time.Time
}

func newAdmission(cfg admit.Config, log *zap.Logger, reg prometheus.Registerer, load func(string, []*fleet.Endpoint, time.Time) []admit.Load) *admission {
	a := &admission{cfg: cfg, log: log, load: load, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		groups: map[string]*admitGroup{}, labels: map[string]string{}}
	a.depth = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "picker", Name: "queue_depth",
		Help: "Requests waiting for a saturated model group, by fairness key (tenant:NAME, salt:HASH, shared; past 32 keys, other)."}, []string{"fairness_key"})
	a.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kvroute", Subsystem: "picker", Name: "queue_wait_seconds",
		Help:    "How long requests released from the queue waited, by fairness key.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}}, []string{"fairness_key"})
	a.results = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "picker", Name: "admission_total",
		Help: "Requests by how they passed admission, by fairness key and result: admitted (no wait), queued (waited, then released), " +
			"shed (the queue was full of higher priorities: 429), displaced (the queue was full and it made room for a newcomer: 429), expired (--queue-timeout: 429), abandoned (the client left), stopped (shutdown: 503), " +
			"ahead (past a saturated group's queue, its key well within its share: --engine-priority), decision_shed (a decision API request while the model was saturated, with --admit-decisions: 429; decisions given are not counted here)."},
		[]string{"fairness_key", "result"})
	a.satGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "picker", Name: "model_saturated",
		Help: "1 while every routable endpoint of the model's group is saturated (requests queue in the picker), by model."}, []string{"model"})
	if reg != nil {
		reg.MustRegister(a.depth, a.wait, a.results, a.satGauge)
	}
	// The shared key (requests with no tenant and no salt) exists from the
	// start, so the dashboard's queue panels show 0 rather than nothing.
	a.depth.WithLabelValues("shared")
	a.wait.WithLabelValues("shared")
	go a.run()
	return a
}

// labelOf names key in the metrics (a.mu held).
func (a *admission) labelOf(key, label string) string {
	if l, ok := a.labels[key]; ok {
		return l
	}
	if len(a.labels) >= maxKeyLabels {
		return "other"
	}
	a.labels[key] = label
	return label
}

// poke wakes the releasing goroutine.
func (a *admission) poke() {
	if a == nil {
		return
	}
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// enter admits a request of group (for model) now, or queues it until the
// group has room, or refuses it. eps are the group's endpoints as the
// request's preparation saw them (its group's roster, judged on arrival
// without another read of the fleet). cost is its prompt tokens. On admission
// the caller decides and records its pick, then calls leave, which lets
// the next waiter go. The error is a refusal (429 or 503) or ctx's.
//
// ahead (--engine-priority, the key well within its share: standing.Ahead)
// lets the request past a saturated group's queue, since the engine runs
// it before the others' backlog; while some endpoint of the group has
// fewer than twice MaxWaiting requests queued (without a waiting limit,
// always), so the engines' queues stay bounded.
func (a *admission) enter(ctx context.Context, group, model string, eps []*fleet.Endpoint, f Fairness, salt string, cost float64, ahead bool) (leave func(), waited time.Duration, err error) {
	if a == nil {
		return func() {}, 0, nil
	}
	key, label := fairnessKey(f, salt)
	now := time.Now()
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return func() {}, 0, nil // shutting down: what is admitted now is served
	}
	label = a.labelOf(key, label)
	g := a.group(group, model)
	if g.q.Len() == 0 && g.releasing == 0 && !a.judge(group, g, eps, now) {
		a.mu.Unlock()
		a.results.WithLabelValues(label, admitDirect).Inc()
		return func() {}, 0, nil
	}
	if ahead && a.roomAhead(group, eps, now) {
		a.mu.Unlock()
		a.results.WithLabelValues(label, admitAhead).Inc()
		return func() {}, 0, nil
	}
	a.nextID++
	id := a.nextID
	w := &admitWaiter{ch: make(chan error, 1), label: label, queued: now}
	out, displaced, ok := g.q.Push(admit.Waiter{ID: id, Key: key, Priority: f.Priority, Cost: cost, Arrived: now, Deadline: now.Add(a.cfg.QueueTimeout)})
	if !ok {
		retry := admit.RetryAfter(g.q.Len(), g.rateAt(now))
		a.mu.Unlock()
		a.results.WithLabelValues(label, admitShed).Inc()
		return nil, 0, queueFull(model, g.q.Len(), retry)
	}
	if displaced {
		a.refuseLocked(g, out.ID, admitDisplaced, displacedBy(model, admit.RetryAfter(g.q.Len(), g.rateAt(now))))
	}
	g.waiters[id] = w
	a.depth.WithLabelValues(label).Inc()
	a.mu.Unlock()
	a.poke()
	select {
	case err := <-w.ch:
		waited = time.Since(now)
		if err != nil {
			return nil, waited, err
		}
		a.wait.WithLabelValues(label).Observe(waited.Seconds())
		return a.leaver(group, id), waited, nil
	case <-ctx.Done():
		a.mu.Lock()
		if g.q.Remove(id) {
			delete(g.waiters, id)
			a.depth.WithLabelValues(label).Dec()
			a.results.WithLabelValues(label, admitAbandoned).Inc()
			a.mu.Unlock()
			a.poke()
			return nil, time.Since(now), ctx.Err()
		}
		a.mu.Unlock()
		// Released or refused at the same moment: a release must still
		// be handed back.
		if err := <-w.ch; err == nil {
			a.leaver(group, id)()
		}
		return nil, time.Since(now), ctx.Err()
	}
}

// roomAhead reports whether a request going ahead of group's queue has
// an endpoint to go to: one with fewer than twice MaxWaiting queued (a.mu
// held).
func (a *admission) roomAhead(group string, eps []*fleet.Endpoint, now time.Time) bool {
	if a.cfg.MaxWaiting <= 0 {
		return true
	}
	for _, l := range a.load(group, eps, now) {
		if l.Queued < 2*a.cfg.MaxWaiting {
			return true
		}
	}
	return false
}

// check is admission for a request that does not wait (the decision API,
// Config.AdmitDecisions): admitted (nil) when group has room now and
// nobody waits; else refused at once, 429 with Retry-After, counted under
// its fairness key as decision_shed. A saturation change it sees is logged
// as enter's are. Retry-After is the queue's estimate while requests wait,
// else 1 s: the next load report may give room.
func (a *admission) check(group, model string, eps []*fleet.Endpoint, f Fairness, salt string) error {
	if a == nil {
		return nil
	}
	key, label := fairnessKey(f, salt)
	now := time.Now()
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	g := a.group(group, model)
	// Judged first, so a change is logged whether or not anyone waits.
	if sat := a.judge(group, g, eps, now); !sat && g.q.Len() == 0 {
		a.mu.Unlock()
		return nil
	}
	label = a.labelOf(key, label)
	retry := time.Second
	if n := g.q.Len(); n > 0 {
		retry = admit.RetryAfter(n, g.rateAt(now))
	}
	a.mu.Unlock()
	a.results.WithLabelValues(label, admitDecisionShed).Inc()
	return decisionShed(model, retry)
}

// leaver ends waiter id's release: the next may go.
func (a *admission) leaver(group string, id uint64) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			if g := a.groups[group]; g != nil && g.releasing == id {
				g.releasing = 0
			}
			a.mu.Unlock()
			a.poke()
		})
	}
}

// group returns group's state, made on first use (a.mu held).
func (a *admission) group(name, model string) *admitGroup {
	g := a.groups[name]
	if g == nil {
		g = &admitGroup{model: model, q: admit.NewQueue(a.cfg.QueueSize, a.cfg.LIFOAfter), waiters: map[uint64]*admitWaiter{}}
		a.groups[name] = g
		a.satGauge.WithLabelValues(model) // 0 from the first request: "not saturated" is a value
	}
	return g
}

// judge reports whether group is saturated now, and logs and exports a
// change (a.mu held).
func (a *admission) judge(name string, g *admitGroup, eps []*fleet.Endpoint, now time.Time) bool {
	sat := a.cfg.Saturated(a.load(name, eps, now))
	if sat != g.saturated {
		g.saturated = sat
		if sat {
			a.satGauge.WithLabelValues(g.model).Set(1)
			a.log.Info("model group saturated: requests wait in the picker's queue", zap.String("model", g.model),
				zap.Float64("max_waiting", a.cfg.MaxWaiting), zap.Float64("max_kv_usage", a.cfg.MaxKVUsage),
				zap.Float64("max_prefill_tokens", a.cfg.MaxPrefillTokens))
		} else {
			a.satGauge.WithLabelValues(g.model).Set(0)
			a.log.Info("model group no longer saturated", zap.String("model", g.model), zap.Int("waiting", g.q.Len()))
		}
	}
	return sat
}

// refuseLocked takes waiter id out with err (a.mu held; the queue no
// longer holds it).
func (a *admission) refuseLocked(g *admitGroup, id uint64, result string, err error) {
	w := g.waiters[id]
	if w == nil {
		return
	}
	delete(g.waiters, id)
	a.depth.WithLabelValues(w.label).Dec()
	a.results.WithLabelValues(w.label, result).Inc()
	w.ch <- err
}

// rateAt is the smoothed release rate, decayed by the time since the
// last release.
func (g *admitGroup) rateAt(now time.Time) float64 {
	if g.last.IsZero() {
		return 0
	}
	return g.rate * math.Exp(-now.Sub(g.last).Seconds()/5)
}

// tick is how often the releasing goroutine looks without being woken:
// load reports arrive on their own.
const admitTick = 20 * time.Millisecond

func (a *admission) run() {
	defer close(a.done)
	t := time.NewTicker(admitTick)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-a.wake:
		case <-t.C:
		}
		a.release(time.Now())
	}
}

// release expires waiters past their deadline and lets the next waiter of
// each group with room go, one at a time: the next is judged once the
// last one's pick is recorded.
func (a *admission) release(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, g := range a.groups {
		for _, w := range g.q.Expire(now) {
			a.refuseLocked(g, w.ID, admitExpired, queueTimeout(g.model, a.cfg.QueueTimeout, admit.RetryAfter(g.q.Len(), g.rateAt(now))))
		}
		// A standing queue (its oldest older than LIFOAfter) for
		// StandingTimeout is overload, not a burst: who waited longer goes.
		stand := cmp.Or(a.cfg.LIFOAfter, a.cfg.StandingTimeout)
		if old, ok := g.q.Oldest(); ok && stand > 0 && now.Sub(old) >= stand {
			if g.standing.IsZero() {
				g.standing = now
			}
		} else {
			g.standing = time.Time{}
		}
		if st := a.cfg.StandingTimeout; st > 0 && !g.standing.IsZero() && now.Sub(g.standing) >= st {
			for _, w := range g.q.ExpireArrived(now.Add(-st)) {
				a.refuseLocked(g, w.ID, admitExpired, queueTimeout(g.model, st, admit.RetryAfter(g.q.Len(), g.rateAt(now))))
			}
		}
		if g.releasing != 0 {
			if now.Sub(g.released) < time.Second {
				continue
			}
			g.releasing = 0 // its request never came back: do not stall the group
		}
		sat := a.judge(name, g, nil, now)
		if g.q.Len() == 0 {
			if !sat {
				delete(a.groups, name)
			}
			continue
		}
		if sat {
			continue
		}
		w, _ := g.q.Pop(now)
		g.releasing, g.released = w.ID, now
		if !g.last.IsZero() {
			g.rate = g.rateAt(now) + 1/5.0 // an exponentially decaying count over ~5 s
		} else {
			g.rate = 1 / 5.0
		}
		g.last = now
		if wt := g.waiters[w.ID]; wt != nil {
			delete(g.waiters, w.ID)
			a.depth.WithLabelValues(wt.label).Dec()
			a.results.WithLabelValues(wt.label, admitQueued).Inc()
			wt.ch <- nil
		}
	}
}

// close refuses every waiter (503: another picker can take it) and stops
// the releasing goroutine; requests arriving later are admitted at once.
func (a *admission) close() {
	if a == nil {
		return
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	for _, g := range a.groups {
		for {
			w, ok := g.q.Pop(time.Time{})
			if !ok {
				break
			}
			a.refuseLocked(g, w.ID, admitStopped, &intake.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "shutting_down",
				Message: "This picker is shutting down; send the request again (another replica will take it)."})
		}
	}
	a.mu.Unlock()
	close(a.stop)
	<-a.done
}

// snapshot is the admission state for /debug: per model, the waiters by
// fairness label and whether it is saturated.
func (a *admission) snapshot() []AdmissionState {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]AdmissionState, 0, len(a.groups))
	for _, g := range a.groups {
		st := AdmissionState{Model: g.model, Saturated: g.saturated, Waiting: g.q.Len(), ByKey: map[string]int{}}
		for _, w := range g.waiters {
			st.ByKey[w.label]++
		}
		out = append(out, st)
	}
	return out
}

// AdmissionState is one model group's admission, as /debug shows it.
type AdmissionState struct {
	Model     string         `json:"model"`
	Saturated bool           `json:"saturated"`
	Waiting   int            `json:"waiting"`
	ByKey     map[string]int `json:"by_fairness_key"`
}

func queueFull(model string, waiting int, retry time.Duration) *intake.Error {
	return &intake.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Code: "queue_full", RetryAfter: retry,
		Message: fmt.Sprintf("Every endpoint serving the model %q is saturated and the picker's queue for it is full (%d waiting, of higher priority); retry after %d s.",
			model, waiting, int(retry.Seconds()))}
}

func decisionShed(model string, retry time.Duration) *intake.Error {
	return &intake.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Code: "model_saturated", RetryAfter: retry,
		Message: fmt.Sprintf("Every endpoint serving the model %q is saturated (or requests for it are waiting in the picker's queue): no decision now; retry after %d s.",
			model, int(retry.Seconds()))}
}

func queueTimeout(model string, timeout, retry time.Duration) *intake.Error {
	return &intake.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Code: "queue_timeout", RetryAfter: retry,
		Message: fmt.Sprintf("Every endpoint serving the model %q stayed saturated for the %v this request may wait now; retry after %d s.",
			model, timeout, int(retry.Seconds()))}
}

func displacedBy(model string, retry time.Duration) *intake.Error {
	return &intake.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Code: "queue_displaced", RetryAfter: retry,
		Message: fmt.Sprintf("Every endpoint serving the model %q is saturated and the picker's queue for it is full: this request made room for a newer one; retry after %d s.",
			model, int(retry.Seconds()))}
}

// debugAdmission is /debug/admission.
type debugAdmission struct {
	Limits struct {
		MaxWaiting       float64 `json:"saturation_waiting"`
		MaxKVUsage       float64 `json:"saturation_kv_usage"`
		MaxPrefillTokens float64 `json:"saturation_prefill_tokens"`
		QueueSize        int     `json:"queue_size"`
		QueueTimeout     string  `json:"queue_timeout"`
	} `json:"limits"`
	Models []AdmissionState `json:"models"`
}

// handleDebugAdmission lists the model groups admission holds state for:
// saturated ones, and those with requests waiting.
func (r *Router) handleDebugAdmission(w http.ResponseWriter, _ *http.Request) {
	var d debugAdmission
	c := r.cfg.Admission
	d.Limits.MaxWaiting, d.Limits.MaxKVUsage, d.Limits.MaxPrefillTokens = c.MaxWaiting, c.MaxKVUsage, c.MaxPrefillTokens
	d.Limits.QueueSize, d.Limits.QueueTimeout = c.QueueSize, c.QueueTimeout.String()
	d.Models = r.admit.snapshot()
	slices.SortFunc(d.Models, func(a, b AdmissionState) int { return strings.Compare(a.Model, b.Model) })
	writeJSON(w, http.StatusOK, d)
}
