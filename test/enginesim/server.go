package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/test/enginesim/chat"
	"github.com/kvroute/kvroute/test/enginesim/kvcache"
)

// maxBody caps request bodies.
const maxBody = 64 << 20

// maxPrompts caps the prompts of one completions request.
const maxPrompts = 1024

// SimVersion is what /version reports.
const SimVersion = "0.29.0+kvroute.sim"

var idCounter atomic.Uint64

func (e *Engine) newID(prefix string) string {
	return fmt.Sprintf("%s%x%04x%08x", prefix, e.started.Load()&0xffffffff, e.rank, idCounter.Add(1))
}

func (e *Engine) handler() http.Handler {
	mux := http.NewServeMux()
	// vLLM registers the generative routes for a generative model and the
	// pooling routes for a pooling one (api_server.build_app); a route it
	// does not register answers as any unknown route does.
	routes := map[string]bool{} // the patterns served: for 405's Allow
	serve := func(served bool, pattern string, h http.HandlerFunc) {
		if !served {
			h = e.notFound
		}
		routes[pattern] = served
		mux.HandleFunc(pattern, h)
	}
	pooling := e.cfg.pooling()
	serve(!pooling, "POST /v1/chat/completions", e.handleChat)
	serve(!pooling, "POST /v1/completions", e.handleCompletions)
	serve(!pooling, "POST /v1/responses", e.handleResponses)
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
func (e *Engine) notFound(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if r.Pattern == "/" {
		path = "other" // any path the client made up: not a label value
	}
	e.metrics.httpErrors.WithLabelValues(path, strconv.Itoa(http.StatusNotFound)).Inc()
	writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
}

// apiError is an error with its HTTP status.
type apiError struct {
	status int
	msg    string
	param  string
}

func (a *apiError) Error() string { return a.msg }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		return "BadRequestError"
	}
	return "InternalServerError"
}

// fail writes vLLM's OpenAI error body and counts the failure.
func (e *Engine) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	e.failParam(w, r, &apiError{status: status, msg: msg})
}

func (e *Engine) failParam(w http.ResponseWriter, r *http.Request, a *apiError) {
	e.metrics.httpErrors.WithLabelValues(r.URL.Path, strconv.Itoa(a.status)).Inc()
	var param any
	if a.param != "" {
		param = a.param
	}
	writeJSON(w, a.status, map[string]any{"error": map[string]any{
		"message": a.msg, "type": errorType(a.status), "param": param, "code": a.status,
	}})
}

func (e *Engine) failErr(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		e.streamFailed(r, err) // the client went away: nobody to answer
		return
	}
	var a *apiError
	if errors.As(err, &a) {
		e.failParam(w, r, a)
		return
	}
	var u *chat.UnsupportedError
	if errors.As(err, &u) {
		e.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	e.fail(w, r, http.StatusInternalServerError, err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeBody reads a JSON object body into v (unknown fields are ignored,
// as vLLM's request models allow them).
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body exceeds %d bytes", maxBody)}
		}
		return badRequest("reading the request body: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("Invalid JSON in request body: %v", err)
	}
	return nil
}

// identity is what a request's model name resolves to.
type identity struct {
	model  string // the name to report
	lora   string
	loraID int
}

// resolveModel maps a request's model name to the base model or a LoRA
// adapter; an empty name means the first served name.
func (e *Engine) resolveModel(name string) (identity, error) {
	served := e.cfg.servedNames()
	if name == "" {
		return identity{model: served[0]}, nil
	}
	for _, n := range served {
		if n == name {
			return identity{model: n}, nil
		}
	}
	for i, m := range e.cfg.LoRAModules {
		if m.Name == name {
			return identity{model: name, lora: name, loraID: i + 1}, nil
		}
	}
	return identity{}, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", name), param: "model"}
}

func checkSalt(salt *string) error {
	if salt != nil && *salt == "" {
		return &apiError{status: http.StatusBadRequest, msg: "Parameter 'cache_salt' must be a non-empty string if provided.", param: "cache_salt"}
	}
	return nil
}

func saltOf(salt *string) string {
	if salt == nil {
		return ""
	}
	return *salt
}

// checkLength enforces max_model_len and returns the output budget:
// maxTokens when set, else what the context leaves (or def when def > 0).
func (e *Engine) checkLength(promptLen int, maxTokens *int, def int) (int, error) {
	limit := e.cfg.MaxModelLen
	if promptLen > limit {
		return 0, badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, promptLen)
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return 0, badRequest("max_tokens must be at least 1, got %d.", *maxTokens)
		}
		if *maxTokens > limit-promptLen {
			return 0, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", limit, promptLen+*maxTokens, promptLen, *maxTokens)
		}
		return *maxTokens, nil
	}
	if def > 0 {
		return min(def, limit-promptLen), nil
	}
	return max(limit-promptLen, 1), nil
}

