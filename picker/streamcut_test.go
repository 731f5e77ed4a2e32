package picker

import (
	"bytes"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/pickapi"
	"github.com/kvroute/kvroute/picker/render"
)

// syncBuffer is a server's error log.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestProxyAbortsCutAnswers: an engine answer that breaks after its first
// byte reached the client — a read error, a stream without its final event,
// a JSON body short of its Content-Length — reaches the client as an error
// (HTTP/1.1: the connection closes without the last chunk; HTTP/2: the
// stream is reset), with what came before it flushed, counted by endpoint
// and cause, and with nothing in the server's error log; whole answers end
// cleanly, a stream whose final event came included even if the engine's
// connection then drops.
func TestProxyAbortsCutAnswers(t *testing.T) {
	const (
		chatPart = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
		respPart = "event: response.created\ndata: {\"type\":\"response.created\"}\n\nevent: response.output_text.done\ndata: {\"type\":\"response.output_text.done\"}\n\n"
		respDone = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3}}}\n\n"
		jsonBody = `{"object":"chat.completion","choices":[],"usage":{"prompt_tokens":3}}`
	)
	// Upstream behaviours: what the engine writes, and how it ends.
	sse := func(body string, cut bool) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, body)
			w.(http.Flusher).Flush()
			if cut {
				panic(http.ErrAbortHandler) // the connection drops mid-answer
			}
		}
	}
	short := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "100")
		_, _ = io.WriteString(w, jsonBody[:40])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	whole := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, jsonBody)
	}
	for _, tc := range []struct {
		name  string
		path  string
		up    http.HandlerFunc
		sent  string // what the client gets before the end
		cause string // "" a clean end
	}{
		{"chat stream without [DONE]", "/v1/chat/completions", sse(chatPart, false), chatPart, causeUpstreamTruncated},
		{"chat stream cut", "/v1/chat/completions", sse(chatPart, true), chatPart, causeUpstreamError},
		{"completions stream cut", "/v1/completions", sse(chatPart, true), chatPart, causeUpstreamError},
		{"responses stream without a final event", "/v1/responses", sse(respPart, false), respPart, causeUpstreamTruncated},
		{"JSON short of its Content-Length", "/v1/chat/completions", short, jsonBody[:40], causeUpstreamError},
		{"whole chat stream", "/v1/chat/completions", sse(chatPart+"data: [DONE]\n\n", false), chatPart + "data: [DONE]\n\n", ""},
		{"whole responses stream, then the connection drops", "/v1/responses", sse(respPart+respDone, true), respPart + respDone, ""},
		{"whole JSON", "/v1/chat/completions", whole, jsonBody, ""},
	} {
		for _, h2 := range []bool{false, true} {
			name := tc.name + " over HTTP/1.1"
			if h2 {
				name = tc.name + " over HTTP/2"
			}
			t.Run(name, func(t *testing.T) {
				up := httptest.NewServer(tc.up)
				defer up.Close()
				reg := prometheus.NewRegistry()
				r := &Router{cfg: DefaultConfig(), log: zap.NewNop(), proxy: &http.Client{Transport: newProxyTransport()},
					render: render.New(time.Second, 1<<20)}
				r.m = newMetrics(reg, r)
				defer r.Close()
				kind := intake.Chat
				if tc.path == "/v1/responses" {
					kind = intake.Responses
				}
				// handleProxy's ending of an answer, without the decision.
				front := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
					p := &Pick{Answer: pickapi.Answer{Endpoint: up.URL}}
					done, err := r.forward(w, req, p, kind, tc.path, []byte(`{}`))
					var cut *cutAnswer
					if done && errors.As(err, &cut) {
						r.abortAnswer(w, p.Endpoint, tc.path, cut)
					}
				}))
				errLog := &syncBuffer{}
				front.Config.ErrorLog = log.New(errLog, "", 0)
				if h2 {
					front.EnableHTTP2 = true
					front.StartTLS()
				} else {
					front.Start()
				}
				defer front.Close()
				resp, err := front.Client().Post(front.URL+tc.path, "application/json", strings.NewReader(`{}`))
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := map[bool]int{false: 1, true: 2}[h2]; resp.ProtoMajor != want {
					t.Fatalf("HTTP/%d", resp.ProtoMajor)
				}
				if string(got) != tc.sent {
					t.Fatalf("the client got %q, want %q", got, tc.sent)
				}
				if tc.cause == "" {
					if err != nil {
						t.Fatalf("a whole answer ended with %v", err)
					}
				} else if err == nil {
					t.Fatal("a cut answer ended cleanly")
				} else {
					t.Logf("the client reads: %v", err)
				}
				for _, c := range []string{causeUpstreamError, causeUpstreamTruncated, causeClientGone} {
					want := 0.0
					if c == tc.cause {
						want = 1
					}
					if n := testCounter(t, reg, "kvroute_picker_stream_aborts_total", "cause", c); n != want {
						t.Errorf("%s counted %v times, want %v", c, n, want)
					}
				}
				if s := errLog.String(); s != "" {
					t.Fatalf("the server logged:\n%s", s)
				}
			})
		}
	}
}
