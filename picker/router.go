package picker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/admit"
	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/inflight"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/pickapi"
	"github.com/kvroute/kvroute/picker/predict"
	"github.com/kvroute/kvroute/picker/render"
	"github.com/kvroute/kvroute/picker/score"
	"github.com/kvroute/kvroute/picker/standing"
	"github.com/kvroute/kvroute/picker/tenant"
)

// Unresolved policies: what to do with a request whose cache identity
// cannot be resolved exactly.
const (
	UnresolvedReject      = "reject"       // 400, code "unresolved_identity" (default)
	UnresolvedPreciseOnly = "precise-only" // score what is known exactly; the rest by load
	UnresolvedLoadOnly    = "load-only"    // route by load alone
)

// Config configures the router. Start from DefaultConfig: a zero field is
// invalid, not a default, and Validate says which (EngineAPIKey, optional,
// is the one exception: empty sends none).
type Config struct {
	Score score.Config
	// Predict is how the TTFT model learns (picker/predict): its prior,
	// forgetting and robustness.
	Predict predict.Config
	// Pulls lets precise name a KV source for the chosen engine to pull
	// the prefix from, out of another engine's CPU tier, when that is
	// predicted faster than recomputing (decide.Config.Pulls; both must
	// advertise a P2P side channel, the sidecars' --p2p-port). Default
	// true.
	Pulls bool
	// AnchorTokens is the anchor of a raw prompt (completions, token ids):
	// its first AnchorTokens tokens. Default 1024.
	AnchorTokens int
	// TokenizeTimeout bounds one render call; past it the request is
	// placed by consistent hashing on its raw anchor (counted). Default 2 s.
	TokenizeTimeout time.Duration
	// Unresolved is reject, precise-only or load-only. Default reject.
	Unresolved string
	// MaxBodyBytes bounds a request body. Default 16 MiB.
	MaxBodyBytes int64
	// Health holds the limits endpoint health is judged by: a summary
	// stale after --stale-summary (default 2 s) is routed by load only, an
	// endpoint silent for --down-after (10 s) is down, and one whose sidecar
	// is lost stays routable by load for --sidecar-grace (60 s) while its
	// engine answers the picker's health probe.
	Health fleet.HealthConfig
	// EngineAPIKey, when set, is sent as a bearer token on the picker's own
	// calls to engines (render, model lists), for engines started with
	// --api-key; proxied requests carry the client's own header.
	EngineAPIKey string
	// PrefillTokensPerSecond is an engine's prefill rate, used to age the
	// picks the engine's load report does not cover yet: a pick's queued
	// prefill work shrinks at this rate from the moment it was made.
	// Default 5,000.
	PrefillTokensPerSecond float64
	// PeerBookingLifetime bounds how long another picker's booking counts
	// in this picker's decisions (--peer-booking-lifetime): a booking
	// whose release was lost stops counting this long after its pick.
	// Default 30 s.
	PeerBookingLifetime time.Duration
	// PolicySeed seeds the random tie-breaks of a peer policy (llm-d,
	// llm-d-precise, dynamo, sglang: comparison baselines), so a bench run
	// is reproducible. kvroute's own policies draw no random numbers. Any
	// value is valid; default 1.
	PolicySeed uint64
	// ResponseHeaders is which x-kvroute-* headers proxied answers carry:
	// all (the engine's address too), decision (no pod address) or none.
	// The decision API is unaffected. Default all.
	ResponseHeaders string
	// AccessLog is the share of requests the access log records, one
	// info line each (never prompt text): 1 every one, 0 none. Default 1.
	AccessLog float64
	// PerEndpointMetrics (--per-endpoint-metrics) exports every series
	// that can name an endpoint with its engine label: in-flight requests,
	// stream aborts, KV sources, TTFT speed factors, and (the fleet view's
	// fleetview.Config.PerEndpointMetrics) every health state at 0 or 1.
	// Default false: an endpoint has three series (selected_total, its
	// current health state, its staleness) and the rest are summed over
	// the endpoints, so the series do not grow with the fleet.
	PerEndpointMetrics bool
	// Admission holds when a model group is saturated and how requests
	// wait for it (picker/admit; --saturation-*, --queue-size,
	// --queue-timeout). Every saturation limit 0 turns admission off.
	Admission admit.Config
	// FairnessHeader names the header whose value is a request's fairness
	// key (else its cache_salt, else one shared key). Default
	// x-kvroute-tenant.
	FairnessHeader string
	// TenantHeader, when set, names the header an authenticating gateway
	// sets to the request's tenant: the picker derives the request's
	// cache_salt from it, keyed (SetSalter, --salt-key-file), and it
	// replaces any salt the client sent, in the block keys, the
	// prefix_hash and the body forwarded to the engine. Default none: the
	// client's own cache_salt stands.
	TenantHeader string
	// RequireTenant refuses a request without TenantHeader (401). It
	// needs TenantHeader.
	RequireTenant bool
	// EnginePriority (--engine-priority) sets vLLM's priority on each
	// forwarded request (and on the decision API's answer): from the
	// request's band (PriorityHeader) first, then its fairness key's
	// standing against its fair share of the model group's recent prompt
	// tokens (package standing), so a key within its share outranks one
	// beyond it. The engines must run --scheduling-policy priority; one
	// that refuses the priority gets the request again without it
	// (counted, logged once). Default false: the client's body goes as
	// sent.
	EnginePriority bool
	// Standing is how the fair share is reckoned (package standing).
	Standing standing.Config
	// AdmitDecisions (--admit-decisions) puts the decision API under
	// admission: while a model group is saturated (or proxied requests
	// for it wait in the queue) a decision request for it is refused at
	// once, 429 rate_limit_exceeded model_saturated with Retry-After (gRPC:
	// RESOURCE_EXHAUSTED with a RetryInfo detail and retry-after
	// metadata), instead of a decision. It never waits. Default false: the
	// decision API always decides.
	AdmitDecisions bool
	// Clock is the router's time: its decisions, bookings and health
	// judgements run at Clock(). Default time.Now; the lab passes its
	// virtual clock. Request timing for metrics and logs stays wall time.
	Clock func() time.Time
	// Renderer, when set, renders requests in place of the engines'
	// render endpoints over HTTP (the lab renders in process, as an engine
	// would). Default nil: over HTTP, the one field where nil is the
	// default.
	Renderer Renderer
}

