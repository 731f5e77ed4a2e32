package picker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Response header modes (--response-headers): which x-kvroute-* headers a
// proxied answer carries.
const (
	// HeadersAll: the chosen engine's address (x-kvroute-endpoint), its
	// opaque id, the matched tokens and the prefix hash, and the KV
	// source's address when one was named (x-kvroute-kv-source).
	HeadersAll = "all"
	// HeadersDecision: the decision without pod addresses: the opaque
	// endpoint id, the matched tokens and the prefix hash.
	HeadersDecision = "decision"
	// HeadersNone: no x-kvroute-* header.
	HeadersNone = "none"
)

// maxRequestID bounds an x-request-id the picker accepts from a client;
// a longer one, or one with other than visible ASCII, is replaced.
const maxRequestID = 128

// reqRecord is what a request's handlers note for its metrics and its
// access-log line. Handlers fill it in through recordOf; the middleware
// reads it once the request ends.
type reqRecord struct {
	id       string
	model    string // a resolved model name ("" until one is)
	endpoint string // the last engine the request went to
	prompt   int    // prompt tokens (the picker's count)
	matched  int    // GPU tokens the chosen engine held, as predicted
	cached   int    // cached tokens the engine reported (-1: no report)
	attempts int    // engines tried
	kvSource string // the KV source named on the last attempt (host:port; "" none)
	// predictedMs is the TTFT precise predicted (0: none); observedTTFT
	// the time from dispatch to the first output token, when learned.
	predictedMs  float64
	observedTTFT time.Duration
}

type recordKey struct{}

// recordOf is the request's record; a throwaway one outside the
// middleware (a test calling a handler directly).
func recordOf(ctx context.Context) *reqRecord {
	if r, ok := ctx.Value(recordKey{}).(*reqRecord); ok {
		return r
	}
	return &reqRecord{cached: -1}
}

// recorder is the ResponseWriter the middleware hands on: it notes the
// status, the time of the first body byte and the bytes written. It
// flushes and unwraps to the server's writer (http.ResponseController).
type recorder struct {
	http.ResponseWriter
	status int
	first  time.Time
	bytes  int64
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.first.IsZero() && len(b) > 0 {
		w.first = time.Now()
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *recorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// adminPath: the operator's endpoints, served on the admin port only
// (AdminHandler).
func adminPath(p string) bool {
	return p == "/metrics" || p == "/healthz" || p == "/readyz" || strings.HasPrefix(p, "/debug/")
}

// requestID is the client's x-request-id when it is one the picker can
// carry (1 to 128 visible ASCII characters), else a new random one.
func requestID(got string) string {
	ok := got != "" && len(got) <= maxRequestID
	for i := 0; ok && i < len(got); i++ {
		ok = got[i] > 0x20 && got[i] < 0x7f
	}
	if ok {
		return got
	}
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// sampler decides which requests the access log records: the share rate
// of them, spread evenly (request n is logged when ⌊(n+1)·rate⌋ passes
// ⌊n·rate⌋). Safe for concurrent use.
type sampler struct {
	rate float64
	n    atomic.Uint64
}

func (s *sampler) take() bool {
	switch {
	case s.rate <= 0:
		return false
	case s.rate >= 1:
		return true
	}
	n := float64(s.n.Add(1) - 1)
	return int64((n+1)*s.rate) > int64(n*s.rate)
}

// instrument wraps the picker's API: every request but the admin ones
// gets a request id (accepted or made, forwarded upstream and returned),
// is counted by route, model and status with its duration and time to
// first byte, and gets one access-log line (sampled, --access-log) that
// never carries prompt text.
func (r *Router) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		start := time.Now()
		rec := &reqRecord{id: requestID(req.Header.Get("X-Request-Id")), cached: -1}
		req.Header.Set("X-Request-Id", rec.id)
		w.Header().Set("X-Request-Id", rec.id)
		rw := &recorder{ResponseWriter: w}
		req = req.WithContext(context.WithValue(req.Context(), recordKey{}, rec))
		finished := false
		defer func() {
			// A handler that aborts the answer (http.ErrAbortHandler) is
			// recorded as aborted, and the panic goes on to the server.
			if !finished {
				p := recover()
				r.finish(req, rw, rec, start, true)
				panic(p)
			}
			r.finish(req, rw, rec, start, false)
		}()
		next.ServeHTTP(rw, req)
		finished = true
	})
}

