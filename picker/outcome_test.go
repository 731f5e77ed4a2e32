package picker

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/picker/intake"
	"github.com/kvroute/kvroute/picker/pickapi"
	"github.com/kvroute/kvroute/test/metrictest"
)

func TestSnifferFindsUsage(t *testing.T) {
	chat := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\n" +
		"data: [DONE]\n\n"
	responses := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n" +
		"event: response.completed\r\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":50,\"input_tokens_details\":{\"cached_tokens\":48}}}}\r\n\r\n"
	for _, tc := range []struct {
		name    string
		sse     bool
		body    string
		prompt  int
		cached  int
		seen    bool
		chunked int
	}{
		{"chat stream", true, chat, 100, 96, true, 7},
		{"responses stream", true, responses, 50, 48, true, 5},
		{"json", false, `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`, 10, 0, true, 3},
		{"json without details", false, `{"usage":{"prompt_tokens":10}}`, 10, 0, true, 100},
		{"responses json", false, `{"object":"response","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4}}}`, 9, 4, true, 2},
		{"no usage", true, "data: {\"choices\":[]}\n\n", 0, 0, false, 1},
		{"last line without newline", true, "data: {\"usage\":{\"prompt_tokens\":3}}", 3, 0, true, 4},
	} {
		s := &sniffer{sse: tc.sse, limit: 1 << 20}
		b := []byte(tc.body)
		for len(b) > 0 { // odd chunk sizes: lines split across writes
			n := min(tc.chunked, len(b))
			_, _ = s.Write(b[:n])
			b = b[n:]
		}
		u := s.result()
		if u.Seen != tc.seen || u.Prompt != tc.prompt || u.Cached != tc.cached {
			t.Errorf("%s: %+v", tc.name, u)
		}
	}
	big := &sniffer{sse: false, limit: 8}
	_, _ = big.Write([]byte(`{"usage":{"prompt_tokens":10}}`))
	if big.result().Seen {
		t.Error("a body over the bound was parsed")
	}
}

// TestForwardIsByteExact: an upstream's SSE, written in odd pieces with
// flushes, reaches the client byte for byte, with the picker's headers,
// and its usage is accounted.
func TestForwardIsByteExact(t *testing.T) {
	stream := []byte("data: {\"a\":1}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n")
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < len(stream); i += 11 {
			_, _ = w.Write(stream[i:min(i+11, len(stream))])
			w.(http.Flusher).Flush()
			time.Sleep(time.Millisecond)
		}
	}))
	defer up.Close()
	reg := prometheus.NewRegistry()
	r := &Router{cfg: DefaultConfig(), proxy: &http.Client{Transport: newProxyTransport()}}
	r.m = newMetrics(reg, r)
	p := &Pick{Answer: pickapi.Answer{Endpoint: up.URL, MatchedTokens: 32, PrefixHash: "00112233aabbccdd"}, blockSize: 16}
	rec := httptest.NewRecorder()
	in := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(nil))
	done, err := r.forward(rec, in, p, intake.Chat, "/v1/chat/completions", []byte(`{}`))
	if !done || err != nil {
		t.Fatal(done, err)
	}
	got, _ := io.ReadAll(rec.Result().Body)
	if !bytes.Equal(got, stream) {
		t.Fatalf("got %q", got)
	}
	h := rec.Result().Header
	if h.Get("X-Kvroute-Endpoint") != up.URL || h.Get("X-Kvroute-Matched-Tokens") != "32" || h.Get("X-Kvroute-Prefix-Hash") != "00112233aabbccdd" {
		t.Fatalf("headers %v", h)
	}
	// Predicted 32 (capped at 32 = (40-1)/16*16), reported 16: wrong pod.
	if n := testCounter(t, reg, "kvroute_picker_outcomes_total", "outcome", "fewer_cached_than_predicted"); n != 1 {
		t.Fatalf("outcome counted %v times", n)
	}
}

// testCounter is the value of name{label=value} in reg.
func testCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	return metrictest.Gathered(t, reg, name, map[string]string{label: value})
}

// TestAccountWithoutDetails: an engine that gives no cached-token details
// is not a wrong pod.
func TestAccountWithoutDetails(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := &Router{cfg: DefaultConfig()}
	r.m = newMetrics(reg, r)
	r.account(&Pick{Answer: pickapi.Answer{MatchedTokens: 64}, blockSize: 16}, openai.UsageOf([]byte(`{"usage":{"prompt_tokens":100}}`)))
	r.account(&Pick{Answer: pickapi.Answer{MatchedTokens: 0}, blockSize: 16}, openai.UsageOf([]byte(`{"usage":{"prompt_tokens":100}}`)))
	if n := testCounter(t, reg, "kvroute_picker_outcomes_total", "outcome", "no_cached_details"); n != 1 {
		t.Fatalf("no_cached_details %v", n)
	}
	if n := testCounter(t, reg, "kvroute_picker_outcomes_total", "outcome", "fewer_cached_than_predicted"); n != 0 {
		t.Fatalf("counted as a wrong pod %v times", n)
	}
}

func TestDropHop(t *testing.T) {
	h := http.Header{"Connection": {"keep-alive, X-Secret"}, "X-Secret": {"s"}, "Keep-Alive": {"1"}, "Te": {"trailers"},
		"Authorization": {"Bearer k"}, "Content-Type": {"application/json"}}
	dropHop(h)
	for _, gone := range []string{"Connection", "X-Secret", "Keep-Alive", "Te"} {
		if h.Get(gone) != "" {
			t.Errorf("%s forwarded", gone)
		}
	}
	if h.Get("Authorization") == "" || h.Get("Content-Type") == "" {
		t.Fatalf("end-to-end headers dropped: %v", h)
	}
}