// Renderer gets a request's exact tokens from an engine (base, its URL)
// as the engine's render endpoints answer them (picker/render.Client
// over HTTP).
type Renderer interface {
	Render(ctx context.Context, base string, kind intake.Kind, body []byte) (render.Rendered, error)
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Score: score.DefaultConfig(), Predict: predict.DefaultConfig(), Pulls: true, AnchorTokens: 1024, TokenizeTimeout: 2 * time.Second,
		Unresolved: UnresolvedReject, MaxBodyBytes: 16 << 20, Health: fleet.DefaultHealthConfig(), PrefillTokensPerSecond: 5000, PeerBookingLifetime: 30 * time.Second,
		PolicySeed: 1, ResponseHeaders: HeadersAll, AccessLog: 1, Admission: admit.DefaultConfig(), FairnessHeader: "x-kvroute-tenant",
		Standing: standing.DefaultConfig(), Clock: time.Now}
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Score.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Predict.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.AnchorTokens < 1 {
		errs = append(errs, fmt.Errorf("--anchor-tokens %d: want at least 1", c.AnchorTokens))
	}
	if c.TokenizeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--tokenize-timeout %v: want a positive duration", c.TokenizeTimeout))
	}
	switch c.Unresolved {
	case UnresolvedReject, UnresolvedPreciseOnly, UnresolvedLoadOnly:
	default:
		errs = append(errs, fmt.Errorf("--unresolved %q: want reject, precise-only or load-only", c.Unresolved))
	}
	if c.MaxBodyBytes < 1024 {
		errs = append(errs, fmt.Errorf("--max-body-bytes %d: want at least 1024", c.MaxBodyBytes))
	}
	if !(c.PrefillTokensPerSecond > 0) {
		errs = append(errs, fmt.Errorf("prefill rate %v tokens/s: want a positive rate", c.PrefillTokensPerSecond))
	}
	if c.PeerBookingLifetime <= 0 {
		errs = append(errs, fmt.Errorf("--peer-booking-lifetime %v: want a positive duration", c.PeerBookingLifetime))
	}
	if err := c.Health.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Clock == nil {
		errs = append(errs, errors.New("router: no clock (DefaultConfig's is time.Now)"))
	}
	if err := validResponseHeaders(c.ResponseHeaders); err != nil {
		errs = append(errs, err)
	}
	if !(c.AccessLog >= 0 && c.AccessLog <= 1) {
		errs = append(errs, fmt.Errorf("--access-log %v: want the share of requests logged, 0 (off) to 1 (every one)", c.AccessLog))
	}
	if err := c.Admission.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !validHeaderName(c.FairnessHeader) {
		errs = append(errs, fmt.Errorf("--fairness-header %q: want a header name (letters, digits, '-')", c.FairnessHeader))
	}
	if c.TenantHeader != "" && !validHeaderName(c.TenantHeader) {
		errs = append(errs, fmt.Errorf("--tenant-header %q: want a header name (letters, digits, '-')", c.TenantHeader))
	}
	if c.EnginePriority {
		if err := c.Standing.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.RequireTenant && c.TenantHeader == "" {
		errs = append(errs, errors.New("--require-tenant needs --tenant-header: the header the tenant is named by"))
	}
	return errors.Join(errs...)
}

