package picker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/blockkey"
	"github.com/kvroute/kvroute/internal/tier"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/render"
	"github.com/kvroute/kvroute/picker/score"
)

// Unresolved policies: what to do with a request whose cache identity
// cannot be resolved exactly.
const (
	UnresolvedReject      = "reject"       // 400, code "unresolved_identity" (default)
	UnresolvedPreciseOnly = "precise-only" // score what is known (the first prompt of several)
	UnresolvedLoadOnly    = "load-only"    // route by load alone
)

// Config configures the routing core. Zero fields take DefaultConfig's
// values through Validate's caller.
type Config struct {
	Score score.Config
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
	// StaleLoad: an endpoint whose last load report is older is unhealthy.
	// Default 10 s.
	StaleLoad time.Duration
	// EngineAPIKey, when set, is sent as a bearer token on the picker's own
	// calls to engines (render, model lists), for engines started with
	// --api-key; proxied requests carry the client's own header.
	EngineAPIKey string
	// PrefillTokensPerSecond is an engine's prefill rate, used to age the
	// picks the engine's load report does not cover yet: a pick's queued
	// prefill work shrinks at this rate from the moment it was made.
	// Default 5,000.
	PrefillTokensPerSecond float64
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{Score: score.DefaultConfig(), AnchorTokens: 1024, TokenizeTimeout: 2 * time.Second,
		Unresolved: UnresolvedReject, MaxBodyBytes: 16 << 20, StaleLoad: 10 * time.Second, PrefillTokensPerSecond: 5000}
}

// Validate checks c.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Score.Validate(); err != nil {
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
	if c.StaleLoad <= 0 {
		errs = append(errs, errors.New("stale-load interval must be positive"))
	}
	return errors.Join(errs...)
}

// Router decides where requests go: the identity and tokens of a request,
// the fleet view's matches and loads, and the scoring core.
type Router struct {
	cfg    Config
	log    *zap.Logger
	view   *fleetview.View
	render *render.Client
	parser intake.Parser
	hc     *http.Client // model lists
	proxy  *http.Client // requests to engines
	bufs   sync.Pool    // *[]byte copy buffers for answers
	m      *metrics

	counter   atomic.Uint64 // round-robin position
	refreshMu sync.Mutex    // one model-list refresh at a time

	mu          sync.Mutex
	models      map[string]modelRef // request model name → where it is served
	lastRefresh time.Time
	sends       map[string][]send // endpoint URL → picks since its load report
	nextSend    uint64
}

// modelRef is a model name as one identity group serves it.
type modelRef struct {
	group string
	lora  string // the adapter, when the name is one
}

// send is one pick not yet covered by the endpoint's load report.
type send struct {
	id     uint64
	at     time.Time
	tokens float64 // uncached prompt tokens
}

// NewRouter returns a router over view.
func NewRouter(cfg Config, view *fleetview.View, log *zap.Logger, reg prometheus.Registerer) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	r := &Router{cfg: cfg, log: log, view: view, render: render.New(cfg.TokenizeTimeout, 64<<20).WithAPIKey(cfg.EngineAPIKey), hc: &http.Client{Timeout: cfg.TokenizeTimeout},
		proxy:  &http.Client{Transport: newProxyTransport()},
		models: map[string]modelRef{}, sends: map[string][]send{}}
	r.m = newMetrics(reg, r)
	return r, nil
}

// Close drops the router's pooled connections.
func (r *Router) Close() {
	r.render.Close()
	r.proxy.CloseIdleConnections()
}

// Pick is a decision, as the decision API answers it.
type Pick struct {
	Endpoint      string `json:"endpoint"`
	EndpointID    string `json:"endpoint_id"`
	Model         string `json:"model"`
	PromptTokens  int    `json:"prompt_tokens"`
	MatchedTokens int    `json:"matched_tokens"`
	MatchedBlocks int    `json:"matched_blocks"`
	PrefixHash    string `json:"prefix_hash,omitempty"`
	Policy        string `json:"policy"`
	Reason        string `json:"reason"`
	// Candidates explain the decision (?explain=true).
	Candidates []Candidate `json:"candidates,omitempty"`
	// Keys are the request's block keys, canonical (?explain=true): what a
	// sidecar's /debug/keys?canonical= looks up, for checking parity.
	Keys []string `json:"keys,omitempty"`

	send            uint64  // the in-flight record, for Done
	cached          float64 // credited cached tokens predicted
	blockSize       int
	anotherHeldMore bool // a healthy endpoint held a longer GPU prefix
	request         *intake.Request
}