// run is a set of prompts in the engine for one HTTP request.
type run struct {
	done   <-chan struct{} // the engine's scheduler has stopped
	box    *mailbox
	reqs   []*request
	prompt []int
}

func (e *Engine) start(ctx context.Context, id identity, salt string, prompts [][]uint32, maxTokens []int, ignoreEOS bool) (*run, error) {
	rn := &run{box: newMailbox(), done: e.done}
	for i, p := range prompts {
		if len(p) == 0 {
			return nil, badRequest("The prompt is empty.")
		}
		r := &request{
			index:     i,
			seq:       &kvcache.Seq{Tokens: append([]uint32(nil), p...), LoRA: id.lora, LoraID: id.loraID, Salt: salt},
			promptLen: len(p),
			gen:       newGenerator(p, salt),
			box:       rn.box,
		}
		r.target = maxTokens[i]
		if !ignoreEOS {
			r.stopAt = r.gen.naturalLength()
			r.target = min(r.target, r.stopAt)
		}
		rn.reqs = append(rn.reqs, r)
		rn.prompt = append(rn.prompt, len(p))
	}
	if err := e.submit(ctx, rn.reqs...); err != nil {
		rn.cancel()
		return nil, &apiError{status: http.StatusServiceUnavailable, msg: err.Error()}
	}
	return rn, nil
}

func (rn *run) cancel() {
	for _, r := range rn.reqs {
		r.cancelled.Store(true)
	}
}

// output is one prompt's result.
type output struct {
	tokens []uint32
	cached int
	finish string
}

// each delivers updates until every prompt is done, the handler's context
// ends, or fn returns an error.
func (rn *run) each(ctx context.Context, fn func(update) error) error {
	left := len(rn.reqs)
	for left > 0 {
		select {
		case <-rn.box.notify:
		case <-ctx.Done():
			rn.cancel()
			return ctx.Err()
		case <-rn.done:
			if rn.box.empty() {
				rn.cancel()
				return &apiError{status: http.StatusServiceUnavailable, msg: ErrClosed.Error()}
			}
		}
		for _, u := range rn.box.take() {
			if u.err != nil {
				rn.cancel()
				return &apiError{status: http.StatusInternalServerError, msg: "request aborted: " + u.err.Error()}
			}
			if err := fn(u); err != nil {
				rn.cancel()
				return err
			}
			if u.done {
				left--
			}
		}
	}
	return nil
}

// collect waits for every prompt's full output.
func (rn *run) collect(ctx context.Context) ([]output, error) {
	outs := make([]output, len(rn.reqs))
	err := rn.each(ctx, func(u update) error {
		o := &outs[u.index]
		if u.first {
			o.cached = u.cachedTokens
		}
		if u.hasToken {
			o.tokens = append(o.tokens, u.token)
		}
		if u.done {
			o.finish = u.finish
		}
		return nil
	})
	return outs, err
}

func text(tokens []uint32) string {
	s, _ := chat.Decode(tokens, true)
	return s
}

// usage builds the chat/completions usage object; prompt_tokens_details is
// there only with --enable-prompt-tokens-details and a non-zero hit.
func (e *Engine) usage(prompt, completion, cached int) map[string]any {
	u := map[string]any{"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
	if e.cfg.EnablePromptTokensDetails && cached > 0 {
		u["prompt_tokens_details"] = map[string]any{"cached_tokens": cached}
	}
	return u
}

// sse writes server-sent events.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, rc: http.NewResponseController(w)}
	// The headers go at once, as uvicorn sends a streaming response's
	// start before its first body chunk; the body waits for the output.
	_ = s.rc.Flush()
	return s
}

func (s *sse) data(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "data: %s\n\n", b); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sse) event(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", name, b); err != nil {
		return err
	}
	return s.rc.Flush()
}

