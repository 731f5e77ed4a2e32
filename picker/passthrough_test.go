package picker_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/summary"
	"github.com/kvroute/kvroute/picker"
	"github.com/kvroute/kvroute/picker/fleetview"
	"github.com/kvroute/kvroute/test/enginesim"
	"github.com/kvroute/kvroute/test/testnet"
)

const (
	chatModel  = "Qwen/Qwen3-0.6B"
	embedModel = "intfloat/e5-small"
)

// startMixedFleet starts four engines: two of the chat model with a LoRA
// adapter, sql-lora (the picker routes an adapter within its group: every
// engine of the group serves it), then two of an embedding model
// (--runner pooling); adjust, when set, adjusts the embedding engines.
func startMixedFleet(t *testing.T, cfg picker.Config, adjust func(*enginesim.Config)) *fleet {
	t.Helper()
	n := 0
	return startFleetWith(t, 4, cfg, "", func(c *enginesim.Config) {
		switch n {
		case 0, 1:
			c.EnableLoRA, c.LoRAModules = true, []enginesim.LoRAModule{{Name: "sql-lora", Path: "/adapters/sql"}}
		case 2, 3:
			c.Model, c.Runner = embedModel, enginesim.RunnerPooling
			if adjust != nil {
				adjust(c)
			}
		}
		n++
	})
}

// do sends a request and returns the status, the endpoint the picker
// chose and the body.
func do(t *testing.T, method, url, body string) (int, string, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("X-Kvroute-Endpoint"), b
}

// TestPassthroughModels: /v1/models through the SDK is the union over the
// fleet in vLLM's shape — each model once, adapters included — and
// /v1/models/{id} the one card, or OpenAI's 404.
func TestPassthroughModels(t *testing.T) {
	f := startMixedFleet(t, picker.DefaultConfig(), nil)
	c := sdk(f.api.URL, nil)
	page, err := c.Models.List(withTimeout(t))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
		if m.OwnedBy != "vllm" || m.Object != "model" || m.Created == 0 {
			t.Errorf("card %s", m.RawJSON())
		}
	}
	slices.Sort(ids)
	if want := []string{chatModel, embedModel, "sql-lora"}; !slices.Equal(ids, want) {
		t.Fatalf("models %v, want %v (each once)", ids, want)
	}
	for _, id := range []string{chatModel, "sql-lora", embedModel} {
		m, err := c.Models.Get(withTimeout(t), id)
		if err != nil || m.ID != id {
			t.Fatalf("get %s: %+v %v", id, m, err)
		}
		// The card as vLLM writes it.
		var card struct {
			Root       string           `json:"root"`
			Parent     *string          `json:"parent"`
			MaxLen     *int             `json:"max_model_len"`
			Permission []map[string]any `json:"permission"`
		}
		if err := json.Unmarshal([]byte(m.RawJSON()), &card); err != nil || len(card.Permission) != 1 {
			t.Fatalf("%s: %s", id, m.RawJSON())
		}
		if lora := id == "sql-lora"; lora != (card.Parent != nil) || lora != (card.MaxLen == nil) || (lora && (*card.Parent != chatModel || card.Root != "/adapters/sql")) {
			t.Errorf("%s: %s", id, m.RawJSON())
		}
	}
	_, err = c.Models.Get(withTimeout(t), "no-such-model")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" || apiErr.Param != "model" ||
		apiErr.Type != "NotFoundError" || apiErr.Message != "The model `no-such-model` does not exist." {
		t.Fatalf("unknown model: %v", err)
	}
	// The raw list: {"object":"list","data":[…]}.
	code, _, raw := do(t, http.MethodGet, f.api.URL+"/v1/models", "")
	var list struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}
	if code != 200 || json.Unmarshal(raw, &list) != nil || list.Object != "list" || len(list.Data) != 3 {
		t.Fatalf("list: %d %s", code, raw)
	}
}