// routeOf is a request's route label: the pattern the mux matched, its
// method left out; "other" for a path no route serves.
func routeOf(req *http.Request) string {
	p := req.Pattern
	if i := strings.IndexByte(p, ' '); i >= 0 {
		p = p[i+1:]
	}
	if p == "" || p == "/" {
		return "other"
	}
	return p
}

// finish records an ended request: its metrics and its access-log line.
func (r *Router) finish(req *http.Request, w *recorder, rec *reqRecord, start time.Time, aborted bool) {
	route := routeOf(req)
	status := w.status
	if status == 0 {
		status = http.StatusOK // nothing written: net/http answers 200
	}
	var ttfb time.Duration
	if !w.first.IsZero() {
		ttfb = w.first.Sub(start)
	}
	dur := time.Since(start)
	r.record(route, strconv.Itoa(status), rec, dur, ttfb, func() []zap.Field {
		return []zap.Field{zap.String("request_id", rec.id), zap.String("method", req.Method), zap.String("route", route),
			zap.Int("status", status), zap.Duration("duration", dur), zap.Int64("bytes", w.bytes)}
	}, aborted)
}

// record counts an ended request — by route, model and code, with its
// duration and time to first byte (ttfb, 0 when none came) — and writes
// its access-log line (sampled): head's fields, then what rec holds. The
// proxy (finish) and the endpoint picker (eppExchange.record) both end
// here.
func (r *Router) record(route, code string, rec *reqRecord, dur, ttfb time.Duration, head func() []zap.Field, aborted bool) {
	model := rec.model
	if model == "" {
		model = "none"
	}
	r.m.requests.WithLabelValues(route, model, code).Inc()
	r.m.duration.WithLabelValues(route, model).Observe(dur.Seconds())
	if ttfb > 0 {
		r.m.ttfb.WithLabelValues(route, model).Observe(ttfb.Seconds())
	}
	if r.accessLog == nil || !r.access.take() {
		return
	}
	fields := head()
	if rec.model != "" {
		fields = append(fields, zap.String("model", rec.model))
	}
	if ttfb > 0 {
		fields = append(fields, zap.Duration("ttfb", ttfb))
	}
	if rec.endpoint != "" {
		fields = append(fields, zap.String("endpoint", rec.endpoint), zap.Int("attempts", rec.attempts),
			zap.Int("prompt_tokens", rec.prompt), zap.Int("matched_tokens", rec.matched))
		if rec.kvSource != "" {
			fields = append(fields, zap.String("kv_source", rec.kvSource))
		}
	}
	if rec.cached >= 0 {
		fields = append(fields, zap.Int("cached_tokens", rec.cached))
	}
	if rec.predictedMs > 0 {
		fields = append(fields, zap.Float64("predicted_ttft_ms", rec.predictedMs))
		if rec.observedTTFT > 0 {
			fields = append(fields, zap.Float64("ttft_ms", float64(rec.observedTTFT.Microseconds())/1000))
		}
	}
	if aborted {
		fields = append(fields, zap.Bool("aborted", true))
	}
	r.accessLog.Info("request", fields...)
}

// setDecisionHeaders puts the x-kvroute-* headers of p on an answer, as
// --response-headers says.
func setDecisionHeaders(h http.Header, mode string, p *Pick) {
	if mode == HeadersNone {
		return
	}
	if mode == HeadersAll {
		h.Set("X-Kvroute-Endpoint", p.Endpoint)
		if p.KVSource != "" { // a pod's address, as the endpoint's
			h.Set(KVSourceAnswerHeader, p.KVSource)
		}
	}
	h.Set("X-Kvroute-Endpoint-Id", p.EndpointID)
	h.Set("X-Kvroute-Matched-Tokens", strconv.Itoa(p.MatchedTokens))
	if p.PrefixHash != "" {
		h.Set("X-Kvroute-Prefix-Hash", p.PrefixHash)
	}
	if p.PredictedTTFTMs > 0 {
		h.Set("X-Kvroute-Predicted-Ttft-Ms", predictedMs(p))
	}
	if p.Priority != nil { // the engine priority it ran with (--engine-priority)
		h.Set("X-Kvroute-Engine-Priority", strconv.Itoa(*p.Priority))
	}
}

// predictedMs is p's predicted TTFT in milliseconds, to a tenth.
func predictedMs(p *Pick) string { return strconv.FormatFloat(p.PredictedTTFTMs, 'f', 1, 64) }

// validResponseHeaders checks a --response-headers mode.
func validResponseHeaders(mode string) error {
	switch mode {
	case HeadersAll, HeadersDecision, HeadersNone:
		return nil
	}
	return fmt.Errorf("--response-headers %q: want all, decision or none", mode)
}
