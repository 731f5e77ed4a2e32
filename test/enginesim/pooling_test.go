package enginesim_test

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/test/enginesim"
)

// poolingConfig is testConfig running as a pooling model.
func poolingConfig() enginesim.Config {
	cfg := testConfig()
	cfg.Runner = enginesim.RunnerPooling
	cfg.ServedModelNames = []string{"embedder"}
	return cfg
}

// notFound reports whether a POST answers FastAPI's 404, as vLLM answers
// a route it did not register.
func notFound(t *testing.T, url string) bool {
	t.Helper()
	var body map[string]any
	code := postRaw(t, url, []byte(`{"model":"embedder","input":"x","messages":[{"role":"user","content":"x"}],"prompt":"x","query":"x","documents":["y"]}`), &body)
	return code == http.StatusNotFound && len(body) == 1 && body["detail"] == "Not Found"
}

// TestPoolingRoutesFollowTheRunner: a generative engine serves no pooling
// route, a pooling engine no generative one (vLLM registers the routes of
// its runner only); both serve tokenize, models and version.
func TestPoolingRoutesFollowTheRunner(t *testing.T) {
	poolingPaths := []string{"/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"}
	generativePaths := []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/chat/completions/render", "/v1/completions/render", "/v1/responses/render"}
	gcfg := testConfig()
	gcfg.EnableScaleOutEndpoints = true
	gen := start(t, gcfg).Engines()[0]
	pcfg := poolingConfig()
	pcfg.EnableScaleOutEndpoints = true
	pool := start(t, pcfg).Engines()[0]
	for _, p := range poolingPaths {
		if !notFound(t, gen.URL()+p) {
			t.Errorf("generative engine: %s is served", p)
		}
		if notFound(t, pool.URL()+p) {
			t.Errorf("pooling engine: %s is not served", p)
		}
	}
	for _, p := range generativePaths {
		if notFound(t, gen.URL()+p) {
			t.Errorf("generative engine: %s is not served", p)
		}
		if !notFound(t, pool.URL()+p) {
			t.Errorf("pooling engine: %s is served", p)
		}
	}
	for _, e := range []*enginesim.Engine{gen, pool} {
		var tok struct {
			Count int `json:"count"`
		}
		if code := post(t, e.URL()+"/tokenize", map[string]any{"prompt": "hello there"}, &tok); code != 200 || tok.Count == 0 {
			t.Errorf("%s /tokenize: %d %+v", e.URL(), code, tok)
		}
		if !strings.Contains(get(t, e.URL()+"/v1/models"), `"object":"list"`) || !strings.Contains(get(t, e.URL()+"/version"), enginesim.SimVersion) {
			t.Errorf("%s: models or version missing", e.URL())
		}
	}
}

