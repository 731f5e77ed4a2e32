package picker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/decide"
	"github.com/kvroute/kvroute/picker/fleet"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/pickapi"
	"github.com/kvroute/kvroute/picker/score"
)

// poolingPaths are vLLM's pooling endpoints (served by engines started
// with --runner pooling): the picker balances them by load.
func poolingPaths() []string {
	return []string{"/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"}
}

// passthroughRoutes registers the rest of vLLM's OpenAI server, which the
// picker serves without cache-aware scoring: the model list (the union of
// the routable engines'), the pooling endpoints (the least loaded engine
// of the model's group), tokenize and detokenize (an engine of the
// group, as render chooses one) and /version.
func (r *Router) passthroughRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/models", r.handleModelList)
	mux.HandleFunc("GET /v1/models/{id...}", r.handleModelGet)
	for _, path := range poolingPaths() {
		mux.HandleFunc("POST "+path, r.handleGrouped(path, r.leastLoaded))
	}
	for _, path := range []string{"/tokenize", "/detokenize"} {
		mux.HandleFunc("POST "+path, r.handleGrouped(path, r.renderer))
	}
	mux.HandleFunc("GET /version", r.handleVersion)
}

// chooser picks an endpoint of an identity group for a passthrough
// request, none of those already tried; nil when none is left.
type chooser func(group string, tried map[string]bool) *Pick

// handleGrouped serves a body naming a model: the model's identity group
// is resolved as for any request, an endpoint of it chosen, the body
// forwarded as received.
func (r *Router) handleGrouped(path string, choose chooser) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		body, err := readBody(w, req, r.cfg.MaxBodyBytes)
		if err != nil {
			writeError(w, err)
			return
		}
		if body, err = r.tenantBody(req, body, false); err != nil {
			writeError(w, err)
			return
		}
		model, err := r.parser.Model(body)
		if err != nil {
			writeError(w, err)
			return
		}
		ref, err := r.models.resolve(model)
		if err != nil {
			writeError(w, err)
			return
		}
		recordOf(req.Context()).model = model
		r.relay(w, req, intake.Any, path, body, func(tried map[string]bool) (*Pick, error) {
			return orNone(choose(ref.group, tried), noEndpoints(model))
		})
	}
}

// leastLoaded chooses the routable endpoint of the group with the least
// load — waiting and running from its last report plus this picker's
// picks in flight — as the load-only decision does (picker/decide: ties
// go by the rendezvous weight of the request count, so idle engines take
// turns, and no random source), and books the pick in flight until Done.
func (r *Router) leastLoaded(group string, tried map[string]bool) *Pick {
	ro := r.groupRoster(group)
	if ro == nil || len(ro.Endpoints) == 0 {
		return nil
	}
	now := r.now()
	dreq := decide.Request{Request: score.Request{LoadOnly: true, Counter: r.counter.Add(1) - 1}, Exclude: tried}
	d := r.decideIn(dreq, r.snapshot(&Prepared{ro: ro}, now), now)
	if !d.OK() {
		return nil
	}
	p := relayPick(d.Endpoint)
	r.bookings.book(p, 0, false, now) // no prompt known: counted, no prefill work
	return p
}

// renderer chooses the engine of the group that would render the group's
// tokens (decide.RenderOrder: routable, least loaded by its last report).
func (r *Router) renderer(group string, tried map[string]bool) *Pick {
	return firstUntried(decide.RenderOrderOf(&r.dcfg, r.groupRoster(group), r.now()), tried)
}

func firstUntried(urls []string, tried map[string]bool) *Pick {
	for _, u := range urls {
		if !tried[u] {
			return relayPick(u)
		}
	}
	return nil
}

// orNone is p, or none when p is nil (no endpoint left to try).
func orNone(p *Pick, none error) (*Pick, error) {
	if p == nil {
		return nil, none
	}
	return p, nil
}

func relayPick(endpoint string) *Pick {
	return &Pick{Answer: pickapi.Answer{Endpoint: endpoint, EndpointID: endpointID(endpoint)}, loadOnly: true, relay: true}
}

// handleVersion answers GET /version as a routable engine does: vLLM's
// {"version": …}.
func (r *Router) handleVersion(w http.ResponseWriter, req *http.Request) {
	engines := decide.RenderOrder(&r.dcfg, r.fleet.Endpoints(), r.now())
	r.relay(w, req, intake.Any, "/version", nil, func(tried map[string]bool) (*Pick, error) { return orNone(firstUntried(engines, tried), noEngine()) })
}

// noEngine refuses a request any engine could answer when none is
// routable.
func noEngine() *intake.Error {
	return &intake.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_healthy_endpoint",
		Message: "No healthy endpoint is known right now."}
}

// maxModelList bounds one engine's /v1/models answer.
const maxModelList = 4 << 20

// modelListFanout bounds the engines asked for their model list at once.
const modelListFanout = 8

// modelCard is one entry of an engine's /v1/models: its id, and the card
// as the engine wrote it (vLLM's ModelCard).
type modelCard struct {
	id  string
	raw json.RawMessage
}

