package picker

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/debugapi"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/render"
)

// HandlerOptions configure the picker's HTTP API.
type HandlerOptions struct {
	// DecisionToken, when set, is the bearer token the decision API
	// requires (Authorization: Bearer <token>).
	DecisionToken string
	// Token, when set, is asked for the token at each request instead of
	// DecisionToken (a token re-read from its file); "" is none.
	Token func() string
	// Metrics serves /metrics; nil leaves it out.
	Metrics http.Handler
	// Ready, when set, is a readiness check besides knowing an endpoint
	// (a gossip name conflict); its error is /readyz's answer.
	Ready func() error
	// GossipInsecure, when set, says whether the picker's own gossip runs
	// without a keyring off loopback (--gossip-insecure); /debug/endpoints
	// shows it.
	GossipInsecure func() bool
	// Pickers, when set, fills in what /debug/endpoints shows of the
	// bookings shared with the other pickers.
	Pickers func(*debugapi.Picker)
	// ExtProc, when set, is the endpoint picker /debug/endpoints shows
	// (kvroute verify probes its gRPC health).
	ExtProc *debugapi.ExtProc
}

// Handler serves the public API: the OpenAI endpoints (proxied or passed
// through) and the decision API (POST /routing/v1/pick). Nothing else is
// served there: /metrics, /debug/*, /healthz and /readyz are the admin
// surface (AdminHandler), and answer 404 here saying so.
func (r *Router) Handler(o HandlerOptions) http.Handler {
	mux := http.NewServeMux()
	token := o.Token
	if token == nil {
		token = func() string { return o.DecisionToken }
	}
	mux.HandleFunc("POST /routing/v1/pick", func(w http.ResponseWriter, req *http.Request) { r.handlePick(w, req, token()) })
	mux.HandleFunc("POST /v1/chat/completions", r.handleProxy(intake.Chat, "/v1/chat/completions"))
	mux.HandleFunc("POST /v1/completions", r.handleProxy(intake.Completion, "/v1/completions"))
	mux.HandleFunc("POST /v1/responses", r.handleProxy(intake.Responses, "/v1/responses"))
	r.passthroughRoutes(mux)
	mux.Handle("/", notRouted(mux, true))
	return r.instrument(mux)
}

// AdminHandler serves the admin surface, for probes, monitoring and
// operators: /healthz, /readyz, /debug/endpoints, /debug/admission,
// /debug/sync (a view's: how many endpoints have their sidecar's state
// applied; cheap to poll while a restarted picker syncs), Go's profiles
// under /debug/pprof/ and, when given, /metrics. It lists every
// endpoint's address and load, so it belongs on a port only the
// monitoring namespace and the kubelet reach (--admin-listen). It writes
// no access log.
func (r *Router) AdminHandler(o HandlerOptions) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) { r.handleReady(w, req, o.Ready) })
	self := func() debugapi.Picker {
		p := debugapi.Picker{GossipInsecure: o.GossipInsecure != nil && o.GossipInsecure(), ExtProc: o.ExtProc}
		if r.prio != nil {
			p.EnginePriority = &debugapi.EnginePriority{RefusedBy: r.prio.refusing()}
		}
		if o.Pickers != nil {
			o.Pickers(&p)
		}
		return p
	}
	mux.HandleFunc("GET "+debugapi.Path, func(w http.ResponseWriter, req *http.Request) { r.handleDebugEndpoints(w, req, self()) })
	mux.HandleFunc("GET /debug/admission", r.handleDebugAdmission)
	pprofRoutes(mux)
	if fs, ok := r.fleet.(fleetSync); ok {
		mux.HandleFunc("GET /debug/sync", func(w http.ResponseWriter, req *http.Request) { r.handleDebugSync(w, req, fs) })
	}
	if o.Metrics != nil {
		mux.Handle("GET /metrics", o.Metrics)
	}
	mux.Handle("/", notRouted(mux, false))
	return mux
}

// notRouted answers what no route serves, in OpenAI's error format: 405
// with an Allow header when the path is served for other methods, else
// 404 (on the public port, an admin path's 404 says where it is served).
func notRouted(mux *http.ServeMux, public bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
			probe := &http.Request{Method: m, URL: req.URL, Host: req.Host, Header: http.Header{}}
			if _, pattern := mux.Handler(probe); pattern != "" && pattern != "/" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, &intake.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
				Message: fmt.Sprintf("%s is not allowed on %s; allowed: %s.", req.Method, req.URL.Path, strings.Join(allow, ", "))})
			return
		}
		msg := fmt.Sprintf("No route serves %s %s.", req.Method, req.URL.Path)
		switch {
		case public && adminPath(req.URL.Path):
			msg += " /healthz, /readyz, /metrics and /debug/* are served on the admin port (--admin-listen, default :8081), not the public one."
		case !public && !adminPath(req.URL.Path):
			msg += " This is the admin port: the OpenAI endpoints and the decision API are served on the public one (--listen, default :8080)."
		}
		writeError(w, &intake.Error{Status: http.StatusNotFound, Type: "NotFoundError", Code: "not_found", Message: msg})
	})
}