// validHeaderName reports whether s is a plain header name.
func validHeaderName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c == '-' || c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// Router decides where requests go. A route is five steps, each callable
// on its own (route.go): Prepare (the I/O: parse, resolve the model,
// render and key the tokens, within the request's context and the render
// timeout), Admit (with PickOptions.Admit, wait in the admission queue
// while the model group is saturated), Snapshot (what the decision sees
// of the fleet and of this picker's bookings, at now), Decide (the pure
// decision, picker/decide, or a peer's policy) and Book (record the pick
// in flight). Prepare and Admit block; Snapshot, Decide and Book never
// wait on I/O. Route runs them in order and records the metrics once.
type Router struct {
	cfg    Config
	salter atomic.Pointer[tenant.Salter] // with Config.TenantHeader: the key's Salter (SetSalter)
	engKey atomic.Pointer[string]        // the engines' API key ("" none; SetEngineAPIKey)
	dcfg   decide.Config
	// scratch holds *decide.Scratch: the per-endpoint memory decisions
	// reuse, one per decision under way (decideIn).
	scratch sync.Pool
	log     *zap.Logger
	fleet   Fleet
	roster  rosters // fleet, when it publishes rosters (nil: copies per request)
	render  *render.Client
	coal    *render.Coalescer // identical renders in flight, shared
	parser  intake.Parser
	models  *modelDirectory
	proxy   *http.Client // requests to engines
	bufs    sync.Pool    // *[]byte copy buffers for answers
	m       *metrics

	accessLog *zap.Logger // the access log (Config.AccessLog)
	access    sampler

	counter atomic.Uint64 // round-robin position

	admit *admission      // the queue for saturated groups
	prio  *enginePriority // Config.EnginePriority (nil: off)

	bookings bookings // picks in flight and a peer policy's state, under the router's one lock
	pm       *peerMetrics
	learn    *learner // the TTFT models, under their own lock
}

// NewRouter returns a router over a fleet (a fleetview.View, or an
// in-process picker/localfleet).
func NewRouter(cfg Config, fl Fleet, log *zap.Logger, reg prometheus.Registerer) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	lcfg := inflight.DefaultConfig()
	lcfg.PrefillTokensPerSecond, lcfg.PeerLifetime = cfg.PrefillTokensPerSecond, cfg.PeerBookingLifetime
	books, err := inflight.NewBookings(lcfg)
	if err != nil {
		return nil, err
	}
	r := &Router{cfg: cfg, dcfg: decide.Config{Score: cfg.Score, Health: cfg.Health, Predict: cfg.Predict, Pulls: cfg.Pulls}, log: log, fleet: fl, learn: newLearner(cfg.Predict),
		render: render.New(cfg.TokenizeTimeout, 64<<20).WithAPIKey(cfg.EngineAPIKey),
		proxy:  &http.Client{Transport: newProxyTransport()}, accessLog: log.Named("access")}
	r.bookings.b = books
	r.roster, _ = fl.(rosters)
	r.access.rate = cfg.AccessLog
	r.engKey.Store(&cfg.EngineAPIKey)
	hc := &http.Client{Timeout: cfg.TokenizeTimeout}
	r.models = &modelDirectory{endpoints: fl.Endpoints, log: log, shard: fl.Models(), list: func(ctx context.Context, base string) ([]modelEntry, error) {
		ctx, cancel := context.WithTimeout(ctx, cfg.TokenizeTimeout)
		defer cancel()
		return listModels(ctx, hc, base, *r.engKey.Load())
	}}
	if cfg.Score.Policy.IsPeer() {
		if r.bookings.peer, err = newPeerPolicy(string(cfg.Score.Policy), cfg.PolicySeed); err != nil {
			return nil, err
		}
	}
	r.m = newMetrics(reg, r)
	r.pm = newPeerMetrics(reg)
	r.bookings.expired = func(n int) { r.pm.expired.Add(float64(n)) }
	r.coal = render.NewCoalescer(cfg.TokenizeTimeout, r.m.coalesced.Inc)
	r.admit = newAdmission(cfg.Admission, log.Named("admission"), reg, r.admitLoads)
	r.prio = newEnginePriority(cfg, log, reg)
	return r, nil
}