// unionModels is the union of model lists, in the order given: a card
// per id, the first list's that names it; cards without an id are
// dropped.
func unionModels(lists [][]modelCard) []modelCard {
	out := []modelCard{}
	seen := map[string]bool{}
	for _, list := range lists {
		for _, c := range list {
			if c.id == "" || seen[c.id] {
				continue
			}
			seen[c.id] = true
			out = append(out, c)
		}
	}
	return out
}

// parseModelList reads an engine's /v1/models answer.
func parseModelList(body []byte) ([]modelCard, error) {
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, err
	}
	out := make([]modelCard, 0, len(list.Data))
	for _, raw := range list.Data {
		var c struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(raw, &c) == nil {
			out = append(out, modelCard{id: c.ID, raw: raw})
		}
	}
	return out, nil
}

// listed is one engine's answer to GET /v1/models.
type listed struct {
	status int
	header http.Header
	body   []byte
	err    error // no answer
}

// modelLists asks every routable endpoint for its model list, with the
// client's headers (its API key), at most modelListFanout at once,
// within the render timeout. The lists come in a stable order: larger
// identity groups first, as the directory resolves a name served by
// several, each group's endpoints by URL.
func (r *Router) modelLists(req *http.Request) []listed {
	now := r.now()
	var urls []string
	for _, g := range groupsOf(r.fleet.Endpoints()) {
		for i := range g.endpoints {
			if r.routable(&g.endpoints[i], now) {
				urls = append(urls, g.endpoints[i].URL)
			}
		}
	}
	ctx, cancel := context.WithTimeout(req.Context(), r.cfg.TokenizeTimeout)
	defer cancel()
	out := make([]listed, len(urls))
	slots := make(chan struct{}, modelListFanout)
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			out[i] = r.fetchModels(ctx, req.Header, u)
			if out[i].err != nil && req.Context().Err() == nil {
				r.reportFailure(u, "models: "+out[i].err.Error())
				r.log.Debug("model list", zap.String("engine", u), zap.Error(out[i].err))
			}
		}()
	}
	wg.Wait()
	return out
}

func (r *Router) routable(e *fleet.Endpoint, now time.Time) bool {
	return e.HealthAt(now, r.cfg.Health).Routable()
}

func (r *Router) fetchModels(ctx context.Context, h http.Header, base string) listed {
	out, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return listed{err: err}
	}
	out.Header = h.Clone()
	dropHop(out.Header)
	out.Header.Del("X-Kvroute-Cache")
	resp, err := r.proxy.Do(out)
	if err != nil {
		return listed{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxModelList+1))
	switch {
	case err != nil:
		return listed{err: err}
	case len(body) > maxModelList:
		return listed{err: fmt.Errorf("/v1/models answer over %d bytes", maxModelList)}
	}
	return listed{status: resp.StatusCode, header: resp.Header, body: body}
}

// modelUnion is the union of the routable endpoints' model lists. With
// no list to be had, failed answers the client: the first engine's own
// refusal (its API key check, say) as it worded it, else a 502, or a 503
// when no endpoint is routable.
func (r *Router) modelUnion(req *http.Request) (cards []modelCard, failed func(http.ResponseWriter)) {
	answers := r.modelLists(req)
	var lists [][]modelCard
	var refusal *listed
	for i := range answers {
		a := &answers[i]
		switch {
		case a.err != nil:
		case a.status == http.StatusOK:
			list, err := parseModelList(a.body)
			if err != nil {
				r.log.Debug("model list", zap.Error(err))
				continue
			}
			lists = append(lists, list)
		case refusal == nil:
			refusal = a
		}
	}
	switch {
	case lists != nil:
		return unionModels(lists), nil
	case refusal != nil:
		return nil, func(w http.ResponseWriter) {
			if ct := refusal.header.Get("Content-Type"); ct != "" {
				w.Header().Set("Content-Type", ct)
			}
			w.WriteHeader(refusal.status)
			_, _ = w.Write(refusal.body)
		}
	case len(answers) == 0:
		return nil, func(w http.ResponseWriter) { writeError(w, noEngine()) }
	}
	return nil, func(w http.ResponseWriter) {
		writeError(w, &intake.Error{Status: http.StatusBadGateway, Type: "bad_gateway", Code: "engine_unavailable",
			Message: "No engine could list its models; try again."})
	}
}

// handleModelList answers GET /v1/models in vLLM's shape: {"object":
// "list", "data": [ModelCard…]}, a card per model id over every routable
// endpoint, LoRA adapters included.
func (r *Router) handleModelList(w http.ResponseWriter, req *http.Request) {
	cards, failed := r.modelUnion(req)
	if failed != nil {
		failed(w)
		return
	}
	data := make([]json.RawMessage, len(cards))
	for i, c := range cards {
		data[i] = c.raw
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// handleModelGet answers GET /v1/models/{id} with the model's card, or
// a 404 in OpenAI's error format.
func (r *Router) handleModelGet(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	cards, failed := r.modelUnion(req)
	if failed != nil {
		failed(w)
		return
	}
	for _, c := range cards {
		if c.id == id {
			writeRaw(w, http.StatusOK, c.raw)
			return
		}
	}
	writeError(w, modelNotFound(id))
}
