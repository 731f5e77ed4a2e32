package picker_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/metrictest"
	"github.com/kvroute/kvroute/test/simsidecar"
	"github.com/kvroute/kvroute/test/testnet"
)

// series is the sum of the series of name whose labels include want
// (counters, gauges and histograms' counts), and whether one
// was found.
func series(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return metrictest.Sum(fams, name, want), metrictest.Series(fams, name, want) > 0
}

// errorBody is vLLM's error body, field for field.
type errorBody struct {
	Error *struct {
		Message *string         `json:"message"`
		Type    *string         `json:"type"`
		Param   json.RawMessage `json:"param"`
		Code    json.RawMessage `json:"code"`
	} `json:"error"`
}

// checkErrorBody fails unless raw is an OpenAI error body with all four
// fields present and a message.
func checkErrorBody(t *testing.T, what string, raw []byte) {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(raw, &e); err != nil || e.Error == nil || e.Error.Message == nil || *e.Error.Message == "" ||
		e.Error.Type == nil || e.Error.Param == nil || e.Error.Code == nil {
		t.Fatalf("%s: not an OpenAI error body: %s", what, raw)
	}
}

// TestFrontDoorErrors: every refusal is an OpenAI error body, and the
// SDK sees each class as its status: 404 for an unknown path or model,
// 405 with Allow for a wrong method, 400 for what must be rehydrated, 413
// for a body over the limit.
func TestFrontDoorErrors(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.MaxBodyBytes = 64 << 10
	f := startFleet(t, 1, cfg, "")
	for _, tc := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/v1/nothing-here", 404, ""},
		{"POST", "/v2/chat/completions", 404, ""},
		{"GET", "/v1/chat/completions", 405, "POST"},
		{"DELETE", "/v1/responses", 405, "POST"},
		{"PUT", "/routing/v1/pick", 405, "POST"},
		{"GET", "/healthz", 404, ""}, // the admin surface is on its own port
		{"GET", "/metrics", 404, ""},
		{"GET", "/debug/endpoints", 404, ""},
	} {
		req, _ := http.NewRequest(tc.method, f.api.URL+tc.path, strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || resp.Header.Get("Allow") != tc.allow || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("%s %s: %d, Allow %q, %s: %s", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), resp.Header.Get("Content-Type"), raw)
		}
		checkErrorBody(t, tc.method+" "+tc.path, raw)
	}

	c := sdk(f.api.URL, nil)
	ctx := withTimeout(t)
	apiErr := func(err error) *openai.Error {
		t.Helper()
		var e *openai.Error
		if !errors.As(err, &e) {
			t.Fatalf("not an API error: %v", err)
		}
		return e
	}
	_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "no-such-model",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if e := apiErr(err); e.StatusCode != 404 || e.Code != "model_not_found" || e.Message == "" {
		t.Fatalf("unknown model: %d %q %q", e.StatusCode, e.Code, e.Message)
	}
	_, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: "Qwen/Qwen3-0.6B", PreviousResponseID: openai.String("resp_1"),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("more")}})
	if e := apiErr(err); e.StatusCode != 400 || e.Code != "unresolved_previous_response" {
		t.Fatalf("previous_response_id: %d %q", e.StatusCode, e.Code)
	}
	_, err = c.Completions.New(ctx, openai.CompletionNewParams{Model: "Qwen/Qwen3-0.6B",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("x", 70<<10))}})
	if e := apiErr(err); e.StatusCode != 413 || e.Code != "request_too_large" {
		t.Fatalf("too large: %d %q", e.StatusCode, e.Code)
	}
	if n, _ := series(t, f.reg, "kvroute_picker_requests_total", map[string]string{"route": "other", "code": "404"}); n != 5 {
		t.Fatalf("404s on unknown paths (admin paths asked of the public port too) counted %v times, want 5", n)
	}
}