// writeError answers err in OpenAI's error format: the picker's own
// refusals, an engine's refusal as the engine worded it, anything else as
// a 502 from the engine or a 500.
func writeError(w http.ResponseWriter, err error) {
	if s := retryAfterOf(err); s != "" {
		w.Header().Set("Retry-After", s)
	}
	status, body := errorBody(err)
	writeRaw(w, status, body)
}

// retryAfterOf is err's Retry-After header value ("" none).
func retryAfterOf(err error) string {
	var ie *intake.Error
	if errors.As(err, &ie) && ie.RetryAfter > 0 {
		return strconv.Itoa(int(math.Ceil(ie.RetryAfter.Seconds())))
	}
	return ""
}

// errorBody is err's answer in OpenAI's error format: its status and body.
func errorBody(err error) (int, []byte) {
	var ie *intake.Error
	var re *render.RefusedError
	switch {
	case errors.As(err, &ie):
		return ie.Status, ie.Body()
	case errors.As(err, &re):
		return re.Status, re.Body
	}
	e := &intake.Error{Status: http.StatusInternalServerError, Type: "internal_error", Message: err.Error()}
	return e.Status, e.Body()
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// debugSync is GET /debug/sync: the endpoints held, those whose
// sidecar's first state is applied (reported) and those with a summary
// loaded, the snapshots received since start and those not yet written;
// synced once every endpoint held (one at least) has reported with no
// snapshot waiting (fleetview.Sync).
type debugSync struct {
	Endpoints        int   `json:"endpoints"`
	Reported         int   `json:"reported"`
	Loaded           int   `json:"loaded"`
	Snapshots        int64 `json:"snapshots"`
	SnapshotsWaiting int64 `json:"snapshots_waiting"`
	Synced           bool  `json:"synced"`
}

func (r *Router) handleDebugSync(w http.ResponseWriter, _ *http.Request, f fleetSync) {
	s := f.Sync()
	writeJSON(w, http.StatusOK, debugSync{Endpoints: s.Endpoints, Reported: s.Reported, Loaded: s.Loaded, Snapshots: s.Snapshots,
		SnapshotsWaiting: s.Waiting, Synced: s.Synced()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, err)
		return
	}
	writeRaw(w, status, b)
}

// Lingering on a refused body: how much more of it the picker reads, and
// for how long, before answering 413, so that a client writing its whole
// body before reading sees the 413 rather than a broken pipe (as nginx's
// lingering close does).
const (
	lingerBytes = 64 << 20
	lingerTime  = 5 * time.Second
)

// readBody reads a request body of at most max bytes; a larger one is a
// 413 in OpenAI's format, after the rest of it is drained (a bounded
// amount, for a bounded time) and the connection marked to close.
func readBody(w http.ResponseWriter, req *http.Request, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(req.Body, max+1))
	switch {
	case err != nil:
		return nil, intake.BadRequest("", "", "Could not read the request body: %v", err)
	case int64(len(b)) > max:
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(lingerTime))
		_, _ = io.CopyN(io.Discard, req.Body, lingerBytes)
		_ = rc.SetReadDeadline(time.Time{})
		w.Header().Set("Connection", "close")
		return nil, &intake.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: fmt.Sprintf("The request body is larger than this picker accepts (%d bytes, --max-body-bytes).", max)}
	}
	return b, nil
}

// bodyErrorReason labels a body that could not be read.
func bodyErrorReason(err error) string {
	var ie *intake.Error
	if errors.As(err, &ie) && ie.Status == http.StatusRequestEntityTooLarge {
		return "too_large"
	}
	return "unreadable_body"
}

// cacheOff reports the X-KVRoute-Cache: off opt-out.
func cacheOff(h http.Header) bool {
	return strings.EqualFold(strings.TrimSpace(h.Get("X-KVRoute-Cache")), "off")
}

