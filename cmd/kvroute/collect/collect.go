package collect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/verify"
	"github.com/kvroute/kvroute/picker/render"
)

// Config is the fleet to gather facts from, and how.
type Config struct {
	// Picker is the picker's HTTP base URL, e.g. http://kvroute-picker:8080.
	Picker string
	// Admin is the picker's admin base URL (its --admin-listen), where
	// /debug/endpoints and /debug/admission are; default: Picker's host
	// at port 8081, the picker's default.
	Admin string
	// Model, when set, limits the facts to that model's endpoints.
	Model string
	// Token is the decision API's bearer token, if it needs one.
	Token string
	// Timeout bounds each request, and a probe's wait for its blocks to
	// reach the sidecar. Default 10 s.
	Timeout time.Duration
	// MaxLag is the event-to-routable lag a lag probe passes with; a lag
	// probe gives up polling at max(5 s, 5 × MaxLag). Default 1 s.
	MaxLag time.Duration
	// ExtProc, when set, is the host:port the picker's endpoint picker
	// (its --ext-proc-listen) is reached at; default: the address its
	// /debug/endpoints names, an unspecified host replaced by Picker's.
	ExtProc string
}

// DefaultConfig is the configuration without a picker.
func DefaultConfig() Config { return Config{Timeout: 10 * time.Second, MaxLag: verify.DefaultMaxLag} }

// Validate checks the configuration, naming the flag at fault.
func (c Config) Validate() error {
	if c.Picker == "" {
		return errors.New("--picker URL is required (the picker's HTTP base URL)")
	}
	u, err := url.Parse(c.Picker)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--picker %q: want http://host:port", c.Picker)
	}
	if c.Admin != "" {
		u, err := url.Parse(c.Admin)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--picker-admin %q: want http://host:port", c.Admin)
		}
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("--timeout %v: want > 0", c.Timeout)
	}
	if c.MaxLag <= 0 {
		return fmt.Errorf("--max-lag %v: want > 0", c.MaxLag)
	}
	if c.ExtProc != "" {
		if _, _, err := net.SplitHostPort(c.ExtProc); err != nil {
			return fmt.Errorf("--ext-proc %q: want host:port", c.ExtProc)
		}
	}
	return nil
}

// AdminURL is cfg's admin base URL: Admin, else Picker's scheme and host
// at port 8081 (the picker's default --admin-listen).
func AdminURL(cfg Config) string {
	if cfg.Admin != "" {
		return cfg.Admin
	}
	u, err := url.Parse(cfg.Picker)
	if err != nil || u.Host == "" {
		return cfg.Picker
	}
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), "8081")
}

// self asks the picker's public port for /debug/endpoints, which it must
// not serve, and records its answer in f.
func (c *Collector) self(ctx context.Context, f *verify.PickerFacts) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.picker+debugapi.Path, nil)
	if err != nil {
		f.PublicAdminErr = err.Error()
		return
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		f.PublicAdminErr = err.Error()
		return
	}
	_ = resp.Body.Close()
	f.PublicAdminStatus = resp.StatusCode
}

// Collector gathers a fleet's facts over HTTP.
type Collector struct {
	picker string // without a trailing slash
	admin  string // the picker's admin base URL, without a trailing slash
	model  string
	token  string
	settle time.Duration  // longest wait for a probe's blocks to reach its sidecar
	maxLag time.Duration  // a lag probe gives up at lagGiveUp(maxLag)
	hc     *http.Client   // bounded by the timeout
	rc     *render.Client // engines' own tokens, as the picker gets them
	// extProcAddr is Config.ExtProc.
	extProcAddr string
}

// New returns a collector for cfg; Close releases its connections.
func New(cfg Config) (*Collector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Collector{picker: strings.TrimRight(cfg.Picker, "/"), admin: strings.TrimRight(AdminURL(cfg), "/"), model: cfg.Model, token: cfg.Token, settle: cfg.Timeout, maxLag: cfg.MaxLag,
		hc: &http.Client{Timeout: cfg.Timeout}, rc: render.New(cfg.Timeout, 16<<20), extProcAddr: cfg.ExtProc}, nil
}

// Close releases idle connections.
func (c *Collector) Close() {
	c.hc.CloseIdleConnections()
	c.rc.Close()
}