func norm(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

// TestSDKEmbeddings: embeddings through the OpenAI SDK: one unit vector
// of EmbeddingDim per input, the same for the same text, in input order;
// usage counts the prompt tokens as /tokenize does; token-id input works.
func TestSDKEmbeddings(t *testing.T) {
	e := start(t, poolingConfig()).Engines()[0]
	c := client(e.URL())
	inputs := []string{"The cat sat on the mat.", "A completely different sentence about engines.", "The cat sat on the mat."}
	res, err := c.Embeddings.New(ctx(t), openai.EmbeddingNewParams{Model: "embedder",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Model != "embedder" || res.Object != "list" || len(res.Data) != 3 || !strings.HasPrefix(res.JSON.ExtraFields["id"].Raw(), `"embd-`) {
		t.Fatalf("answer %s", res.RawJSON())
	}
	for i, d := range res.Data {
		if d.Index != int64(i) || d.Object != "embedding" || len(d.Embedding) != enginesim.EmbeddingDim || math.Abs(norm(d.Embedding)-1) > 1e-5 {
			t.Fatalf("data[%d]: index %d, %d values, norm %v", i, d.Index, len(d.Embedding), norm(d.Embedding))
		}
	}
	if !slices.Equal(res.Data[0].Embedding, res.Data[2].Embedding) || slices.Equal(res.Data[0].Embedding, res.Data[1].Embedding) {
		t.Fatal("the same text gave different vectors, or different texts the same")
	}
	want := 0
	for _, s := range inputs {
		var tok struct {
			Tokens []int `json:"tokens"`
		}
		post(t, e.URL()+"/tokenize", map[string]any{"prompt": s}, &tok)
		want += len(tok.Tokens)
	}
	if res.Usage.PromptTokens != int64(want) || res.Usage.TotalTokens != int64(want) {
		t.Fatalf("usage %+v, want %d prompt tokens", res.Usage, want)
	}
	var tok struct {
		Tokens []int64 `json:"tokens"`
	}
	post(t, e.URL()+"/tokenize", map[string]any{"prompt": inputs[0]}, &tok)
	ids, err := c.Embeddings.New(ctx(t), openai.EmbeddingNewParams{Model: "embedder",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: tok.Tokens}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids.Data[0].Embedding, res.Data[0].Embedding) {
		t.Fatal("token ids embedded unlike their text")
	}
	// dimensions on a model without matryoshka representation: vLLM's 400.
	_, err = c.Embeddings.New(ctx(t), openai.EmbeddingNewParams{Model: "embedder", Dimensions: openai.Int(64),
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || !strings.Contains(apiErr.Message, `Model "embedder" does not support matryoshka representation`) {
		t.Fatalf("dimensions: %v", err)
	}
}

type embeddings struct {
	ID    string `json:"id"`
	Model string `json:"model"`
	Data  []struct {
		Index     int    `json:"index"`
		Object    string `json:"object"`
		Embedding any    `json:"embedding"`
	} `json:"data"`
	Usage map[string]any `json:"usage"`
}

// TestEmbeddingsBase64: encoding_format base64 is the float answer's
// float32 values, in the endianness asked (native: this machine's).
func TestEmbeddingsBase64(t *testing.T) {
	e := start(t, poolingConfig()).Engines()[0]
	var float embeddings
	if code := post(t, e.URL()+"/v1/embeddings", map[string]any{"model": "embedder", "input": "base64 please"}, &float); code != 200 {
		t.Fatalf("float: %d", code)
	}
	u := float.Usage
	if u["prompt_tokens"] != u["total_tokens"] || u["completion_tokens"] != 0.0 || u["prompt_tokens_details"] != nil {
		t.Fatalf("usage %v", u)
	}
	values := float.Data[0].Embedding.([]any)
	for _, end := range []struct {
		name  string
		order binary.ByteOrder
	}{{"native", binary.NativeEndian}, {"little", binary.LittleEndian}, {"big", binary.BigEndian}} {
		var b64 embeddings
		if code := post(t, e.URL()+"/v1/embeddings", map[string]any{"model": "embedder", "input": "base64 please",
			"encoding_format": "base64", "endianness": end.name}, &b64); code != 200 {
			t.Fatalf("%s: %d", end.name, code)
		}
		raw, err := base64.StdEncoding.DecodeString(b64.Data[0].Embedding.(string))
		if err != nil || len(raw) != 4*enginesim.EmbeddingDim {
			t.Fatalf("%s: %d bytes, %v", end.name, len(raw), err)
		}
		for i, v := range values {
			if got := math.Float32frombits(end.order.Uint32(raw[4*i:])); float64(got) != v.(float64) {
				t.Fatalf("%s: value %d is %v, the float answer %v", end.name, i, got, v)
			}
		}
	}
}

// TestPoolingEndpoints: /pooling, /classify, /score and /rerank answer in
// vLLM's shapes; scores are cosine similarities of the embeddings.
func TestPoolingEndpoints(t *testing.T) {
	e := start(t, poolingConfig()).Engines()[0]
	var emb embeddings
	post(t, e.URL()+"/v1/embeddings", map[string]any{"model": "embedder", "input": "pool me"}, &emb)
	var pooled struct {
		ID     string `json:"id"`
		Object string `json:"object"`
		Model  string `json:"model"`
		Data   []struct {
			Index  int       `json:"index"`
			Object string    `json:"object"`
			Data   []float64 `json:"data"`
		} `json:"data"`
		Usage map[string]any `json:"usage"`
	}
	if code := post(t, e.URL()+"/pooling", map[string]any{"model": "embedder", "input": "pool me"}, &pooled); code != 200 ||
		!strings.HasPrefix(pooled.ID, "pool-") || pooled.Object != "list" || len(pooled.Data) != 1 || pooled.Data[0].Object != "pooling" {
		t.Fatalf("pooling: %d %+v", code, pooled)
	}
	for i, v := range emb.Data[0].Embedding.([]any) {
		if pooled.Data[0].Data[i] != v.(float64) {
			t.Fatal("/pooling's embedding differs from /v1/embeddings'")
		}
	}
	var cls struct {
		ID    string `json:"id"`
		Model string `json:"model"`
		Data  []struct {
			Index      int       `json:"index"`
			Label      string    `json:"label"`
			Probs      []float64 `json:"probs"`
			NumClasses int       `json:"num_classes"`
		} `json:"data"`
	}
	if code := post(t, e.URL()+"/classify", map[string]any{"model": "embedder", "input": []string{"good", "bad"}}, &cls); code != 200 ||
		!strings.HasPrefix(cls.ID, "classify-") || len(cls.Data) != 2 {
		t.Fatalf("classify: %d %+v", code, cls)
	}
	for _, d := range cls.Data {
		best := "LABEL_0"
		if d.Probs[1] > d.Probs[0] {
			best = "LABEL_1"
		}
		if d.NumClasses != 2 || len(d.Probs) != 2 || math.Abs(d.Probs[0]+d.Probs[1]-1) > 1e-6 || d.Label != best {
			t.Fatalf("classify data %+v", d)
		}
	}
	type scores struct {
		ID     string `json:"id"`
		Object string `json:"object"`
		Data   []struct {
			Index  int     `json:"index"`
			Object string  `json:"object"`
			Score  float64 `json:"score"`
		} `json:"data"`
		Usage map[string]any `json:"usage"`
	}
	query, near, far := "how do caches work", "how do caches work in engines", "purple elephants dance at noon"
	for _, body := range []map[string]any{
		{"model": "embedder", "queries": query, "documents": []string{query, near, far}},
		{"model": "embedder", "text_1": query, "text_2": []string{query, near, far}},
		{"model": "embedder", "data_1": []string{query, query, query}, "data_2": []string{query, near, far}},
	} {
		for _, path := range []string{"/score", "/v1/score"} {
			var s scores
			if code := post(t, e.URL()+path, body, &s); code != 200 || !strings.HasPrefix(s.ID, "score-") || s.Object != "list" || len(s.Data) != 3 {
				t.Fatalf("%s %v: %d %+v", path, body, code, s)
			}
			if math.Abs(s.Data[0].Score-1) > 1e-5 || !(s.Data[1].Score > s.Data[2].Score) || s.Data[2].Object != "score" || s.Data[2].Index != 2 {
				t.Fatalf("%s scores %+v", path, s.Data)
			}
		}
	}
	var bad map[string]map[string]any
	if code := post(t, e.URL()+"/score", map[string]any{"queries": []string{"a", "b"}, "documents": []string{"a", "b", "c"}}, &bad); code != 400 ||
		bad["error"]["message"] != "Input lengths must be either 1:1, 1:N or N:N" {
		t.Fatalf("2:3 scored: %d %v", code, bad)
	}
	type rerank struct {
		ID      string `json:"id"`
		Model   string `json:"model"`
		Results []struct {
			Index    int            `json:"index"`
			Document map[string]any `json:"document"`
			Score    float64        `json:"relevance_score"`
		} `json:"results"`
		Usage map[string]int `json:"usage"`
	}
	for _, path := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
		var rr rerank
		if code := post(t, e.URL()+path, map[string]any{"model": "embedder", "query": query, "documents": []string{far, near, query}, "top_n": 2}, &rr); code != 200 {
			t.Fatalf("%s: %d", path, code)
		}
		if !strings.HasPrefix(rr.ID, "score-") || rr.Model != "embedder" || len(rr.Results) != 2 || rr.Results[0].Index != 2 || rr.Results[1].Index != 1 ||
			rr.Results[0].Document["text"] != query || !(rr.Results[0].Score > rr.Results[1].Score) || rr.Usage["prompt_tokens"] == 0 ||
			rr.Usage["prompt_tokens"] != rr.Usage["total_tokens"] {
			t.Fatalf("%s: %+v", path, rr)
		}
	}
}

// TestPoolingErrors: vLLM's refusals, in its error body.
func TestPoolingErrors(t *testing.T) {
	cfg := poolingConfig()
	cfg.MaxModelLen = 64
	e := start(t, cfg).Engines()[0]
	long := strings.Repeat("word ", 100)
	for _, tc := range []struct {
		path string
		body map[string]any
		code int
		want string
	}{
		{"/v1/embeddings", map[string]any{"model": "nope", "input": "x"}, 404, "The model `nope` does not exist."},
		{"/v1/embeddings", map[string]any{"input": long}, 400, "maximum context length is 64 tokens. However, you requested"},
		{"/v1/embeddings", map[string]any{"input": long}, 400, "in the input for embedding generation. Please reduce the length of the input."},
		{"/classify", map[string]any{"input": long}, 400, "tokens in the input for classification."},
		{"/score", map[string]any{"queries": long, "documents": "x"}, 400, "tokens in the input for score."},
		{"/v1/embeddings", map[string]any{"input": "x", "encoding_format": "bytes"}, 400, "not supported by the simulated engine"},
		{"/v1/embeddings", map[string]any{"input": "x", "cache_salt": ""}, 400, "cache_salt"},
		{"/v1/embeddings", map[string]any{"input": "x", "truncate_prompt_tokens": 65}, 400, "truncate_prompt_tokens value is greater than max_model_len"},
		{"/v1/embeddings", map[string]any{}, 400, "input is required"},
		{"/pooling", map[string]any{"input": "x", "task": "token_classify"}, 400, "not supported by the simulated engine"},
		{"/rerank", map[string]any{"query": "x"}, 400, "query and documents"},
	} {
		var body errorBody
		if code := post(t, e.URL()+tc.path, tc.body, &body); code != tc.code || body.Error.Code != tc.code || !strings.Contains(body.Error.Message, tc.want) {
			t.Errorf("%s %v: %d %+v, want %d containing %q", tc.path, tc.body, code, body.Error, tc.code, tc.want)
		}
	}
	// Truncation keeps the last tokens, and a chat conversation embeds too.
	var trunc embeddings
	if code := post(t, e.URL()+"/v1/embeddings", map[string]any{"input": long, "truncate_prompt_tokens": -1}, &trunc); code != 200 || trunc.Usage["prompt_tokens"] != 64.0 {
		t.Fatalf("truncate -1: %d %v", code, trunc.Usage)
	}
	var chat embeddings
	if code := post(t, e.URL()+"/v1/embeddings", map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}}, &chat); code != 200 || len(chat.Data) != 1 {
		t.Fatalf("chat input: %d %+v", code, chat)
	}
}

// TestOtherRunnerAnswer: an embeddings request to a generative engine
// gets current vLLM's answer, byte for byte — FastAPI's 404, the route
// not being registered (build_app registers the pooling routers only for
// a model with pooling tasks) — and a chat request to a pooling engine
// likewise; the operator's hint, which runner serves the route, is in the
// log, once per engine.
func TestOtherRunnerAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, path, body, hint string
		cfg                    enginesim.Config
	}{
		{"embeddings to a generative engine", "/v1/embeddings", `{"model":"Qwen/Qwen3-0.6B","input":"x"}`, "--runner pooling", testConfig()},
		{"chat to a pooling engine", "/v1/chat/completions", `{"model":"embedder","messages":[{"role":"user","content":"x"}]}`, "--runner generate", poolingConfig()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			p, err := enginesim.Start(tc.cfg, zap.New(core))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			url := p.Engines()[0].URL() + tc.path
			for range 2 {
				resp, err := http.Post(url, "application/json", strings.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNotFound || string(b) != "{\"detail\":\"Not Found\"}\n" || resp.Header.Get("Content-Type") != "application/json" {
					t.Fatalf("%d %q %q, want vLLM's 404 {\"detail\":\"Not Found\"}", resp.StatusCode, resp.Header.Get("Content-Type"), b)
				}
			}
			hints := logs.FilterMessageSnippet(tc.hint).All()
			if len(hints) != 1 || hints[0].Level != zap.WarnLevel || hints[0].ContextMap()["path"] != tc.path {
				t.Fatalf("want one warning naming %s for %s, got %+v", tc.hint, tc.path, logs.All())
			}
		})
	}
}
