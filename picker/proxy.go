package picker

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
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
// received, stream the answer back byte for byte. A request goes to
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
		opt := PickOptions{CacheOff: cacheOff(req.Header), Exclude: map[string]bool{}}
		var lastErr error
		for attempt := 0; attempt < maxAttempts; attempt++ {
			p, err := r.Pick(req.Context(), kind, body, opt)
			if err != nil {
				if lastErr != nil && isNoEndpoint(err) {
					err = lastErr // say why the tried endpoints failed
				}
				writeError(w, err)
				return
			}
			r.m.overhead.Observe(time.Since(arrived).Seconds())
			done, err := r.forward(w, req, p, path, body)
			r.Done(p)
			if done {
				return
			}
			r.m.fallbacks.WithLabelValues("endpoint_failed").Inc()
			r.reportFailure(p.Endpoint, "proxy: "+err.Error())
			r.log.Debug("endpoint failed before answering; trying another", zap.String("endpoint", p.Endpoint), zap.Error(err))
			opt.Exclude[p.Endpoint] = true
			// The client is not told the engines' addresses (they are in the
			// picker's debug log).
			lastErr = &intake.Error{Status: http.StatusBadGateway, Type: "bad_gateway", Code: "engine_unavailable",
				Message: "No engine chosen for this request could answer it; try again."}
		}
		writeError(w, lastErr)
	}
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

func isNoEndpoint(err error) bool {
	var ie *intake.Error
	return errors.As(err, &ie) && ie.Code == "no_healthy_endpoint"
}

// forward sends body to p's endpoint and copies the answer to w. done is
// false when nothing was written and another endpoint may be tried.
func (r *Router) forward(w http.ResponseWriter, in *http.Request, p *Pick, path string, body []byte) (done bool, err error) {
	out, err := http.NewRequestWithContext(in.Context(), in.Method, p.Endpoint+path, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	for k, vs := range in.Header {
		out.Header[k] = vs
	}
	dropHop(out.Header)
	out.Header.Del("X-Kvroute-Cache")
	resp, err := r.proxy.Do(out)
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
		return false, errors.New(resp.Status)
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
	h.Set("X-Kvroute-Endpoint", p.Endpoint)
	h.Set("X-Kvroute-Matched-Tokens", strconv.Itoa(p.MatchedTokens))
	if p.PrefixHash != "" {
		h.Set("X-Kvroute-Prefix-Hash", p.PrefixHash)
	}
	w.WriteHeader(resp.StatusCode)
	sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	sn := &sniffer{sse: sse, limit: 4 << 20}
	flusher, _ := w.(http.Flusher)
	bp, _ := r.bufs.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, 32<<10)
		bp = &b
	}
	defer r.bufs.Put(bp)
	buf := *bp
	for first := true; ; {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if first && sse {
				r.peerFirstToken(p) // prefill done, as the peers count it
			}
			first = false
			_, _ = sn.Write(buf[:n])
			if _, werr := w.Write(buf[:n]); werr != nil {
				return true, werr // the client left
			}
			if sse && flusher != nil {
				flusher.Flush()
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return true, rerr // mid-answer: nothing more can be done
		}
	}
	if resp.StatusCode == http.StatusOK && !p.relay {
		r.account(p, sn.result())
	}
	return true, nil
}

// account compares the engine's reported cached tokens with the
// prediction, at block granularity: only exact agreement is as_predicted.
func (r *Router) account(p *Pick, u openai.Usage) {
	if !u.Seen {
		r.m.outcomes.WithLabelValues("no_usage").Inc()
		return
	}
	predicted, cached := p.MatchedTokens, u.Cached
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