// Candidate is one endpoint as the decision saw it.
type Candidate struct {
	Endpoint      string  `json:"endpoint"`
	MatchedTokens int     `json:"matched_tokens"`
	CPUTokens     int     `json:"cpu_matched_tokens,omitempty"`
	StorageTokens int     `json:"storage_matched_tokens,omitempty"`
	InFlight      float64 `json:"in_flight"`
	Cost          float64 `json:"estimated_cost_tokens"`
	UnderCap      bool    `json:"under_load_cap"`
	Why           string  `json:"why"`
}

// PickOptions are the per-request switches.
type PickOptions struct {
	CacheOff bool // X-KVRoute-Cache: off — no prefix_hash
	Explain  bool
	Exclude  map[string]bool // endpoints already tried
}

// unresolvedError refuses an unresolved identity.
func unresolvedError(reason string) *intake.Error {
	return intake.BadRequest("", "unresolved_identity",
		"This request's cache identity cannot be resolved exactly (%s); the picker is configured to refuse such requests.", reason)
}

// Pick decides where a request of kind (intake.Any: told by its fields)
// goes.
func (r *Router) Pick(ctx context.Context, kind intake.Kind, body []byte, opt PickOptions) (*Pick, error) {
	req, err := r.parser.Parse(kind, body)
	if err != nil {
		r.m.refused.WithLabelValues("bad_request").Inc()
		return nil, err
	}
	ref, group, err := r.resolveModel(ctx, req.Model)
	if err != nil {
		r.m.refused.WithLabelValues("unknown_model").Inc()
		return nil, err
	}
	lora := ref.lora
	if req.LoRA != "" {
		lora = req.LoRA
	}
	eps := r.groupEndpoints(ref.group)
	if len(eps) == 0 {
		return nil, noEndpoints(req.Model)
	}
	model, blockSize := eps[0].Info.Model, eps[0].Info.BlockSize
	loadOnly := false
	if blockSize <= 0 {
		// The sidecar has not learnt the engine's block size yet: no keys.
		loadOnly = true
		r.m.fallbacks.WithLabelValues("unknown_block_size").Inc()
	}
	if req.Unresolved != "" {
		r.m.unresolved.WithLabelValues(req.Unresolved).Inc()
		switch r.cfg.Unresolved {
		case UnresolvedReject:
			return nil, unresolvedError(req.Unresolved)
		case UnresolvedLoadOnly:
			loadOnly = true
		case UnresolvedPreciseOnly:
			// Score what is known: the first prompt when it came as token
			// ids (intake keeps it); text prompts cannot be rendered one by
			// one here, so they go by load.
			loadOnly = req.TokenIDs == nil
		}
	}
	sr := score.Request{Counter: r.counter.Add(1) - 1, LoadOnly: loadOnly}
	pick := &Pick{Model: req.Model, Policy: string(r.cfg.Score.Policy), request: req}
	var chain []blockkey.Key
	cfg := r.cfg.Score
	if !loadOnly {
		toks, err := r.tokens(ctx, req, req.Kind, body, eps, group)
		switch {
		case err == nil:
			kr := blockkey.Request{Tokens: toks.full, LoRA: lora, CacheSalt: req.CacheSalt, MM: toks.mm}
			chain = kr.AppendKeys(nil, model, blockSize)
			pick.PromptTokens = len(toks.full)
			sr.PromptTokens = len(toks.full)
			if len(chain) > 0 {
				sr.TieKey = uint64(chain[0])
			}
			if n := min(toks.anchor/blockSize, len(chain)); n > 0 {
				sr.Anchor, sr.HasAnchor = uint64(chain[n-1]), true
				if !opt.CacheOff {
					pick.PrefixHash = fmt.Sprintf("%016x", sr.Anchor)
				}
			}
		case isRefusal(err):
			return nil, err
		default:
			// No tokens in time: place by consistent hashing on the raw
			// anchor, salted, so retries and siblings still meet.
			r.m.fallbacks.WithLabelValues("tokenize_failed").Inc()
			r.log.Debug("tokenize failed; consistent-hash fallback", zap.Error(err))
			sr.Anchor, sr.HasAnchor = rawAnchor(req, body, r.cfg.AnchorTokens), true
			cfg.Policy = score.PrefixHash
			pick.Policy = string(score.PrefixHash)
		}
	}
	cands := r.candidates(ref.group, eps, chain, blockSize)
	for i := range cands {
		if opt.Exclude[cands[i].ID] {
			cands[i].Healthy = false
		}
	}
	d := score.Decide(&cfg, sr, cands)
	if d.Index < 0 {
		return nil, noEndpoints(req.Model)
	}
	chosen := cands[d.Index]
	pick.Endpoint, pick.EndpointID = chosen.ID, endpointID(chosen.ID)
	pick.MatchedTokens = chosen.Matched[tier.GPU]
	if blockSize > 0 {
		pick.MatchedBlocks = pick.MatchedTokens / blockSize
	}
	pick.Reason, pick.cached, pick.blockSize = string(d.Reason), d.Cached, blockSize
	for _, c := range cands {
		if c.Healthy && c.Matched[tier.GPU] > chosen.Matched[tier.GPU] {
			pick.anotherHeldMore = true
		}
	}
	if opt.Explain {
		for _, k := range chain {
			pick.Keys = append(pick.Keys, k.String())
		}
		for _, e := range d.Explain {
			pick.Candidates = append(pick.Candidates, Candidate{Endpoint: e.ID, MatchedTokens: e.Matched[tier.GPU],
				CPUTokens: e.Matched[tier.CPU], StorageTokens: e.Matched[tier.Storage], InFlight: e.InFlight,
				Cost: e.Cost, UnderCap: e.UnderCap, Why: e.Why})
		}
	}
	r.m.decisions.WithLabelValues(string(cfg.Policy), string(d.Reason)).Inc()
	r.m.matchedBlocks.Observe(float64(pick.MatchedBlocks))
	r.m.selected.WithLabelValues(chosen.ID).Inc()
	if d.Override != nil {
		r.m.overrides.Inc()
		r.m.overrideTokens.Add(d.Override.TokensLost)
	}
	pick.send = r.record(chosen.ID, float64(sr.PromptTokens)-d.Cached)
	return pick, nil
}

