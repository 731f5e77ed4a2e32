package picker

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/picker/intake"
)

// maxAttempts bounds the endpoints one request is offered to.
const maxAttempts = 3

// hopHeaders are not forwarded (RFC 9110 §7.6.1), nor is the length (the
// transport sets it) or the encoding we ask for.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer",
	"Transfer-Encoding", "Upgrade", "Content-Length", "Accept-Encoding"}

// newProxyTransport pools connections to the engines.
func newProxyTransport() *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // a long prefill may take a while before the first byte
		DisableCompression:    true,
	}
}

// handleProxy serves an OpenAI endpoint: decide, forward the body as
// received (the tenant salt aside, the client's kv_transfer_params
// removed, the decision's KV source set), stream the answer back byte for
// byte. A request goes to
// another endpoint only when the chosen one could not be reached or
// answered 502/503/504 — before any byte went to the client.
func (r *Router) handleProxy(kind intake.Kind, path string) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		arrived := time.Now()
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
		body = r.dropClientKVParams(body, recordOf(req.Context()).id)
		fair, err := fairnessOf(req.Header, r.cfg.FairnessHeader)
		var slo time.Duration
		if err == nil {
			slo, err = sloOf(req.Header)
		}
		if err != nil {
			r.m.refused.WithLabelValues("bad_request").Inc()
			writeError(w, err)
			return
		}
		opt := PickOptions{CacheOff: cacheOff(req.Header), Fairness: fair, Carried: true, SLO: slo}
		var waited time.Duration
		r.relay(w, req, kind, path, body, func(tried map[string]bool) (*Pick, error) {
			opt.Exclude, opt.Admit = tried, len(tried) == 0 // admitted once
			p, err := r.Route(req.Context(), kind, body, opt)
			if err == nil && p.Priority != nil {
				opt.Priority = p.Priority // a retry keeps it
			}
			if err == nil {
				// The overhead is the picker's own work: not the wait for room.
				waited += p.waited
				r.m.overhead.Observe((time.Since(arrived) - waited).Seconds())
			}
			return p, err
		})
	}
}

// relay offers a request to the endpoints choose picks (none of those
// already tried), one after another while each could not be reached or
// answered 502/503/504 before any byte went to the client, at most
// maxAttempts: the proxy's one retry rule. choose's error is the answer
// (a refusal, or none left: then, once an endpoint was tried, the 502
// saying why); an answer cut short is aborted (abortAnswer).
func (r *Router) relay(w http.ResponseWriter, req *http.Request, kind intake.Kind, path string, body []byte, choose func(tried map[string]bool) (*Pick, error)) {
	rec := recordOf(req.Context())
	tried := map[string]bool{}
	var lastErr error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		p, err := choose(tried)
		if err != nil {
			if lastErr != nil && isNoEndpoint(err) {
				err = lastErr // say why the tried endpoints failed
			}
			writeError(w, err)
			return
		}
		rec.endpoint, rec.attempts, rec.prompt, rec.matched = p.Endpoint, attempt+1, p.PromptTokens, p.MatchedTokens
		rec.kvSource = p.KVSource
		inFlight := r.m.inFlight.WithLabelValues(p.Endpoint)
		inFlight.Inc()
		done, err := r.forward(w, req, p, kind, path, body)
		inFlight.Dec()
		rec.predictedMs, rec.observedTTFT = p.PredictedTTFTMs, p.ObservedTTFT
		r.Done(p)
		if done {
			var cut *cutAnswer
			if errors.As(err, &cut) {
				r.abortAnswer(w, p.Endpoint, path, cut)
			}
			return
		}
		r.m.retries.WithLabelValues(retryCause(err)).Inc()
		r.reportFailure(p.Endpoint, "proxy: "+err.Error())
		r.log.Debug("endpoint failed before answering; trying another", zap.String("endpoint", p.Endpoint), zap.String("path", path), zap.Error(err))
		tried[p.Endpoint] = true
		// The client is not told the engines' addresses (they are in the
		// picker's debug log).
		lastErr = &intake.Error{Status: http.StatusBadGateway, Type: "bad_gateway", Code: "engine_unavailable",
			Message: "No engine chosen for this request could answer it; try again."}
	}
	writeError(w, lastErr)
}