func authorized(req *http.Request, token string) bool {
	if token == "" {
		return true
	}
	got, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

func (r *Router) handlePick(w http.ResponseWriter, req *http.Request, token string) {
	if !authorized(req, token) {
		r.m.refused.WithLabelValues("unauthorized").Inc()
		writeRaw(w, http.StatusUnauthorized, (&intake.Error{Status: http.StatusUnauthorized, Type: "invalid_request_error",
			Code: "invalid_api_key", Message: "The decision API needs a valid bearer token."}).Body())
		return
	}
	body, err := readBody(w, req, r.cfg.MaxBodyBytes)
	if err != nil {
		r.m.refused.WithLabelValues(bodyErrorReason(err)).Inc()
		writeError(w, err)
		return
	}
	if body, err = r.tenantBody(req, body, true); err != nil {
		writeError(w, err)
		return
	}
	explain := req.URL.Query().Get("explain") == "true"
	slo, err := sloOf(req.Header)
	if err != nil {
		r.m.refused.WithLabelValues("bad_request").Inc()
		writeError(w, err)
		return
	}
	opt := PickOptions{CacheOff: cacheOff(req.Header), Explain: explain, SLO: slo}
	if r.cfg.AdmitDecisions || r.prio != nil { // admission's fairness key; the engine priority's key and band
		opt.AdmitNow, opt.Fairness = r.cfg.AdmitDecisions, decisionFairness(req.Header, r.cfg.FairnessHeader)
	}
	p, err := r.Route(req.Context(), intake.Any, body, opt)
	if err != nil {
		writeError(w, err)
		return
	}
	r.peerDone(p) // a peer policy's booking: the request is not seen again
	writeJSON(w, http.StatusOK, p)
}

// decisionFairness is a decision request's place in admission
// (Config.AdmitDecisions), for the metrics' fairness key, and its key and
// band for the engine priority (Config.EnginePriority): its fairness
// headers, or none when they are malformed (the decision API never
// refused a request for them; its cache_salt then keys it).
func decisionFairness(h http.Header, header string) Fairness {
	f, err := fairnessOf(h, header)
	if err != nil {
		return Fairness{}
	}
	return f
}

func (r *Router) handleReady(w http.ResponseWriter, _ *http.Request, ready func() error) {
	if err := r.readiness(ready); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

// readiness is nil when the picker can route: ready (when set) passes and
// an endpoint is routable; else why not.
func (r *Router) readiness(ready func() error) error {
	if ready != nil {
		if err := ready(); err != nil {
			return err
		}
	}
	eps := r.fleet.Endpoints()
	if len(eps) == 0 {
		return errors.New("no endpoints known yet")
	}
	for i := range eps {
		if r.health(&eps[i]).Routable() {
			return nil
		}
	}
	return fmt.Errorf("none of the %d endpoints known is routable (down or draining: see /debug/endpoints)", len(eps))
}

// handleDebugEndpoints writes the picker's debugapi.Document: every
// endpoint with its health at now, and the fleet's diagnostics when it
// has them.
func (r *Router) handleDebugEndpoints(w http.ResponseWriter, _ *http.Request, self debugapi.Picker) {
	doc := debugapi.Document{Endpoints: []debugapi.Endpoint{}, Picker: self, Refused: []debugapi.Refusal{}, SidecarsFailing: []debugapi.SidecarFailing{},
		TTFTModels: []debugapi.TTFTModel{}}
	models := r.learn.state()
	for _, g := range slices.Sorted(maps.Keys(models)) {
		m := models[g]
		doc.TTFTModels = append(doc.TTFTModels, debugapi.TTFTModel{Group: g, Coefficients: m.Coefficients, Observations: m.Observations,
			MedianRelativeError: m.MedianRelativeError, MeanUncachedTokens: m.MeanUncachedTokens})
	}
	for _, e := range r.fleet.Endpoints() {
		d := debugapi.Endpoint{Endpoint: e.URL, EndpointID: endpointID(e.URL), Sidecar: e.Sidecar, Group: e.Group}
		d.Model, d.Rank, d.BlockSize, d.Epoch, d.Partial = e.Info.Model, e.Info.Rank, e.Info.BlockSize, e.Info.Epoch, e.Info.Partial
		d.NumGPUBlocks, d.HashAlgo, d.KeyFormat = e.Info.NumGPUBlocks, e.Info.HashAlgo, e.Info.KeyFormat
		d.SummaryParams, d.TokenizerFingerprint, d.SidecarDebug = e.Info.SummaryParams, e.Info.TokenizerFingerprint, e.Info.DebugURL
		d.KVSource = e.Info.KVSource
		d.Waiting, d.Running, d.KVUsage = e.Load.Waiting, e.Load.Running, e.Load.KVCacheUsage
		h := r.health(&e)
		d.State, d.StateReason = h.State.String(), h.Reason
		d.StreamState, d.StreamReason = e.StreamState, e.StreamReason
		d.EngineDown, d.EngineError = e.Load.EngineDown, e.Load.EngineError
		if lag := e.Lag.Seconds(); lag != 0 {
			d.LagSeconds = &lag
		}
		if e.LastUpdate.IsZero() {
			d.NeverUpdated = true
		} else {
			d.StaleSecs = time.Since(e.LastUpdate).Seconds()
		}
		if t, ok := models[e.Group].Endpoints[e.URL]; ok {
			d.TTFT = &debugapi.TTFTEndpoint{SpeedFactor: t.Speed, Observations: t.Observations, MeanUncachedTokens: t.MeanUncachedTokens,
				MeanQueueSeconds: t.MeanQueueSeconds, MeanPrefillSeconds: t.MeanPrefillSeconds, MeanTTFTSeconds: t.MeanTTFTSeconds}
		}
		doc.Endpoints = append(doc.Endpoints, d)
	}
	// Endpoints offered but not taken: never routed to, so shown apart.
	if diag, ok := r.fleet.(fleetDiagnostics); ok {
		for _, rf := range diag.Refused() {
			doc.Refused = append(doc.Refused, refusal(diag, rf))
		}
		doc.SidecarsFailing = sidecarsFailing(diag)
	}
	writeJSON(w, http.StatusOK, doc)
}
