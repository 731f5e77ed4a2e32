package enginesim

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// maxBody caps request bodies.
const maxBody = 64 << 20

// maxPrompts caps the prompts of one completions request.
const maxPrompts = 1024

// SimVersion is what /version reports.
const SimVersion = "0.29.0+kvroute.sim"

// newID makes an answer's or a request's id: prefix, the process start,
// the rank and the engine's request count.
func (e *Engine) newID(prefix string) string {
	return fmt.Sprintf("%s%x%04x%08x", prefix, e.started.Load()&0xffffffff, e.rank, e.nextID.Add(1))
}

func (e *Engine) handler() http.Handler {
	mux := http.NewServeMux()
	// vLLM registers the generative routes for a generative model and the
	// pooling routes for a pooling one (api_server.build_app); a route it
	// does not register answers as any unknown route does.
	routes := map[string]bool{} // the patterns served: for 405's Allow
	serve := func(served bool, pattern string, h http.HandlerFunc) {
		if !served {
			h = e.otherRunner
		}
		routes[pattern] = served
		mux.HandleFunc(pattern, h)
	}
	pooling := e.cfg.pooling()
	serve(!pooling, "POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { e.generate(w, r, &chatGen{e: e}) })
	serve(!pooling, "POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { e.generate(w, r, &completionsGen{e: e}) })
	serve(!pooling, "POST /v1/responses", func(w http.ResponseWriter, r *http.Request) { e.generate(w, r, &responsesGen{e: e}) })
	serve(!pooling, "POST /v1/chat/completions/render", e.handleChatRender)
	serve(!pooling, "POST /v1/completions/render", e.handleCompletionsRender)
	if e.cfg.EnableScaleOutEndpoints {
		serve(!pooling, "POST /v1/responses/render", e.handleResponsesRender)
	}
	serve(pooling, "POST /v1/embeddings", e.handleEmbeddings)
	serve(pooling, "POST /pooling", e.handlePooling)
	serve(pooling, "POST /classify", e.handleClassify)
	for _, p := range []string{"/score", "/v1/score"} {
		serve(pooling, "POST "+p, e.handleScore)
	}
	for _, p := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
		serve(pooling, "POST "+p, e.handleRerank)
	}
	serve(true, "POST /tokenize", e.handleTokenize)
	serve(true, "POST /detokenize", e.handleDetokenize)
	serve(true, "GET /v1/models", e.handleModels)
	serve(true, "GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	serve(true, "GET /version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": SimVersion})
	})
	serve(true, "POST /reset_prefix_cache", e.handleReset)
	serve(true, "GET /metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}).ServeHTTP)
	serve(true, "POST /sim/restart", e.handleRestart)
	serve(true, "POST /sim/faults", e.handleFaults)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { e.unrouted(w, r, mux, routes) })
	return mux
}

// unrouted answers a request no route took as vLLM's FastAPI app does: a
// path it serves for other methods gets 405 {"detail":"Method Not
// Allowed"} with an Allow header (a GET route allows HEAD too), any other
// path the 404.
func (e *Engine) unrouted(w http.ResponseWriter, r *http.Request, mux *http.ServeMux, routes map[string]bool) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if _, pattern := mux.Handler(probe); routes[pattern] {
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		e.notFound(w, r)
		return
	}
	e.metrics.httpErrors.WithLabelValues(r.URL.Path, strconv.Itoa(http.StatusMethodNotAllowed)).Inc()
	w.Header().Set("Allow", strings.Join(allow, ", "))
	writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
}

// notFound answers as vLLM answers a route it does not serve: FastAPI's
// 404 {"detail":"Not Found"} (vLLM's own error handler is registered for
// FastAPI's HTTPException, not for the router's Starlette one).
// otherRunner answers a route of the other runner (pooling routes on a
// generative engine, generative ones on a pooling engine) as vLLM does, a
// 404 that says nothing more (current vLLM's build_app registers the
// pooling routers only for a model with pooling tasks; the 400 "The model
// does not support Embeddings API" was older vLLM's, whose routes were all
// registered). The hint is for the operator: the log says once which
// runner serves the route.
func (e *Engine) otherRunner(w http.ResponseWriter, r *http.Request) {
	if e.runnerHinted.CompareAndSwap(false, true) {
		runner, serves := RunnerPooling, "pooling (embeddings, pooling, classify, score, rerank)"
		if e.cfg.pooling() {
			runner, serves = RunnerGenerate, "generative (chat, completions, Responses)"
		}
		e.log.Warn("a route of the other runner was requested; it answers 404, as vLLM does: start the engine with --runner "+runner+" to serve "+serves+" routes",
			zap.String("path", r.URL.Path), zap.String("runner", e.cfg.Runner))
	}
	e.notFound(w, r)
}

func (e *Engine) notFound(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if r.Pattern == "/" {
		path = "other" // any path the client made up: not a label value
	}
	e.metrics.httpErrors.WithLabelValues(path, strconv.Itoa(http.StatusNotFound)).Inc()
	writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
}