// Facts gathers the fleet's facts; an error means verify could not run at
// all.
func (c *Collector) Facts(ctx context.Context) (verify.Facts, error) {
	f := verify.Facts{Picker: c.picker}
	ep, err := c.readPicker(ctx, &f)
	if err != nil {
		return verify.Facts{}, err
	}
	c.self(ctx, &f.Self)
	c.extProc(ctx, ep, &f.Self.ExtProc)
	if len(f.Fleet) == 0 && c.model != "" {
		return verify.Facts{}, fmt.Errorf("the picker at %s knows no endpoint serving %s", c.picker, c.model)
	}
	if len(f.Fleet) == 0 {
		return verify.Facts{}, fmt.Errorf("the picker at %s knows no endpoint", c.picker)
	}
	// The decision API may want a token the OpenAI endpoints do not.
	_, probe := probeBody("completion", f.Fleet[0].Model, salt())
	if _, err := c.decide(ctx, probe); err != nil {
		var se *openai.StatusError
		if errors.As(err, &se) && se.Status == http.StatusUnauthorized {
			return verify.Facts{}, errors.New("the picker's decision API wants a token: --decision-token-file")
		}
		return verify.Facts{}, fmt.Errorf("the picker's decision API: %w", err)
	}
	var adm struct {
		Models []verify.Admission `json:"models"`
	}
	if err := c.getJSON(ctx, c.admin+"/debug/admission", &adm); err != nil {
		return verify.Facts{}, fmt.Errorf("the picker's admission state: %w", err)
	}
	for _, a := range adm.Models {
		if c.model == "" || a.Model == c.model {
			f.Admission = append(f.Admission, a)
		}
	}
	served := map[string]bool{} // endpoints whose engines answered verify directly
	for _, e := range f.Fleet {
		ef := verify.EndpointFacts{Sidecar: c.sidecar(ctx, e), Details: c.details(ctx, e)}
		served[e.Endpoint] = ef.Details.Err == ""
		f.Endpoints = append(f.Endpoints, ef)
	}
	groups := verify.Groups(f.Fleet)
	for _, g := range groups {
		bs, _ := strconv.Atoi(g.Values["block_size"]) // the model's majority block size
		for _, kind := range []string{"chat", "completion", "responses"} {
			f.Probes = append(f.Probes, verify.ProbeFacts{Result: c.probe(ctx, kind, g.Model, f.Fleet),
				Tokens: c.tokens(ctx, kind, g.Model, bs, f.Fleet)})
		}
	}
	// The lag probes after the token-parity probes: their decisions count
	// as picks in flight, which must not move a probe's repeat.
	for _, g := range groups {
		for _, l := range c.lag(ctx, g.Model, f.Fleet) {
			served[l.Endpoint] = served[l.Endpoint] || (l.Endpoint != "" && l.Err == "")
			f.Lags = append(f.Lags, l)
		}
	}
	// The streams last: by now every engine has served requests, so a
	// sidecar has had its evidence.
	for i, s := range c.streams(ctx, f.Fleet, served) {
		f.Endpoints[i].Stream = s
	}
	// The admin ports' /metrics, once verify's requests have made the
	// series that appear with traffic.
	f.Metrics = c.metrics(ctx, f.Fleet)
	return f, nil
}

// readPicker records in f what the picker's /debug/endpoints (on its
// admin port) says: its endpoints and refusals (of the model asked for,
// when one is) and of itself; and returns its endpoint picker (nil: none).
func (c *Collector) readPicker(ctx context.Context, f *verify.Facts) (*debugapi.ExtProc, error) {
	var doc debugapi.Document
	if err := c.getJSON(ctx, c.admin+debugapi.Path, &doc); err != nil {
		return nil, fmt.Errorf("the picker's endpoints, on its admin port: %w (the picker's --admin-listen; give it with --picker-admin)", err)
	}
	f.Self.GossipInsecure = doc.Picker.GossipInsecure
	f.Self.SharesBookings, f.Self.Pickers = doc.Picker.SharesBookings, doc.Picker.Pickers
	f.Self.EnginePriority = doc.Picker.EnginePriority
	for _, e := range doc.Endpoints {
		if c.model == "" || e.Model == c.model {
			f.Fleet = append(f.Fleet, e)
		}
	}
	for _, rf := range doc.Refused {
		if c.model == "" || rf.Model == c.model {
			f.Refused = append(f.Refused, rf)
		}
	}
	return doc.Picker.ExtProc, nil
}

// sidecar asks the endpoint's sidecar, at its debug URL, which endpoints
// it follows.
func (c *Collector) sidecar(ctx context.Context, e debugapi.Endpoint) verify.SidecarFacts {
	f := verify.SidecarFacts{Endpoint: e.Endpoint, DebugURL: e.SidecarDebug}
	if f.DebugURL == "" {
		return f
	}
	state, err := c.sidecarState(ctx, e.SidecarDebug)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	for _, s := range state {
		f.Follows = append(f.Follows, s.Identity.Endpoint)
		f.GossipInsecure = f.GossipInsecure || s.GossipInsecure
	}
	return f
}

// details sends a short completion twice straight to the engine and
// records the second answer's usage.
func (c *Collector) details(ctx context.Context, e debugapi.Endpoint) verify.DetailsFacts {
	f := verify.DetailsFacts{Endpoint: e.Endpoint}
	body := map[string]any{"model": e.Model, "prompt": probeText("details", 8), "max_tokens": 1, "cache_salt": salt()}
	var u openai.Usage
	for i := 0; i < 2; i++ {
		var err error
		if _, u, err = c.send(ctx, e.Endpoint+"/v1/completions", body); err != nil {
			f.Err = err.Error()
			return f
		}
	}
	f.PromptTokens, f.CachedTokens, f.Details = u.Prompt, u.Cached, u.Details
	return f
}