// sendPrioritized sends body to p's endpoint with p's priority
// (--engine-priority) set. An engine without --scheduling-policy priority
// refuses any priority but 0 (vLLM's 400): the request is resent without
// one, counted and logged, and p's priority cleared.
func (r *Router) sendPrioritized(in *http.Request, p *Pick, path string, body []byte) (*http.Response, error) {
	if p.Priority == nil || r.prio == nil {
		return r.send(in, p, path, body)
	}
	body = r.prioritizedBody(p, body)
	resp, err := r.send(in, p, path, body)
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		return resp, err
	}
	refused, read := priorityRefusal(resp)
	if !refused {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(read), resp.Body), resp.Body}
		return resp, nil
	}
	resp.Body.Close()
	r.prio.refusedBy(p.Endpoint)
	p.Priority = nil
	return r.send(in, p, path, withoutPriority(body))
}

// HintHeader, on an engine's answer the picker relays unchanged, says
// what the answer likely means for the operator (an embeddings request to
// a generative model's engines).
const HintHeader = "X-Kvroute-Hint"

// send sends body to p's endpoint with in's method and headers (less the
// hop-by-hop ones and those the router decides).
func (r *Router) send(in *http.Request, p *Pick, path string, body []byte) (*http.Response, error) {
	out, err := http.NewRequestWithContext(in.Context(), in.Method, p.Endpoint+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, vs := range in.Header {
		out.Header[k] = vs
	}
	dropHop(out.Header)
	out.Header.Del("X-Kvroute-Cache")
	out.Header.Del(KVSourceHeader) // a client never names a source (llm-d's sidecar would act on it)
	return r.proxy.Do(out)
}

// dropHop removes hop-by-hop headers, those the Connection header names
// included.
func dropHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, x := range hopHeaders {
		h.Del(x)
	}
}

// badStatus is an engine's 502, 503 or 504 before any byte of its answer
// reached the client.
type badStatus struct{ status string }

func (e *badStatus) Error() string { return e.status }

// retryCause labels why a request was offered to another engine.
func retryCause(err error) string {
	var bs *badStatus
	if errors.As(err, &bs) {
		return "bad_status"
	}
	return "connect_error"
}

func isNoEndpoint(err error) bool {
	var ie *intake.Error
	return errors.As(err, &ie) && ie.Code == "no_healthy_endpoint"
}

// Why an answer was cut short after its first byte went to the client:
// the causes of kvroute_picker_stream_aborts_total.
const (
	causeUpstreamError     = "upstream_error"     // reading the engine's answer failed
	causeUpstreamTruncated = "upstream_truncated" // it ended before its final event
	causeClientGone        = "client_gone"        // the client left
)

// cutAnswer is an answer that cannot be finished: some of it went to the
// client, the rest will not come.
type cutAnswer struct {
	cause string
	err   error
}

func (c *cutAnswer) Error() string { return c.cause + ": " + c.err.Error() }
func (c *cutAnswer) Unwrap() error { return c.err }

// forward sends body to p's endpoint and copies the answer to w. done is
// false when nothing was written and another endpoint may be tried; a
// *cutAnswer error says the answer written is not whole.
func (r *Router) forward(w http.ResponseWriter, in *http.Request, p *Pick, kind intake.Kind, path string, body []byte) (done bool, err error) {
	resp, err := r.sendPrioritized(in, p, path, r.sourcedBody(p, body))
	if err != nil {
		if in.Context().Err() != nil {
			return true, err // the client left
		}
		return false, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return false, &badStatus{resp.Status}
	}
	h := w.Header()
	length := resp.Header.Get("Content-Length")
	for k, vs := range resp.Header {
		h[k] = vs
	}
	dropHop(h)
	if length != "" {
		h.Set("Content-Length", length)
	}
	setDecisionHeaders(h, r.cfg.ResponseHeaders, p)
	if resp.StatusCode == http.StatusNotFound && slices.Contains(poolingPaths(), path) {
		// vLLM registers its pooling routes only on a pooling model: a
		// generative one answers FastAPI's bare 404, kept as it is.
		h.Set(HintHeader, "the engine serving this model does not serve "+path+": vLLM serves the pooling endpoints (embeddings, pooling, classify, score, rerank) only for a pooling model, an engine started with --runner pooling")
	}
	w.WriteHeader(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	sn := &sniffer{sse: sse, kind: kind, limit: 4 << 20}
	watch := newOutputWatch(kind, sse)
	rc := http.NewResponseController(w) // reaches the Flusher through wrappers
	bp, _ := r.bufs.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, 32<<10)
		bp = &b
	}
	defer r.bufs.Put(bp)
	buf := *bp
	// The client's leaving cancels in's context, so the request to the
	// engine too: the transport closes that connection and the engine
	// aborts the request, as vLLM does when its client disconnects.
	gone := func(err error) (bool, error) { return true, &cutAnswer{cause: causeClientGone, err: err} }
	for first := true; ; {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if first {
				r.firstChunk(p) // kvroute's prefill in flight ends; llm-d's tokens too
			}
			if watch.see(buf[:n]) {
				r.firstToken(p, sse) // the first output token: Dynamo's prefill ends; the TTFT model learns
			}
			first = false
			_, _ = sn.Write(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				return gone(werr)
			}
			if sse {
				if ferr := rc.Flush(); ferr != nil && !errors.Is(ferr, http.ErrNotSupported) {
					return gone(ferr)
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			switch {
			case sse && sn.complete():
				// The final event went out (written and flushed): the
				// client has the whole answer, whether it then left (as
				// an SDK does once it reads the end) or the engine's
				// connection broke after it.
			case in.Context().Err() != nil:
				return gone(rerr)
			default:
				return true, &cutAnswer{cause: causeUpstreamError, err: rerr}
			}
			break
		}
	}
	if !sn.complete() {
		return true, &cutAnswer{cause: causeUpstreamTruncated, err: errors.New("the answer ended before its final event")}
	}
	if resp.StatusCode == http.StatusOK && !p.relay {
		u := sn.result()
		if u.Seen {
			recordOf(in.Context()).cached = u.Cached // 0 without details: nothing cached, or not said
		}
		r.account(p, u)
	}
	return true, nil
}