func (s *sse) done() {
	fmt.Fprint(s.w, "data: [DONE]\n\n")
	_ = s.rc.Flush()
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// ---- /v1/chat/completions ----

type chatRequest struct {
	Model                string          `json:"model"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	N                    *int            `json:"n"`
	CacheSalt            *string         `json:"cache_salt"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	IgnoreEOS            bool            `json:"ignore_eos"`
	RequestID            string          `json:"request_id"`
}

// renderChat turns a chat body into tokens, with vLLM's checks.
func (e *Engine) renderChat(req *chatRequest) ([]uint32, error) {
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	if addGen && req.ContinueFinalMessage {
		return nil, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	msgs, err := chat.ParseChatMessages(req.Messages)
	if err != nil {
		return nil, asBadRequest(err)
	}
	tools, err := chat.ParseChatTools(req.Tools)
	if err != nil {
		return nil, asBadRequest(err)
	}
	toks, err := chat.Render(msgs, tools, chat.RenderOptions{AddGenerationPrompt: addGen, ContinueFinalMessage: req.ContinueFinalMessage,
		Variant: e.cfg.Sim.ChatTemplate})
	if err != nil {
		return nil, asBadRequest(err)
	}
	return toks, nil
}

func asBadRequest(err error) error {
	var a *apiError
	if errors.As(err, &a) {
		return err
	}
	return badRequest("%s", err.Error())
}

func checkN(n *int) error {
	if n != nil && *n != 1 {
		return badRequest("n=%d is not supported by the simulated engine (only n=1).", *n)
	}
	return nil
}

// prepareChat decodes and checks a chat body, renders it and sizes its
// output budget, with vLLM's checks in vLLM's order.
func (e *Engine) prepareChat(w http.ResponseWriter, r *http.Request, req *chatRequest) (identity, []uint32, int, error) {
	if err := decodeBody(w, r, req); err != nil {
		return identity{}, nil, 0, err
	}
	if err := checkSalt(req.CacheSalt); err != nil {
		return identity{}, nil, 0, err
	}
	id, err := e.resolveModel(req.Model)
	if err != nil {
		return id, nil, 0, err
	}
	if err := checkN(req.N); err != nil {
		return id, nil, 0, err
	}
	toks, err := e.renderChat(req)
	if err != nil {
		return id, nil, 0, err
	}
	maxTok := req.MaxCompletionTokens
	if maxTok == nil {
		maxTok = req.MaxTokens
	}
	budget, err := e.checkLength(len(toks), maxTok, 0)
	return id, toks, budget, err
}

func (e *Engine) handleChat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	id, toks, budget, err := e.prepareChat(w, r, &req)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	rn, err := e.start(r.Context(), id, saltOf(req.CacheSalt), [][]uint32{toks}, []int{budget}, req.IgnoreEOS)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	rid := e.newID("chatcmpl-")
	created := time.Now().Unix()
	if !req.Stream {
		outs, err := rn.collect(r.Context())
		if err != nil {
			e.failErr(w, r, err)
			return
		}
		o := outs[0]
		writeJSON(w, http.StatusOK, map[string]any{
			"id": rid, "object": "chat.completion", "created": created, "model": id.model,
			"choices": []any{map[string]any{
				"index":         0,
				"message":       map[string]any{"role": "assistant", "content": text(o.tokens), "tool_calls": []any{}},
				"logprobs":      nil,
				"finish_reason": o.finish,
				"stop_reason":   nil,
			}},
			"usage":              e.usage(len(toks), len(o.tokens), o.cached),
			"prompt_logprobs":    nil,
			"kv_transfer_params": nil,
			"service_tier":       nil,
			"system_fingerprint": nil,
		})
		return
	}
	s := newSSE(w)
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": rid, "object": "chat.completion.chunk", "created": created, "model": id.model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}}
	}
	var n, cached int
	err = rn.each(r.Context(), func(u update) error {
		if u.first {
			cached = u.cachedTokens
			// vLLM sends the role chunk with the request's first output,
			// after its prefill (an error before it is the first event).
			if err := s.data(chunk(map[string]any{"role": "assistant", "content": ""}, nil)); err != nil {
				return err
			}
		}
		if u.hasToken {
			n++
			return s.data(chunk(map[string]any{"content": text([]uint32{u.token})}, nil))
		}
		if u.done {
			return s.data(chunk(map[string]any{}, u.finish))
		}
		return nil
	})
	if err != nil {
		e.streamFailed(r, err)
		return
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		_ = s.data(map[string]any{"id": rid, "object": "chat.completion.chunk", "created": created, "model": id.model,
			"choices": []any{}, "usage": e.usage(len(toks), n, cached)})
	}
	s.done()
}