// TestOversizedBodyIsAnswered: a client that writes its whole body
// before reading gets the 413, not a broken pipe: the picker drains what
// it refused before closing.
func TestOversizedBodyIsAnswered(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.MaxBodyBytes = 1 << 20
	f := startFleet(t, 1, cfg, "")
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(f.api.URL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	size := 24 << 20 // far beyond what loopback socket buffers hold
	head := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	chunk := []byte(strings.Repeat("x", 64<<10))
	for sent := 0; sent < size; sent += len(chunk) {
		if _, err := conn.Write(chunk[:min(len(chunk), size-sent)]); err != nil {
			t.Fatalf("writing the body after %d bytes: %v", sent, err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	checkErrorBody(t, "413", raw)
}

// TestBatchedCompletions: a completions batch goes to one engine, routed
// by its first prompt's keys, and is answered as vLLM answers it: one
// choice per prompt. A batch led by a warm prompt follows it.
func TestBatchedCompletions(t *testing.T) {
	f := startFleetWith(t, 3, picker.DefaultConfig(), "", func(c *enginesim.Config) { c.EnablePromptTokensDetails = true })
	warm := strings.Repeat("A long shared instruction block for the batch. ", 40)
	single := fmt.Sprintf(`{"model":"Qwen/Qwen3-0.6B","prompt":%q,"max_tokens":2}`, warm)
	resp, err := http.Post(f.api.URL+"/v1/completions", "application/json", strings.NewReader(single))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	home := resp.Header.Get("X-Kvroute-Endpoint")
	testnet.Await(t, 10*time.Second, 20*time.Millisecond, func() error {
		if _, a, _ := f.pick(t, single, nil, ""); a.Reason != "cache_hit" || a.Endpoint != home {
			return fmt.Errorf("the warm prompt does not match on %s: %+v", home, a)
		}
		return nil
	})
	c := sdk(f.api.URL, nil)
	var httpResp *http.Response
	batch, err := c.Completions.New(withTimeout(t), openai.CompletionNewParams{Model: "Qwen/Qwen3-0.6B", MaxTokens: openai.Int(2),
		Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{warm + "first", "an unrelated second prompt", "a third"}}},
		option.WithResponseInto(&httpResp))
	if err != nil {
		t.Fatal(err)
	}
	if len(batch.Choices) != 3 {
		t.Fatalf("%d choices for 3 prompts", len(batch.Choices))
	}
	if got := httpResp.Header.Get("X-Kvroute-Endpoint"); got != home {
		t.Fatalf("the batch went to %s, its first prompt is warm on %s", got, home)
	}
	// Token-id batches are routed by the first list.
	code, a, raw := f.pick(t, `{"model":"Qwen/Qwen3-0.6B","prompt":[[1,2,3],[4,5]]}`, nil, "")
	if code != 200 || a.PromptTokens != 3 {
		t.Fatalf("token batch: %d %s", code, raw)
	}
}

// TestAccessLogAndRequestMetrics: one access-log line per request, with
// its route, model, endpoint, status, tokens and request id and never its
// prompt; the request id is accepted or made and returned; requests,
// duration, time to first byte and the in-flight gauge move; sampling at
// 0 logs nothing.
func TestAccessLogAndRequestMetrics(t *testing.T) {
	f := startFleetWith(t, 2, picker.DefaultConfig(), "", func(c *enginesim.Config) { c.EnablePromptTokensDetails = true })
	core, logs := observer.New(zap.InfoLevel)
	reg := prometheus.NewRegistry()
	r, err := picker.NewRouter(picker.DefaultConfig(), f.view, zap.New(core), reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	api := httptest.NewServer(r.Handler(picker.HandlerOptions{}))
	t.Cleanup(api.Close)
	secret := "SECRET-PROMPT-TEXT-7731"
	body := `{"model":"Qwen/Qwen3-0.6B","stream":true,"stream_options":{"include_usage":true},"max_tokens":4,"messages":[{"role":"user","content":"` + secret + `"}]}`
	req, _ := http.NewRequest(http.MethodPost, api.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Request-Id", "client-id-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != "client-id-42" {
		t.Fatalf("%d, request id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
	resp, err = http.Post(api.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"Qwen/Qwen3-0.6B","prompt":"`+secret+`","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	made := resp.Header.Get("X-Request-Id")
	if len(made) != 32 {
		t.Fatalf("no request id made: %q", made)
	}
	entries := logs.FilterMessage("request").All()
	if len(entries) != 2 {
		t.Fatalf("%d access-log lines for 2 requests", len(entries))
	}
	first := entries[0].ContextMap()
	for k, want := range map[string]any{"request_id": "client-id-42", "route": "/v1/chat/completions", "model": "Qwen/Qwen3-0.6B", "status": int64(200)} {
		if first[k] != want {
			t.Fatalf("access log %s = %v, want %v: %v", k, first[k], want, first)
		}
	}
	for _, k := range []string{"endpoint", "duration", "ttfb", "prompt_tokens", "matched_tokens", "cached_tokens"} {
		if _, ok := first[k]; !ok {
			t.Fatalf("access log lacks %s: %v", k, first)
		}
	}
	if entries[1].ContextMap()["request_id"] != made {
		t.Fatalf("the second line's id is not the one returned: %v", entries[1].ContextMap())
	}
	for _, e := range logs.All() {
		if strings.Contains(fmt.Sprint(e.Message, e.ContextMap()), secret) {
			t.Fatalf("a log line carries the prompt: %v", e.ContextMap())
		}
	}
	labels := map[string]string{"route": "/v1/chat/completions", "model": "Qwen/Qwen3-0.6B"}
	for _, name := range []string{"kvroute_picker_request_duration_seconds", "kvroute_picker_time_to_first_byte_seconds"} {
		if n, _ := series(t, reg, name, labels); n != 1 {
			t.Fatalf("%s observed %v times", name, n)
		}
	}
	if n, _ := series(t, reg, "kvroute_picker_requests_total", map[string]string{"route": "/v1/chat/completions", "model": "Qwen/Qwen3-0.6B", "code": "200"}); n != 1 {
		t.Fatalf("requests_total %v", n)
	}
	if n, ok := series(t, reg, "kvroute_picker_endpoint_requests_in_flight", nil); !ok || n != 0 {
		t.Fatalf("in flight at %s after the answers: %v (%v)", first["endpoint"], n, ok)
	}

	// Sampling at 0: no line.
	cfg := picker.DefaultConfig()
	cfg.AccessLog = 0
	core0, logs0 := observer.New(zap.InfoLevel)
	r0, err := picker.NewRouter(cfg, f.view, zap.New(core0), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r0.Close)
	api0 := httptest.NewServer(r0.Handler(picker.HandlerOptions{}))
	t.Cleanup(api0.Close)
	resp, err = http.Post(api0.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"Qwen/Qwen3-0.6B","prompt":"x","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := logs0.FilterMessage("request").Len(); n != 0 {
		t.Fatalf("--access-log 0 logged %d lines", n)
	}
}

// TestResponseHeaderModes: --response-headers all shows the engine's
// address, decision hides it, none sends no x-kvroute-* header; the
// decision API is unaffected.
func TestResponseHeaderModes(t *testing.T) {
	f := startFleet(t, 1, picker.DefaultConfig(), "")
	body := `{"model":"Qwen/Qwen3-0.6B","prompt":"` + strings.Repeat("headers ", 40) + `","max_tokens":2}`
	for mode, want := range map[string][]string{
		picker.HeadersAll:      {"X-Kvroute-Endpoint", "X-Kvroute-Endpoint-Id", "X-Kvroute-Matched-Tokens", "X-Kvroute-Predicted-Ttft-Ms", "X-Kvroute-Prefix-Hash"},
		picker.HeadersDecision: {"X-Kvroute-Endpoint-Id", "X-Kvroute-Matched-Tokens", "X-Kvroute-Predicted-Ttft-Ms", "X-Kvroute-Prefix-Hash"},
		picker.HeadersNone:     {},
	} {
		cfg := picker.DefaultConfig()
		cfg.ResponseHeaders = mode
		r, err := picker.NewRouter(cfg, f.view, zap.NewNop(), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		api := httptest.NewServer(r.Handler(picker.HandlerOptions{}))
		resp, err := http.Post(api.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		api.Close()
		r.Close()
		var got []string
		for k := range resp.Header {
			if strings.HasPrefix(k, "X-Kvroute-") {
				got = append(got, k)
			}
		}
		if resp.StatusCode != 200 || len(got) != len(want) {
			t.Fatalf("%s: %d, headers %v, want %v", mode, resp.StatusCode, got, want)
		}
		for _, k := range want {
			if resp.Header.Get(k) == "" {
				t.Fatalf("%s: no %s in %v", mode, k, resp.Header)
			}
		}
		// The decision API always answers in full.
		code, a, _ := f.pick(t, body, nil, "")
		if code != 200 || a.Endpoint == "" {
			t.Fatalf("%s: decision API %d %+v", mode, code, a)
		}
	}
	cfg := picker.DefaultConfig()
	cfg.ResponseHeaders = "some"
	if _, err := picker.NewRouter(cfg, f.view, zap.NewNop(), nil); err == nil || !strings.Contains(err.Error(), "--response-headers") {
		t.Fatalf("a bad mode: %v", err)
	}
}

// TestUpstreamRetries: engines that cannot be reached are each tried
// once, counted as retries, and the client gets a 502 in OpenAI's format;
// nothing stays counted in flight.
func TestUpstreamRetries(t *testing.T) {
	closed := func() string { return fmt.Sprintf("http://127.0.0.1:%d", testnet.FreePort(t)) } // nothing listens there
	urls := []string{closed(), closed()}
	v, _ := simViewWith(t, len(urls), func(i int, c *simsidecar.Config) { c.Params, c.Endpoint = summary.ForCapacity(4096), urls[i] })
	reg := prometheus.NewRegistry()
	r := simRouter(t, v, reg)
	api := httptest.NewServer(r.Handler(picker.HandlerOptions{}))
	t.Cleanup(api.Close)
	resp, err := http.Post(api.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"sim","prompt":[1,2,3,4],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	checkErrorBody(t, "502", raw)
	if n, _ := series(t, reg, "kvroute_picker_upstream_retries_total", map[string]string{"cause": "connect_error"}); n != 2 {
		t.Fatalf("retries %v, want one per engine tried (2)", n)
	}
	if n, ok := series(t, reg, "kvroute_picker_endpoint_requests_in_flight", nil); !ok || n != 0 {
		t.Fatalf("still in flight: %v (%v)", n, ok)
	}
}