// Done ends a pick's in-flight record (its request finished).
func (r *Router) Done(p *Pick) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sends[p.Endpoint]
	for i := range s {
		if s[i].id == p.send {
			r.sends[p.Endpoint] = append(s[:i:i], s[i+1:]...)
			return
		}
	}
}

func isRefusal(err error) bool {
	var ie *intake.Error
	var re *render.RefusedError
	return errors.As(err, &ie) || errors.As(err, &re)
}

func noEndpoints(model string) *intake.Error {
	return &intake.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_healthy_endpoint",
		Message: fmt.Sprintf("No healthy endpoint serves the model %q right now.", model)}
}

// endpointID is a short stable name for an endpoint URL.
func endpointID(url string) string { return fmt.Sprintf("%016x", xxh3.HashString(url)) }

// rawAnchor is a salted hash of what the request's anchor is made of, for
// placing it without tokens.
func rawAnchor(req *intake.Request, body []byte, anchorTokens int) uint64 {
	h := xxh3.New()
	_, _ = h.WriteString(req.Model)
	_, _ = h.Write([]byte{0})
	_, _ = h.WriteString(req.CacheSalt)
	_, _ = h.Write([]byte{0})
	switch {
	case req.RawAnchor != nil:
		_, _ = h.Write(req.RawAnchor)
	case req.TokenIDs != nil:
		for _, t := range req.TokenIDs[:min(len(req.TokenIDs), anchorTokens)] {
			_, _ = h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
		}
	default:
		_, _ = h.Write(body)
	}
	return h.Sum64()
}

// tokensOf is a request's tokens and how many of them are its anchor.
type tokensOf struct {
	full   []uint32
	anchor int
	mm     []blockkey.MMItem
}