// streamFailed counts a stream that broke after its headers were sent.
func (e *Engine) streamFailed(r *http.Request, err error) {
	status := http.StatusInternalServerError
	if errors.Is(err, context.Canceled) {
		status = 499 // client closed the request
	}
	e.metrics.httpErrors.WithLabelValues(r.URL.Path, strconv.Itoa(status)).Inc()
	e.log.Debug("stream ended early", zap.String("path", r.URL.Path), zap.Error(err))
}

// ---- /v1/completions ----

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	MaxTokens     *int            `json:"max_tokens"`
	N             *int            `json:"n"`
	CacheSalt     *string         `json:"cache_salt"`
	IgnoreEOS     bool            `json:"ignore_eos"`
	Echo          bool            `json:"echo"`
}

// parsePrompts accepts a string, a list of strings, a list of token ids,
// or a list of lists of token ids: the field (prompt, or a pooling body's
// input) as named in errors.
func parsePrompts(field string, raw json.RawMessage) ([][]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("%s is required", field)
	}
	if ids, ok := tokenIDs(raw); ok { // the common token-id prompt, fast
		return [][]uint32{ids}, checkIDs(ids)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return [][]uint32{chat.Encode(s)}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return nil, badRequest("%s must be a string, a list of strings, a list of token ids or a list of lists of token ids", field)
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		return [][]uint32{ids}, checkIDs(ids)
	}
	if len(items) > maxPrompts {
		return nil, badRequest("%d prompts in one request; at most %d", len(items), maxPrompts)
	}
	var out [][]uint32
	for i, it := range items {
		if err := json.Unmarshal(it, &s); err == nil {
			out = append(out, chat.Encode(s))
			continue
		}
		ids := []uint32(nil) // a fresh slice: Unmarshal reuses a non-nil one
		if err := json.Unmarshal(it, &ids); err != nil {
			return nil, badRequest("%s[%d] must be a string or a list of token ids", field, i)
		}
		if err := checkIDs(ids); err != nil {
			return nil, err
		}
		out = append(out, ids)
	}
	return out, nil
}

// tokenIDs parses a JSON array of plain non-negative integers (no sign,
// fraction, exponent or leading zero) below 2^32; anything else is left to
// encoding/json (ok=false), which also words the errors.
func tokenIDs(raw json.RawMessage) (ids []uint32, ok bool) {
	i := 0
	space := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	space()
	if i == len(raw) || raw[i] != '[' {
		return nil, false
	}
	i++
	space()
	if i < len(raw) && raw[i] == ']' {
		return nil, false // empty: the general path's error
	}
	ids = make([]uint32, 0, len(raw)/4)
	for {
		start, v := i, uint64(0)
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + uint64(raw[i]-'0')
			if v > 1<<32-1 {
				return nil, false
			}
			i++
		}
		if i == start || (raw[start] == '0' && i-start > 1) {
			return nil, false
		}
		ids = append(ids, uint32(v))
		space()
		if i == len(raw) {
			return nil, false
		}
		if raw[i] == ']' {
			i++
			space()
			return ids, i == len(raw)
		}
		if raw[i] != ',' {
			return nil, false
		}
		i++
		space()
	}
}

func checkIDs(ids []uint32) error {
	for _, id := range ids {
		if id >= chat.VocabSize {
			return badRequest("Token id %d is out of vocabulary", id)
		}
	}
	return nil
}

func (e *Engine) prepareCompletion(w http.ResponseWriter, r *http.Request, req *completionRequest) (identity, [][]uint32, []int, error) {
	if err := decodeBody(w, r, req); err != nil {
		return identity{}, nil, nil, err
	}
	if err := checkSalt(req.CacheSalt); err != nil {
		return identity{}, nil, nil, err
	}
	id, err := e.resolveModel(req.Model)
	if err != nil {
		return id, nil, nil, err
	}
	if err := checkN(req.N); err != nil {
		return id, nil, nil, err
	}
	prompts, err := parsePrompts("prompt", req.Prompt)
	if err != nil {
		return id, nil, nil, err
	}
	budgets := make([]int, len(prompts))
	for i, p := range prompts {
		// vLLM's completions default max_tokens is 16.
		if budgets[i], err = e.checkLength(len(p), req.MaxTokens, 16); err != nil {
			return id, nil, nil, err
		}
	}
	return id, prompts, budgets, nil
}