// abortAnswer ends an answer cut short (forward's *cutAnswer): it is
// counted by endpoint and cause and logged at debug (one line a request:
// the counter is the signal), an engine's failure is reported to passive
// ejection, and the client's response is aborted — what was written is
// flushed, then net/http closes the HTTP/1.1 connection without the last
// chunk (or short of the Content-Length), or resets the HTTP/2 stream — so
// that no client takes it for a whole answer. The panic is
// http.ErrAbortHandler, which the server recovers without logging; no
// handler wrapping the proxy may recover it.
func (r *Router) abortAnswer(w http.ResponseWriter, endpoint, path string, cut *cutAnswer) {
	r.m.streamAborts.WithLabelValues(endpoint, cut.cause).Inc()
	r.log.Debug("answer aborted", zap.String("endpoint", endpoint), zap.String("path", path),
		zap.String("cause", cut.cause), zap.Error(cut.err))
	if cut.cause == causeUpstreamError {
		r.reportFailure(endpoint, "proxy: answer cut: "+cut.err.Error())
	}
	if cut.cause != causeClientGone {
		_ = http.NewResponseController(w).Flush()
	}
	panic(http.ErrAbortHandler)
}

// account compares the engine's reported cached tokens with the
// prediction — what the chosen endpoint holds on GPU, loads back from its
// CPU tier and pulls from the source named (vLLM counts all three in
// num_cached_tokens) — at block granularity: only exact agreement is
// as_predicted.
func (r *Router) account(p *Pick, u openai.Usage) {
	if !u.Seen {
		r.m.outcomes.WithLabelValues("no_usage").Inc()
		return
	}
	predicted, cached := max(p.expectCached, p.MatchedTokens), u.Cached
	if bs := p.blockSize; bs > 0 {
		if u.Prompt > 0 {
			// vLLM recomputes at least the last prompt token: a fully cached
			// prompt reports the whole blocks before it.
			predicted = min(predicted, (u.Prompt-1)/bs*bs)
		}
		cached = cached / bs * bs
	}
	r.m.promptTokens.Add(float64(u.Prompt))
	r.m.predicted.Add(float64(predicted))
	r.m.reported.Add(float64(u.Cached))
	switch {
	case p.loadOnly:
		// The endpoint's cache was unknown: nothing was predicted, so
		// nothing can be judged.
		r.m.outcomes.WithLabelValues("load_only").Inc()
	case !u.Details && predicted > 0:
		// No details: the engine cached nothing, or does not say (no
		// --enable-prompt-tokens-details); not counted as a wrong pod.
		r.m.outcomes.WithLabelValues("no_cached_details").Inc()
	case cached < predicted:
		r.m.outcomes.WithLabelValues("fewer_cached_than_predicted").Inc()
	case cached > predicted && u.Details:
		// The engine held blocks the picker did not know of: the
		// signature of a stale or one-sided summary.
		r.m.outcomes.WithLabelValues("more_cached_than_predicted").Inc()
	case p.anotherHeldMore:
		r.m.outcomes.WithLabelValues("another_endpoint_held_more").Inc()
	default:
		r.m.outcomes.WithLabelValues("as_predicted").Inc()
	}
}