// tokens gets the request's tokens: as sent, or rendered by an engine of
// its group (the anchor rendered alongside).
func (r *Router) tokens(ctx context.Context, req *intake.Request, kind intake.Kind, body []byte, eps []fleet.Endpoint, group string) (tokensOf, error) {
	if req.TokenIDs != nil {
		if !req.Anchorable {
			return tokensOf{full: req.TokenIDs}, nil
		}
		return tokensOf{full: req.TokenIDs, anchor: min(len(req.TokenIDs), r.cfg.AnchorTokens)}, nil
	}
	engines := r.renderEngines(eps)
	if len(engines) == 0 {
		return tokensOf{}, errors.New("no healthy engine to render with")
	}
	engine := engines[0]
	ctx, cancel := context.WithTimeout(ctx, r.cfg.TokenizeTimeout)
	defer cancel()
	type result struct {
		r   render.Rendered
		err error
		d   time.Duration
	}
	var anchorCh chan result
	if req.AnchorBody != nil {
		anchorCh = make(chan result, 1)
		go func() {
			t0 := time.Now()
			body, kind := req.AnchorBody, kind
			if kind == intake.Responses {
				var err error
				if body, err = render.ResponsesAnchor(body); err != nil {
					anchorCh <- result{err: err}
					return
				}
				kind = intake.Chat
			}
			a, err := r.render.Render(ctx, engine, kind, body)
			anchorCh <- result{a, err, time.Since(t0)}
		}()
	}
	t0 := time.Now()
	full, err := r.render.Render(ctx, engine, kind, body)
	if err != nil && !isRefusal(err) && ctx.Err() == nil && len(engines) > 1 {
		// That engine could not be reached: another of the group renders
		// the same tokens (the anchor, if it failed too, only costs the
		// prefix hash).
		r.m.tokenizeErrors.WithLabelValues(errKind(err)).Inc()
		full, err = r.render.Render(ctx, engines[1], kind, body)
	}
	r.m.tokenize.WithLabelValues(full.Via).Observe(time.Since(t0).Seconds())
	if err != nil {
		r.m.tokenizeErrors.WithLabelValues(errKind(err)).Inc()
		return tokensOf{}, err
	}
	out := tokensOf{full: full.TokenIDs, mm: full.MM}
	switch {
	case !req.Anchorable:
	case anchorCh == nil && kind == intake.Completion:
		out.anchor = min(len(full.TokenIDs), r.cfg.AnchorTokens)
	case anchorCh == nil:
		out.anchor = len(full.TokenIDs) // the anchor is the whole prompt
	default:
		a := <-anchorCh
		if a.err != nil {
			r.m.tokenizeErrors.WithLabelValues(errKind(a.err)).Inc()
			r.m.fallbacks.WithLabelValues("anchor_render_failed").Inc()
			break // no prefix hash; routing is unaffected
		}
		n := 0
		for n < len(a.r.TokenIDs) && n < len(full.TokenIDs) && a.r.TokenIDs[n] == full.TokenIDs[n] {
			n++
		}
		out.anchor = n
	}
	return out, nil
}

func errKind(err error) string {
	var re *render.RefusedError
	switch {
	case errors.As(err, &re):
		return "refused"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "error"
}

// renderEngines orders the engines that may render: those with a fresh
// load report (or none yet), least loaded first, ties by URL.
func (r *Router) renderEngines(eps []fleet.Endpoint) []string {
	var ok []fleet.Endpoint
	now := time.Now()
	for _, e := range eps {
		if !e.HasLoad() || now.Sub(e.LoadAt) <= r.cfg.StaleLoad {
			ok = append(ok, e)
		}
	}
	sort.Slice(ok, func(i, j int) bool {
		if loadOf(ok[i]) != loadOf(ok[j]) {
			return loadOf(ok[i]) < loadOf(ok[j])
		}
		return ok[i].URL < ok[j].URL
	})
	out := make([]string, len(ok))
	for i, e := range ok {
		out[i] = e.URL
	}
	return out
}

func loadOf(e fleet.Endpoint) float64 {
	return e.Load.Waiting + e.Load.Running
}

// groupEndpoints lists the group's endpoints.
func (r *Router) groupEndpoints(group string) []fleet.Endpoint {
	var out []fleet.Endpoint
	for _, e := range r.view.Endpoints() {
		if e.Group == group {
			out = append(out, e)
		}
	}
	return out
}

// candidates builds the scoring input: matches per tier and loads.
func (r *Router) candidates(group string, eps []fleet.Endpoint, chain []blockkey.Key, blockSize int) []score.Candidate {
	var matched [tier.Count]map[string]int
	if len(chain) > 0 {
		for _, t := range tier.All {
			matched[t] = r.view.Match(group, t, chain)
		}
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]score.Candidate, 0, len(eps))
	for _, e := range eps {
		c := score.Candidate{ID: e.URL, Healthy: true}
		for t := range matched {
			c.Matched[t] = matched[t][e.URL] * blockSize
		}
		var reported time.Time
		if e.HasLoad() {
			// Judged by when the report arrived here, not by the sidecar's
			// clock: clocks of different machines disagree.
			c.Waiting, c.Running = e.Load.Waiting, e.Load.Running
			reported = e.LoadAt
			if now.Sub(reported) > r.cfg.StaleLoad {
				c.Healthy = false
			}
		}
		// Picks the engine's report covers (or too old to matter) are
		// forgotten; the rest count as in flight.
		kept := r.sends[e.URL][:0]
		for _, s := range r.sends[e.URL] {
			if !s.at.After(reported) || now.Sub(s.at) > 30*time.Second {
				continue
			}
			kept = append(kept, s)
			c.Sent++
			c.SentTokens += max(0, s.tokens-now.Sub(s.at).Seconds()*r.cfg.PrefillTokensPerSecond)
		}
		r.sends[e.URL] = kept
		out = append(out, c)
	}
	return out
}