func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	id, prompts, budgets, err := e.prepareCompletion(w, r, &req)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	rn, err := e.start(r.Context(), id, saltOf(req.CacheSalt), prompts, budgets, req.IgnoreEOS)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	rid := e.newID("cmpl-")
	created := time.Now().Unix()
	promptTotal := 0
	for _, n := range rn.prompt {
		promptTotal += n
	}
	if !req.Stream {
		outs, err := rn.collect(r.Context())
		if err != nil {
			e.failErr(w, r, err)
			return
		}
		var choices []any
		gen, cached := 0, 0
		for i, o := range outs {
			choices = append(choices, map[string]any{"index": i, "text": text(o.tokens), "logprobs": nil,
				"finish_reason": o.finish, "stop_reason": nil, "prompt_logprobs": nil})
			gen += len(o.tokens)
			cached = o.cached // vLLM reports the last prompt's num_cached_tokens
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": rid, "object": "text_completion", "created": created,
			"model": id.model, "choices": choices, "usage": e.usage(promptTotal, gen, cached), "kv_transfer_params": nil})
		return
	}
	s := newSSE(w)
	gen, cached := 0, 0
	err = rn.each(r.Context(), func(u update) error {
		if u.first && u.index == len(rn.reqs)-1 {
			cached = u.cachedTokens // the last prompt's, as vLLM reports it
		}
		var t string
		var finish any
		switch {
		case u.hasToken:
			gen++
			t = text([]uint32{u.token})
		case u.done:
			finish = u.finish
		default:
			return nil
		}
		return s.data(map[string]any{"id": rid, "object": "text_completion", "created": created, "model": id.model,
			"choices": []any{map[string]any{"index": u.index, "text": t, "logprobs": nil, "finish_reason": finish, "stop_reason": nil}}})
	})
	if err != nil {
		e.streamFailed(r, err)
		return
	}
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		_ = s.data(map[string]any{"id": rid, "object": "text_completion", "created": created, "model": id.model,
			"choices": []any{}, "usage": e.usage(promptTotal, gen, cached)})
	}
	s.done()
}