// now is the router's time (Config.Clock).
func (r *Router) now() time.Time { return r.cfg.Clock() }

// SetEngineAPIKey replaces the key the picker's own calls to engines
// carry (render, model lists): a rotated --engine-api-key-file.
func (r *Router) SetEngineAPIKey(key string) {
	r.engKey.Store(&key)
	r.render.SetAPIKey(key)
}

// Close refuses the requests still queued (503) and drops the router's
// pooled connections.
func (r *Router) Close() {
	r.admit.close()
	r.render.Close()
	r.proxy.CloseIdleConnections()
}

// Pick is a decision: the decision API's answer (picker/pickapi) and what
// the proxy needs afterwards.
type Pick struct {
	pickapi.Answer

	booking         inflight.Booking // the in-flight record and prefill, for FirstByte and Done
	peer            peerTicket       // the peer policy's booking, for FirstToken and Done
	blockSize       int
	anotherHeldMore bool // a healthy endpoint held a longer GPU prefix
	loadOnly        bool // the endpoint's cache was unknown: nothing predicted
	// expectCached is the prompt tokens the engine is expected to report
	// cached (vLLM's num_cached_tokens: its GPU hit, what it loads back
	// from its CPU tier and what it pulls), for the outcome metrics.
	expectCached int
	relay        bool // a passthrough request (passthrough.go): no prompt to account for
	kind         intake.Kind
	uncached     float64       // the prompt tokens left to prefill, as booked
	fallbacks    []fallback    // the next best endpoints (PickOptions.Fallbacks), best first
	waited       time.Duration // in the admission queue
	// source is where the chosen endpoint pulls the prompt's prefix from
	// (Answer.KVSource is its address; zero: none), and sourceDropped why
	// the decision's source was not named ("" when it was, or none).
	source        kvSource
	sourceDropped string

	// The TTFT prediction, for learning at the first token: the group,
	// the features the chosen endpoint was priced by, when the pick was
	// booked, and whether it is still to be learned from (predicted).
	group      string
	chain      []uint64 // the prompt's block keys, held on the endpoint until its first token
	features   predict.Features
	dispatched time.Time
	predicted  bool
	// ObservedTTFT is the time from the pick's booking to its first
	// output token, once FirstToken was called (0 before).
	ObservedTTFT time.Duration `json:"-"`
}

// fallback is an endpoint the decision ranks after the chosen one, with
// what it would have been predicted to hold.
type fallback struct {
	endpoint        string
	matched         int
	expectCached    int // its GPU match and what it loads back from its CPU tier
	uncached        float64
	anotherHeldMore bool
	loadOnly        bool
}

// Fallbacks are the endpoints ranked after the chosen one, best first
// (PickOptions.Fallbacks of them at most).
func (p *Pick) Fallbacks() []string {
	out := make([]string, len(p.fallbacks))
	for i, f := range p.fallbacks {
		out[i] = f.endpoint
	}
	return out
}

// Candidate is one endpoint as the decision saw it.
type Candidate = pickapi.Candidate