// record notes a pick as in flight on an endpoint.
func (r *Router) record(url string, tokens float64) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextSend++
	s := r.sends[url]
	if len(s) >= 4096 {
		s = s[1:]
	}
	r.sends[url] = append(s, send{id: r.nextSend, at: time.Now(), tokens: max(tokens, 0)})
	return r.nextSend
}

// resolveModel finds the group serving a model name (refreshing the model
// lists at most once a second when a name is unknown).
func (r *Router) resolveModel(ctx context.Context, name string) (modelRef, string, error) {
	lookup := func() (modelRef, bool, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		ref, ok := r.models[name]
		return ref, ok, time.Since(r.lastRefresh) > time.Second
	}
	if ref, ok, _ := lookup(); ok {
		return ref, ref.group, nil // a group gone empty answers 503, and the next unknown name refreshes
	}
	// One refresh at a time, at most one a second, whatever its outcome;
	// requests arriving meanwhile wait for it rather than miss.
	r.refreshMu.Lock()
	ref, ok, stale := lookup()
	if !ok && stale {
		r.mu.Lock()
		r.lastRefresh = time.Now()
		r.mu.Unlock()
		r.refreshModels(context.Background())
		ref, ok, _ = lookup()
	}
	r.refreshMu.Unlock()
	if ok {
		return ref, ref.group, nil
	}
	return modelRef{}, "", &intake.Error{Status: http.StatusNotFound, Type: "NotFoundError", Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("The model `%s` does not exist.", name)}
}

// refreshModels asks one engine of every group for its model list.
func (r *Router) refreshModels(ctx context.Context) {
	groups := map[string][]fleet.Endpoint{}
	for _, e := range r.view.Endpoints() {
		groups[e.Group] = append(groups[e.Group], e)
	}
	ids := make([]string, 0, len(groups))
	for g := range groups {
		ids = append(ids, g)
	}
	// Larger groups first: a name served by several groups goes to the
	// largest.
	sort.Slice(ids, func(i, j int) bool {
		if len(groups[ids[i]]) != len(groups[ids[j]]) {
			return len(groups[ids[i]]) > len(groups[ids[j]])
		}
		return ids[i] < ids[j]
	})
	r.mu.Lock()
	old := r.models
	r.mu.Unlock()
	models := map[string]modelRef{}
	for _, g := range ids {
		eps := groups[g]
		sort.Slice(eps, func(i, j int) bool { return eps[i].URL < eps[j].URL })
		var list []modelEntry
		var err error
		for _, e := range eps[:min(len(eps), 3)] { // an engine that does not answer is not the group
			if list, err = r.listModels(ctx, e.URL); err == nil {
				break
			}
			r.log.Debug("model list", zap.String("engine", e.URL), zap.Error(err))
		}
		if err != nil {
			for name, ref := range old { // keep what the group was known to serve
				if ref.group == g {
					models[name] = ref
				}
			}
		}
		base := eps[0].Info.Model
		if _, ok := models[base]; !ok {
			models[base] = modelRef{group: g}
		}
		for _, m := range list {
			if _, ok := models[m.ID]; ok {
				continue
			}
			if m.Parent != nil && *m.Parent != "" {
				models[m.ID] = modelRef{group: g, lora: m.ID}
			} else {
				models[m.ID] = modelRef{group: g}
			}
		}
	}
	r.mu.Lock()
	r.models = models
	r.mu.Unlock()
}

type modelEntry struct {
	ID     string  `json:"id"`
	Parent *string `json:"parent"`
}

func (r *Router) listModels(ctx context.Context, base string) ([]modelEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.TokenizeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	if r.cfg.EngineAPIKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.EngineAPIKey)
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/v1/models: status %d", resp.StatusCode)
	}
	var list struct {
		Data []modelEntry `json:"data"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, 4<<20)).Decode(&list); err != nil {
		return nil, err
	}
	return list.Data, nil
}