// TestAnswerCompleteness: the rule a copied answer is judged whole by, per
// API: an SSE answer when its final event was dispatched (data: [DONE]
// for chat and completions; response.completed or a terminal
// response.failed, response.incomplete or error event for Responses); a
// JSON answer read to its end always (its framing is the evidence).
func TestAnswerCompleteness(t *testing.T) {
	const (
		chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
		usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4}}\n\n"
		done  = "data: [DONE]\n\n"
		// A content delta mentioning the final event's name stays a delta.
		tricky = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"event: response.completed\\n\"}\n\n"
	)
	ev := func(typ string) string {
		return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\",\"sequence_number\":1,\"response\":{\"usage\":null}}\n\n"
	}
	dataOnly := func(typ string) string { return "data: {\"response\":{},\"type\":\"" + typ + "\"}\n\n" }
	started := ev("response.created") + ev("response.in_progress") + tricky + ev("response.output_text.done")
	for _, tc := range []struct {
		name string
		kind intake.Kind
		sse  bool
		body string
		want bool
	}{
		{"chat stream", intake.Chat, true, chunk + usage + done, true},
		{"chat stream, CRLF", intake.Chat, true, strings.ReplaceAll(chunk+done, "\n", "\r\n"), true},
		{"chat stream without [DONE]", intake.Chat, true, chunk + usage, false},
		{"chat stream cut in [DONE]", intake.Chat, true, chunk + "data: [DO", false},
		{"chat stream, [DONE] not dispatched", intake.Chat, true, chunk + "data: [DONE]\n", false},
		{"chat stream, in-band error then [DONE]", intake.Chat, true, chunk + "data: {\"error\":{\"message\":\"x\",\"code\":500}}\n\n" + done, true},
		{"chat stream, empty", intake.Chat, true, "", false},
		{"completions stream", intake.Completion, true, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n" + done, true},
		{"completions stream without [DONE]", intake.Completion, true, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", false},
		{"completions: a Responses final event is not one", intake.Completion, true, ev("response.completed"), false},
		{"responses stream", intake.Responses, true, started + ev("response.completed"), true},
		{"responses stream failed", intake.Responses, true, started + ev("response.failed"), true},
		{"responses stream incomplete", intake.Responses, true, started + ev("response.incomplete"), true},
		{"responses stream, vLLM's generation error", intake.Responses, true, started + "event: error\ndata: {\"error\":{\"message\":\"Internal server error\"}}\n\n", true},
		{"responses stream without a final event", intake.Responses, true, started, false},
		{"responses stream cut in response.completed", intake.Responses, true, started + ev("response.completed")[:40], false},
		{"responses stream, data lines only", intake.Responses, true, dataOnly("response.created") + dataOnly("response.completed"), true},
		{"responses stream, data lines only, no final", intake.Responses, true, dataOnly("response.created") + dataOnly("response.output_text.delta"), false},
		{"responses stream ended by [DONE]", intake.Responses, true, started + done, true},
		{"chat JSON", intake.Chat, false, `{"object":"chat.completion","choices":[]}`, true},
		{"completions JSON", intake.Completion, false, `{"object":"text_completion","choices":[]}`, true},
		{"responses JSON", intake.Responses, false, `{"object":"response","status":"completed"}`, true},
		{"responses JSON, incomplete status", intake.Responses, false, `{"object":"response","status":"incomplete"}`, true},
		{"error JSON", intake.Chat, false, `{"error":{"message":"bad"}}`, true},
	} {
		for _, size := range []int{1, 3, 7, 64, 1 << 20} { // lines split across writes
			s := &sniffer{sse: tc.sse, kind: tc.kind, limit: 1 << 20}
			for b := []byte(tc.body); len(b) > 0; {
				n := min(size, len(b))
				_, _ = s.Write(b[:n])
				b = b[n:]
			}
			if got := s.complete(); got != tc.want {
				t.Errorf("%s, writes of %d: complete %v, want %v", tc.name, size, got, tc.want)
			}
		}
	}
	// A final event whose data line is past the sniffer's bound still
	// ends the stream (its name said so); a long line is not a blank one.
	s := &sniffer{sse: true, kind: intake.Responses, limit: 64}
	_, _ = s.Write([]byte("event: response.output_text.delta\ndata: " + strings.Repeat("x", 200) + "\n"))
	if s.complete() {
		t.Error("a long line dispatched a final event")
	}
	_, _ = s.Write([]byte("\nevent: response.completed\ndata: " + strings.Repeat("x", 200) + "\n\n"))
	if !s.complete() {
		t.Error("a long response.completed did not end the stream")
	}
}

// TestAccountCountsTiers: an engine reports vLLM's num_cached_tokens, its
// GPU hit with what it loaded back from its CPU tier and what it pulled;
// a pick that expected those is as predicted, not "more cached" (which
// would read as a stale summary).
func TestAccountCountsTiers(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := &Router{cfg: DefaultConfig()}
	r.m = newMetrics(reg, r)
	usage := openai.UsageOf([]byte(`{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":80}}}`))
	r.account(&Pick{Answer: pickapi.Answer{MatchedTokens: 32}, expectCached: 80, blockSize: 16}, usage)
	if n := testCounter(t, reg, "kvroute_picker_outcomes_total", "outcome", "as_predicted"); n != 1 {
		t.Fatalf("as_predicted %v", n)
	}
	r.account(&Pick{Answer: pickapi.Answer{MatchedTokens: 32}, blockSize: 16}, usage)
	if n := testCounter(t, reg, "kvroute_picker_outcomes_total", "outcome", "more_cached_than_predicted"); n != 1 {
		t.Fatalf("a GPU-only expectation: more_cached %v", n)
	}
}