// PickOptions are the per-request switches.
type PickOptions struct {
	CacheOff bool // X-KVRoute-Cache: off — no prefix_hash
	Explain  bool
	Exclude  map[string]bool // endpoints already tried
	// Only, when not nil, are the endpoints that may be chosen (a
	// gateway's subset hint): the decision sees no others.
	Only map[string]bool
	// Fallbacks is how many endpoints to rank after the chosen one (the
	// decision again without the endpoints already ranked).
	Fallbacks int
	// ShedWaiting, when positive, refuses the request (429) when every
	// routable candidate has at least this many requests queued
	// (decide.Saturated).
	ShedWaiting float64
	// Admit: the request passes admission (a request the picker carries
	// to the engine, on its first attempt): while its model group is
	// saturated it waits in the queue under Fairness, or is refused.
	Admit bool
	// AdmitNow: the request passes admission without waiting (the
	// decision API with Config.AdmitDecisions): refused at once (429,
	// Retry-After) while its model group is saturated or has requests
	// waiting. Ignored with Admit.
	AdmitNow bool
	Fairness Fairness
	// SLO is the request's TTFT target (x-kvroute-slo-ttft-ms; 0: none):
	// precise chooses, among the endpoints predicted within it, the one
	// that keeps the fleet's cache best.
	SLO time.Duration
	// Carried: the picker carries the request to the engine and sees its
	// first byte and its end (the proxy, the endpoint picker), so its
	// uncached tokens count as prefill in flight until the first byte
	// (admission's MaxPrefillTokens). A decision API pick is not: nothing
	// would end it.
	Carried bool
	// Priority, when set, is the engine priority the request's first pick
	// had (Config.EnginePriority): its retries keep it, uncharged.
	Priority *int
}

// admissionCost is a request's cost in the fair queue: its prompt
// tokens, or, without tokens, its body's length in bytes ÷ 4.
func admissionCost(p *Prepared) float64 {
	if p.dreq.PromptTokens > 0 {
		return float64(p.dreq.PromptTokens)
	}
	return float64(len(p.body)) / 4
}

// clientGone is the answer to a client that left while its request
// waited (nobody reads it; the access log and metrics count 499).
func clientGone() *intake.Error {
	return &intake.Error{Status: 499, Type: "client_closed_request", Message: "The client closed the connection while the request waited."}
}

// admitLoads are group's routable endpoints' loads (of eps; nil: the
// fleet's) at now, as admission judges saturation (bookings.admitLoads).
func (r *Router) admitLoads(group string, eps []*fleet.Endpoint, now time.Time) []admit.Load {
	if eps == nil {
		if ro := r.groupRoster(group); ro != nil {
			eps = ro.Endpoints
		}
	}
	return r.bookings.admitLoads(eps, now, r.cfg.Health)
}

// prefillDone ends p's prefill in flight (its first byte came, or it
// ended).
func (r *Router) prefillDone(p *Pick) {
	r.bookings.firstByte(p)
	r.admit.poke()
}

// Done ends a pick's in-flight record (its request finished).
func (r *Router) Done(p *Pick) {
	r.bookings.done(p, r.now())
	r.admit.poke()
}

// servedBy moves p to its k-th fallback: the endpoint a gateway reports
// served the request after the chosen one failed. The in-flight record
// moves with it, and the prediction the outcome is judged by is the
// fallback's (a peer policy's booking stays where it was made).
func (r *Router) servedBy(p *Pick, k int) {
	f := p.fallbacks[k]
	r.bookings.move(p, f.endpoint, f.uncached, r.now())
	p.Endpoint, p.EndpointID, p.MatchedTokens, p.uncached = f.endpoint, endpointID(f.endpoint), f.matched, f.uncached
	p.expectCached = max(f.expectCached, f.matched)
	p.MatchedBlocks, p.anotherHeldMore, p.loadOnly = 0, f.anotherHeldMore, f.loadOnly
	p.predicted = false // priced for the endpoint that failed: nothing to learn from
	if p.blockSize > 0 {
		p.MatchedBlocks = f.matched / p.blockSize
	}
}

// overloaded sheds a request (PickOptions.ShedWaiting).
func overloaded(model string, waiting float64) *intake.Error {
	return &intake.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_exceeded", Code: "overloaded", RetryAfter: time.Second,
		Message: fmt.Sprintf("Every endpoint serving the model %q has at least %v requests waiting; try again later.", model, waiting)}
}

func noEndpoints(model string) *intake.Error {
	return &intake.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_healthy_endpoint",
		Message: fmt.Sprintf("No healthy endpoint serves the model %q right now.", model)}
}

// endpointID is a short stable name for an endpoint URL.
func endpointID(url string) string { return fmt.Sprintf("%016x", xxh3.HashString(url)) }

// decideIn is decide.Decide with a scratch from r's pool: the same
// decision, without allocating the group's working set each time.
func (r *Router) decideIn(req decide.Request, snap decide.Snapshot, now time.Time) decide.Decision {
	sc, _ := r.scratch.Get().(*decide.Scratch)
	if sc == nil {
		sc = new(decide.Scratch)
	}
	snap.Scratch = sc
	d := decide.Decide(&r.dcfg, req, snap, now)
	r.scratch.Put(sc)
	return d
}