// ---- /v1/responses ----

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	Tools              json.RawMessage `json:"tools"`
	Stream             bool            `json:"stream"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	PreviousResponseID *string         `json:"previous_response_id"`
	CacheSalt          *string         `json:"cache_salt"`
	IgnoreEOS          bool            `json:"ignore_eos"`
}

func (e *Engine) renderResponses(req *responsesRequest) ([]uint32, error) {
	if req.PreviousResponseID != nil && *req.PreviousResponseID != "" {
		return nil, &apiError{status: http.StatusBadRequest, param: "previous_response_id",
			msg: "previous_response_id is not supported: this engine is stateless; send the full conversation in input"}
	}
	if len(req.Input) == 0 || string(req.Input) == "null" {
		return nil, &apiError{status: http.StatusBadRequest, param: "input", msg: "input is required"}
	}
	instr := ""
	if req.Instructions != nil {
		instr = *req.Instructions
	}
	msgs, tools, err := chat.ParseResponsesInput(instr, req.Input, req.Tools)
	if err != nil {
		return nil, asBadRequest(err)
	}
	toks, err := chat.Render(msgs, tools, chat.RenderOptions{AddGenerationPrompt: true, Variant: e.cfg.Sim.ChatTemplate})
	if err != nil {
		return nil, asBadRequest(err)
	}
	return toks, nil
}

// prepareResponses decodes and checks a Responses body, renders it and
// sizes its output budget.
func (e *Engine) prepareResponses(w http.ResponseWriter, r *http.Request, req *responsesRequest) (identity, []uint32, int, error) {
	if err := decodeBody(w, r, req); err != nil {
		return identity{}, nil, 0, err
	}
	if err := checkSalt(req.CacheSalt); err != nil {
		return identity{}, nil, 0, err
	}
	id, err := e.resolveModel(req.Model)
	if err != nil {
		return id, nil, 0, err
	}
	toks, err := e.renderResponses(req)
	if err != nil {
		return id, nil, 0, err
	}
	budget, err := e.checkLength(len(toks), req.MaxOutputTokens, 0)
	return id, toks, budget, err
}

func (e *Engine) handleResponses(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	id, toks, budget, err := e.prepareResponses(w, r, &req)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	rn, err := e.start(r.Context(), id, saltOf(req.CacheSalt), [][]uint32{toks}, []int{budget}, req.IgnoreEOS)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	respID, msgID := e.newID("resp_"), e.newID("msg_")
	created := time.Now().Unix()
	response := func(status string, output []any, usage any) map[string]any {
		var instr any
		if req.Instructions != nil {
			instr = *req.Instructions
		}
		return map[string]any{"id": respID, "object": "response", "created_at": created, "model": id.model,
			"status": status, "output": output, "usage": usage, "instructions": instr, "error": nil,
			"incomplete_details": nil, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{},
			"temperature": 1.0, "top_p": 1.0, "metadata": map[string]any{}, "text": map[string]any{"format": map[string]any{"type": "text"}}}
	}
	message := func(status, t string) map[string]any {
		content := []any{}
		if status == "completed" {
			content = []any{map[string]any{"type": "output_text", "text": t, "annotations": []any{}, "logprobs": []any{}}}
		}
		return map[string]any{"id": msgID, "type": "message", "role": "assistant", "status": status, "content": content}
	}
	usage := func(out, cached int) map[string]any {
		if !e.cfg.EnablePromptTokensDetails {
			cached = 0
		}
		return map[string]any{"input_tokens": len(toks), "input_tokens_details": map[string]any{"cached_tokens": cached},
			"output_tokens": out, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": len(toks) + out}
	}
	if !req.Stream {
		outs, err := rn.collect(r.Context())
		if err != nil {
			e.failErr(w, r, err)
			return
		}
		o := outs[0]
		writeJSON(w, http.StatusOK, response("completed", []any{message("completed", text(o.tokens))}, usage(len(o.tokens), o.cached)))
		return
	}
	s := newSSE(w)
	seq := 0
	ev := func(typ string, fields map[string]any) error {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		return s.event(typ, fields)
	}
	if ev("response.created", map[string]any{"response": response("in_progress", []any{}, nil)}) != nil ||
		ev("response.in_progress", map[string]any{"response": response("in_progress", []any{}, nil)}) != nil ||
		ev("response.output_item.added", map[string]any{"output_index": 0, "item": message("in_progress", "")}) != nil ||
		ev("response.content_part.added", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}}) != nil {
		rn.cancel()
		return
	}
	var all []uint32
	cached := 0
	err = rn.each(r.Context(), func(u update) error {
		if u.first {
			cached = u.cachedTokens
		}
		if !u.hasToken {
			return nil
		}
		all = append(all, u.token)
		return ev("response.output_text.delta", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0,
			"delta": text([]uint32{u.token}), "logprobs": []any{}})
	})
	if err != nil {
		e.streamFailed(r, err)
		return
	}
	full := text(all)
	part := map[string]any{"type": "output_text", "text": full, "annotations": []any{}, "logprobs": []any{}}
	_ = ev("response.output_text.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "text": full, "logprobs": []any{}})
	_ = ev("response.content_part.done", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "part": part})
	_ = ev("response.output_item.done", map[string]any{"output_index": 0, "item": message("completed", full)})
	_ = ev("response.completed", map[string]any{"response": response("completed", []any{message("completed", full)}, usage(len(all), cached))})
}

// ---- render, tokenize, detokenize ----

// generateRequest is vLLM's GenerateRequest as the render endpoints return it.
func (e *Engine) generateRequest(id identity, toks []uint32, salt *string, maxTokens int) map[string]any {
	var s any
	if salt != nil {
		s = *salt
	}
	return map[string]any{
		"request_id":         e.newID("render-"),
		"token_ids":          toks,
		"features":           nil,
		"sampling_params":    map[string]any{"max_tokens": maxTokens},
		"model":              id.model,
		"stream":             false,
		"cache_salt":         s,
		"priority":           0,
		"kv_transfer_params": nil,
	}
}

func (e *Engine) handleChatRender(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	id, toks, budget, err := e.prepareChat(w, r, &req)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, e.generateRequest(id, toks, req.CacheSalt, budget))
}

func (e *Engine) handleCompletionsRender(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	id, prompts, budgets, err := e.prepareCompletion(w, r, &req)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	out := []any{}
	for i, p := range prompts {
		out = append(out, e.generateRequest(id, p, req.CacheSalt, budgets[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

func (e *Engine) handleResponsesRender(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	id, toks, budget, err := e.prepareResponses(w, r, &req)
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, e.generateRequest(id, toks, req.CacheSalt, budget))
}

type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               *string         `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	Input                json.RawMessage `json:"input"`
	Instructions         *string         `json:"instructions"`
	Tools                json.RawMessage `json:"tools"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
}

func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	err := decodeBody(w, r, &req)
	if err == nil && req.Model != "" {
		_, err = e.resolveModel(req.Model)
	}
	var toks []uint32
	if err == nil {
		switch {
		case len(req.Messages) > 0:
			toks, err = e.renderChat(&chatRequest{Messages: req.Messages, Tools: req.Tools,
				AddGenerationPrompt: req.AddGenerationPrompt, ContinueFinalMessage: req.ContinueFinalMessage})
		case req.Prompt != nil:
			toks = chat.Encode(*req.Prompt)
		case len(req.Input) > 0:
			toks, err = e.renderResponses(&responsesRequest{Input: req.Input, Instructions: req.Instructions, Tools: req.Tools})
		default:
			err = badRequest("tokenize needs prompt, messages or input")
		}
	}
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	var strs any
	if req.ReturnTokenStrs {
		strs, _ = chat.TokenStrs(toks)
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(toks), "max_model_len": e.cfg.MaxModelLen, "tokens": toks, "token_strs": strs})
}

func (e *Engine) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string   `json:"model"`
		Tokens []uint32 `json:"tokens"`
	}
	err := decodeBody(w, r, &req)
	if err == nil && req.Model != "" {
		_, err = e.resolveModel(req.Model)
	}
	var s string
	if err == nil {
		if s, err = chat.Decode(req.Tokens, false); err != nil {
			err = badRequest("%s", err.Error())
		}
	}
	if err != nil {
		e.failErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": s})
}

// ---- service endpoints ----

// handleModels answers vLLM's ModelList: a card per served name, then per
// LoRA adapter (parent: the first served name, max_model_len null), each
// with one default ModelPermission; created is the time of the call, as
// vLLM's default factories make it.
func (e *Engine) handleModels(w http.ResponseWriter, r *http.Request) {
	created := time.Now().Unix()
	card := func(id, root string, parent, maxLen any) map[string]any {
		perm := map[string]any{"id": e.newID("modelperm-"), "object": "model_permission", "created": created,
			"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
			"allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": nil, "is_blocking": false}
		return map[string]any{"id": id, "object": "model", "created": created, "owned_by": "vllm",
			"root": root, "parent": parent, "max_model_len": maxLen, "permission": []any{perm}}
	}
	var data []any
	for _, n := range e.cfg.servedNames() {
		data = append(data, card(n, e.cfg.Model, nil, e.cfg.MaxModelLen))
	}
	for _, m := range e.cfg.LoRAModules {
		data = append(data, card(m.Name, m.Path, e.cfg.servedNames()[0], nil))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// handleReset answers 200 even when the reset cannot happen, as vLLM does
// (it only logs a warning); reset_running_requests=true preempts running
// requests first so the reset always happens.
func (e *Engine) handleReset(w http.ResponseWriter, r *http.Request) {
	running := r.URL.Query().Get("reset_running_requests")
	err := e.ResetPrefixCache(running == "true" || running == "True" || running == "1")
	if errors.Is(err, ErrClosed) {
		e.fail(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	if err != nil {
		e.metrics.resetFailures.Inc()
		e.log.Warn("Failed to reset prefix cache", zap.Error(err))
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) handleRestart(w http.ResponseWriter, r *http.Request) {
	if err := e.Restart(); err != nil {
		e.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"start_time": float64(e.started.Load()) / 1e9})
}

func (e *Engine) handleFaults(w http.ResponseWriter, r *http.Request) {
	var req struct {
		DropEventsPct float64 `json:"drop_events_pct"`
		DelayEventsMS float64 `json:"delay_events_ms"`
	}
	if err := decodeBody(w, r, &req); err != nil {
		e.failErr(w, r, err)
		return
	}
	if req.DelayEventsMS > maxEventDelay.Seconds()*1000 {
		e.fail(w, r, http.StatusBadRequest, fmt.Sprintf("delay_events_ms %v: at most %v", req.DelayEventsMS, maxEventDelay))
		return
	}
	if err := e.SetEventFaults(req.DropEventsPct, time.Duration(req.DelayEventsMS*float64(time.Millisecond))); err != nil {
		e.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, req)
}