// TestPassthroughEmbeddings: embeddings through the SDK reach an engine
// of the embedding model's group and come back as the engine answered;
// the pooling paths are forwarded as received; a model that does not
// pool answers as its engine does; the picker's own refusals are
// OpenAI's.
func TestPassthroughEmbeddings(t *testing.T) {
	cfg := picker.DefaultConfig()
	cfg.MaxBodyBytes = 4096
	f := startMixedFleet(t, cfg, nil)
	pooling := []string{f.engines[2].URL(), f.engines[3].URL()}
	var hdr http.Header
	c := sdk(f.api.URL, &hdr)
	inputs := []string{"kv caches are fast", "routing by prefix"}
	res, err := c.Embeddings.New(withTimeout(t), openai.EmbeddingNewParams{Model: embedModel,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs}})
	if err != nil {
		t.Fatal(err)
	}
	chosen := hdr.Get("X-Kvroute-Endpoint")
	if !slices.Contains(pooling, chosen) || len(res.Data) != 2 || len(res.Data[0].Embedding) != enginesim.EmbeddingDim || res.Usage.PromptTokens == 0 {
		t.Fatalf("via %s: %s", chosen, res.RawJSON())
	}
	body, _ := json.Marshal(map[string]any{"model": embedModel, "input": inputs})
	direct := post(t, chosen+"/v1/embeddings", string(body))
	if sansIDs(t, res.RawJSON()) != sansIDs(t, direct) {
		t.Fatalf("the picker's answer differs from the engine's:\n%s\n%s", res.RawJSON(), direct)
	}
	// Every pooling path, forwarded as received and answered as the
	// engine answers.
	for _, tc := range []struct{ path, body string }{
		{"/pooling", `{"model":"` + embedModel + `","input":"x"}`},
		{"/classify", `{"model":"` + embedModel + `","input":["good","bad"]}`},
		{"/score", `{"model":"` + embedModel + `","text_1":"a","text_2":["a","b"]}`},
		{"/v1/score", `{"model":"` + embedModel + `","queries":"a","documents":["a","b"]}`},
		{"/rerank", `{"model":"` + embedModel + `","query":"a","documents":["b","a"],"top_n":1}`},
		{"/v1/rerank", `{"model":"` + embedModel + `","query":"a","documents":["b","a"]}`},
		{"/v2/rerank", `{"model":"` + embedModel + `","query":"a","documents":["b","a"]}`},
		{"/v1/embeddings", `{"model":"` + embedModel + `","input":"x","encoding_format":"base64"}`},
	} {
		code, via, got := do(t, http.MethodPost, f.api.URL+tc.path, tc.body)
		if code != 200 || !slices.Contains(pooling, via) {
			t.Fatalf("%s: %d via %s: %s", tc.path, code, via, got)
		}
		if want := post(t, via+tc.path, tc.body); sansIDs(t, string(got)) != sansIDs(t, want) {
			t.Errorf("%s: the picker's answer differs from the engine's:\n%s\n%s", tc.path, got, want)
		}
	}
	if n, _ := series(t, f.reg, "kvroute_picker_requests_total", map[string]string{"route": "/v1/embeddings", "model": embedModel, "code": "200"}); n != 2 {
		t.Fatalf("embeddings requests counted %v times by route and model, want 2 (the SDK's and the base64 one)", n)
	}
	// The chat model does not pool: its engine's 404, byte for byte, and
	// a hint header naming the pooling runner.
	req, _ := http.NewRequest(http.MethodPost, f.api.URL+"/v1/embeddings", strings.NewReader(`{"model":"`+chatModel+`","input":"x"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	via := resp.Header.Get("X-Kvroute-Endpoint")
	if resp.StatusCode != 404 || string(got) != "{\"detail\":\"Not Found\"}\n" || via == "" || slices.Contains(pooling, via) {
		t.Fatalf("embeddings of the chat model: %d via %s: %q", resp.StatusCode, via, got)
	}
	if hint := resp.Header.Get(picker.HintHeader); !strings.Contains(hint, "--runner pooling") {
		t.Fatalf("embeddings of the chat model: hint %q, want one naming --runner pooling", hint)
	}
	// The picker's refusals.
	_, err = c.Embeddings.New(withTimeout(t), openai.EmbeddingNewParams{Model: "no-such-model",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model: %v", err)
	}
	for _, tc := range []struct {
		body  string
		code  int
		param string
	}{
		{`{"input":"x"}`, 400, "model"},
		{`not json`, 400, ""},
		{`{"model":"` + embedModel + `","input":"` + strings.Repeat("x", 5000) + `"}`, 413, ""},
	} {
		code, _, got := do(t, http.MethodPost, f.api.URL+"/v1/embeddings", tc.body)
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
			} `json:"error"`
		}
		if code != tc.code || json.Unmarshal(got, &e) != nil || e.Error.Message == "" || e.Error.Type == "" || (tc.param != "") != (e.Error.Param != nil) {
			t.Errorf("%.40s: %d %s, want %d", tc.body, code, got, tc.code)
		}
	}
}

// sansIDs drops what differs between two answers to one request (the
// id, the creation time) from a JSON object.
func sansIDs(t *testing.T, s string) string {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	delete(v, "id")
	delete(v, "created")
	b, _ := json.Marshal(v)
	return string(b)
}

// TestPassthroughLeastLoaded: while one embedding engine is busy (its
// load report says so), pooling requests go to the other; a dead engine
// is tried at most once per request, before any byte, and the requests
// still succeed.
func TestPassthroughLeastLoaded(t *testing.T) {
	f := startMixedFleet(t, picker.DefaultConfig(), func(c *enginesim.Config) {
		// A 3,000-token prompt takes 3 s, in chunks of 256 tokens: the
		// engine reports it running after the first.
		c.Sim.TimeScale, c.Sim.PrefillTokensPerSecond, c.MaxNumBatchedTokens = 1, 1000, 256
	})
	// Busy is the engine the picker chooses when both are idle: a balancer
	// that ignored load, or took turns, would choose it again.
	code, busy, got := do(t, http.MethodPost, f.api.URL+"/v1/embeddings", `{"model":"`+embedModel+`","input":"probe"}`)
	idle := f.engines[2].URL()
	if idle == busy {
		idle = f.engines[3].URL()
	}
	if code != 200 || (busy != f.engines[2].URL() && busy != f.engines[3].URL()) {
		t.Fatalf("probe: %d via %s: %s", code, busy, got)
	}
	f.awaitLoadReports(t)
	long := make([]int, 3000)
	for i := range long {
		long[i] = 1000 + i%500
	}
	body, _ := json.Marshal(map[string]any{"model": embedModel, "input": long})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		resp, err := http.Post(busy+"/v1/embeddings", "application/json", bytes.NewReader(body))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	t.Cleanup(wg.Wait)
	testnet.Await(t, 10*time.Second, 10*time.Millisecond, func() error {
		for _, e := range f.view.Endpoints() {
			if e.URL == busy && e.Load.Waiting+e.Load.Running >= 1 {
				return nil
			}
		}
		return errors.New("the busy engine's load report does not show its request yet")
	})
	for i := 0; i < 4; i++ {
		code, via, got := do(t, http.MethodPost, f.api.URL+"/v1/embeddings", `{"model":"`+embedModel+`","input":"short"}`)
		if code != 200 || via != idle {
			t.Fatalf("request %d: %d via %s (busy %s, idle %s): %.300s", i, code, via, busy, idle, got)
		}
	}
	// The idle engine dies; its sidecar lives on, so the view still
	// offers it: each request finds it dead and is answered by the other.
	f.kill(t, idle)
	for i := 0; i < 3; i++ {
		code, via, got := do(t, http.MethodPost, f.api.URL+"/classify", `{"model":"`+embedModel+`","input":"short"}`)
		if code != 200 || via != busy {
			t.Fatalf("after the kill, request %d: %d via %s: %.300s", i, code, via, got)
		}
	}
}

// TestPassthroughTokenize: /tokenize and /detokenize are answered by an
// engine of the model's group exactly as the engine answers them, and
// /version as vLLM answers it.
func TestPassthroughTokenize(t *testing.T) {
	f := startMixedFleet(t, picker.DefaultConfig(), nil)
	chat := []string{f.engines[0].URL(), f.engines[1].URL()}
	pooling := []string{f.engines[2].URL(), f.engines[3].URL()}
	for _, tc := range []struct {
		path, body string
		group      []string
	}{
		{"/tokenize", `{"model":"` + chatModel + `","prompt":"Hello, world — déjà vu","return_token_strs":true}`, chat},
		{"/tokenize", `{"model":"sql-lora","messages":[{"role":"user","content":"hi"}]}`, chat},
		{"/tokenize", `{"model":"` + embedModel + `","prompt":"embed me"}`, pooling},
		{"/detokenize", `{"model":"` + chatModel + `","tokens":[72,101,108,108,111]}`, chat},
	} {
		code, via, got := do(t, http.MethodPost, f.api.URL+tc.path, tc.body)
		if code != 200 || !slices.Contains(tc.group, via) {
			t.Fatalf("%s %s: %d via %s: %s", tc.path, tc.body, code, via, got)
		}
		if want := post(t, via+tc.path, tc.body); string(got) != want {
			t.Errorf("%s: %s, the engine answers %s", tc.path, got, want)
		}
	}
	if code, _, got := do(t, http.MethodPost, f.api.URL+"/tokenize", `{"prompt":"no model"}`); code != 400 || !strings.Contains(string(got), "you must provide a model parameter") {
		t.Errorf("tokenize without a model: %d %s", code, got)
	}
	code, via, got := do(t, http.MethodGet, f.api.URL+"/version", "")
	var v map[string]string
	if code != 200 || via == "" || json.Unmarshal(got, &v) != nil || len(v) != 1 || v["version"] != enginesim.SimVersion {
		t.Fatalf("version: %d via %s: %s", code, via, got)
	}
}

// TestPassthroughWithoutEngines: with no endpoint known, the model list
// and /version are 503s and a named model is unknown, in OpenAI's
// format.
func TestPassthroughWithoutEngines(t *testing.T) {
	vcfg := fleetview.DefaultConfig()
	vcfg.Params = summary.ForCapacity(capacity)
	v, err := fleetview.New(vcfg, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	r, err := picker.NewRouter(picker.DefaultConfig(), v, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	api := httptest.NewServer(r.Handler(picker.HandlerOptions{}))
	t.Cleanup(api.Close)
	for _, tc := range []struct {
		method, path, body string
		code               int
		errCode            string
	}{
		{http.MethodGet, "/v1/models", "", 503, "no_healthy_endpoint"},
		{http.MethodGet, "/v1/models/m", "", 503, "no_healthy_endpoint"},
		{http.MethodGet, "/version", "", 503, "no_healthy_endpoint"},
		{http.MethodPost, "/v1/embeddings", `{"model":"m","input":"x"}`, 404, "model_not_found"},
		{http.MethodPost, "/detokenize", `{"model":"m","tokens":[1]}`, 404, "model_not_found"},
	} {
		code, _, got := do(t, tc.method, api.URL+tc.path, tc.body)
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if code != tc.code || json.Unmarshal(got, &e) != nil || e.Error.Code != tc.errCode {
			t.Errorf("%s %s: %d %s, want %d %s", tc.method, tc.path, code, got, tc.code, tc.errCode)
		}
	}
}
