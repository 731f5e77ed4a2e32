package intake

import (
	"encoding/json"
	"errors"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestParseChat(t *testing.T) {
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":true},"cache_salt":"s1",
		"messages":[{"role":"system","content":"sys"},{"role":"user","content":"u1"},{"role":"assistant","content":"a1"},{"role":"user","content":"u2"}],
		"tools":[{"type":"function","function":{"name":"f"}}]}`
	r, err := Parse(Chat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || !r.Stream || !r.IncludeUsage || r.CacheSalt != "s1" || !r.Anchorable || r.TokenIDs != nil || r.Unresolved != "" {
		t.Fatalf("%+v", r)
	}
	var anchor struct {
		Messages            []map[string]string `json:"messages"`
		AddGenerationPrompt *bool               `json:"add_generation_prompt"`
		Stream              bool                `json:"stream"`
		StreamOptions       any                 `json:"stream_options"`
		Tools               []any               `json:"tools"`
		CacheSalt           string              `json:"cache_salt"`
	}
	if err := json.Unmarshal(r.AnchorBody, &anchor); err != nil {
		t.Fatal(err)
	}
	if len(anchor.Messages) != 2 || anchor.Messages[1]["content"] != "u1" || anchor.AddGenerationPrompt == nil || *anchor.AddGenerationPrompt ||
		anchor.Stream || anchor.StreamOptions != nil || len(anchor.Tools) != 1 || anchor.CacheSalt != "s1" {
		t.Fatalf("anchor %s", r.AnchorBody)
	}
	// No user message: the leading system messages; none at all: no anchor.
	r, _ = Parse(Chat, []byte(`{"model":"m","messages":[{"role":"developer","content":"d"},{"role":"assistant","content":"a"}]}`))
	if !r.Anchorable || r.AnchorBody == nil {
		t.Fatalf("developer-only anchor: %+v", r)
	}
	r, _ = Parse(Chat, []byte(`{"model":"m","messages":[{"role":"assistant","content":"a"}]}`))
	if r.Anchorable {
		t.Fatal("an assistant-only chat is anchorable")
	}
}

func TestParseCompletion(t *testing.T) {
	for _, tc := range []struct {
		body    string
		ids     []uint32
		prompts int
		render  string // RenderBody: the first text alone
	}{
		{`{"model":"m","prompt":"hello"}`, nil, 0, ""},
		{`{"model":"m","prompt":[1,2,3]}`, []uint32{1, 2, 3}, 0, ""},
		{`{"model":"m","prompt":[[4,5]]}`, []uint32{4, 5}, 1, ""},
		{`{"model":"m","prompt":["a"]}`, nil, 1, `{"model":"m","prompt":"a"}`},
		{`{"model":"m","prompt":["a","b"],"max_tokens":3}`, nil, 2, `{"model":"m","prompt":"a","max_tokens":3}`},
		{`{"model":"m","prompt":[[1],[2]]}`, []uint32{1}, 2, ""},
	} {
		r, err := Parse(Completion, []byte(tc.body))
		if err != nil || !slices.Equal(r.TokenIDs, tc.ids) || r.Unresolved != "" || r.AnchorBody != nil || r.Prompts != tc.prompts || string(r.RenderBody) != tc.render {
			t.Fatalf("%s: %+v, %v", tc.body, r, err)
		}
	}
	// A batch mixes no forms, as vLLM requires.
	for _, body := range []string{`{"model":"m","prompt":["a",[1]]}`, `{"model":"m","prompt":[[1],"a"]}`, `{"model":"m","prompt":[[1],{"x":1}]}`} {
		if _, err := Parse(Completion, []byte(body)); err == nil || err.(*Error).Status != 400 || err.(*Error).Param != "prompt" {
			t.Fatalf("%s: %v, want a 400 on prompt", body, err)
		}
	}
}

func TestParseResponses(t *testing.T) {
	r, err := Parse(Responses, []byte(`{"model":"m","instructions":"be brief","input":[
		{"role":"user","content":"q1"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
		{"type":"function_call_output","call_id":"c","output":"42"},{"role":"user","content":"q2"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var anchor struct {
		Input        []map[string]any `json:"input"`
		Instructions string           `json:"instructions"`
	}
	if err := json.Unmarshal(r.AnchorBody, &anchor); err != nil || len(anchor.Input) != 1 || anchor.Instructions != "be brief" {
		t.Fatalf("anchor %s %v", r.AnchorBody, err)
	}
	// The anchor of a one-message request is the request (rendered as chat
	// without the generation prompt, like every Responses anchor).
	r, err = Parse(Responses, []byte(`{"model":"m","input":"just text","stream":true}`))
	if err != nil || !r.Anchorable || string(r.AnchorBody) != `{"model":"m","input":"just text","stream":false}` {
		t.Fatalf("string input: %s %v", r.AnchorBody, err)
	}
	r, err = Parse(Responses, []byte(`{"model":"m","input":[{"role":"user","content":"only"}]}`))
	if err != nil || !r.Anchorable || !strings.Contains(string(r.AnchorBody), `"only"`) {
		t.Fatalf("one user item: %s %v", r.AnchorBody, err)
	}
	r, err = Parse(Responses, []byte(`{"model":"m","instructions":"i","input":[{"type":"function_call_output","call_id":"c","output":"x"}]}`))
	if err != nil || !r.Anchorable || !strings.Contains(string(r.AnchorBody), `"input":[]`) {
		t.Fatalf("instructions only: %s %v", r.AnchorBody, err)
	}
}

func TestParseTokens(t *testing.T) {
	r, err := Parse(Tokens, []byte(`{"model":"m","token_ids":[9,8],"cache_salt":"t","lora":"adapter"}`))
	if err != nil || !slices.Equal(r.TokenIDs, []uint32{9, 8}) || r.LoRA != "adapter" || r.CacheSalt != "t" {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestRefusals(t *testing.T) {
	for _, tc := range []struct {
		kind  Kind
		body  string
		param string
		code  string
	}{
		{Chat, `not json`, "", ""},
		{Chat, `[1,2]`, "", ""},
		{Chat, `{"messages":[{"role":"user","content":"x"}]}`, "model", ""},
		{Chat, `{"model":"","messages":[{"role":"user"}]}`, "model", ""},
		{Chat, `{"model":"m"}`, "messages", ""},
		{Chat, `{"model":"m","messages":[]}`, "messages", ""},
		{Chat, `{"model":"m","messages":[1]}`, "messages", ""},
		{Chat, `{"model":"m","messages":[{"role":"user"}],"cache_salt":""}`, "cache_salt", ""},
		{Chat, `{"model":"m","messages":[{"role":"user"}],"cache_salt":5}`, "cache_salt", ""},
		{Completion, `{"model":"m"}`, "prompt", ""},
		{Completion, `{"model":"m","prompt":[]}`, "prompt", ""},
		{Completion, `{"model":"m","prompt":[-1]}`, "prompt", ""},
		{Completion, `{"model":"m","prompt":[{"a":1}]}`, "prompt", ""},
		{Responses, `{"model":"m","input":"x","previous_response_id":"resp_1"}`, "previous_response_id", "unresolved_previous_response"},
		{Responses, `{"model":"m"}`, "input", ""},
		{Responses, `{"model":"m","input":[3]}`, "input", ""},
		{Tokens, `{"model":"m","token_ids":[]}`, "token_ids", ""},
		{Tokens, `{"model":"m","token_ids":[1],"lora":7}`, "lora", ""},
	} {
		_, err := Parse(tc.kind, []byte(tc.body))
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || e.Param != tc.param || e.Code != tc.code || e.Type != "invalid_request_error" {
			t.Errorf("%s %s: %+v", tc.kind, tc.body, err)
			continue
		}
		var wire struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(e.Body(), &wire); err != nil || wire.Error.Message == "" || wire.Error.Type != e.Type || (tc.code != "" && (wire.Error.Code == nil || *wire.Error.Code != tc.code)) {
			t.Errorf("%s: error body %s", tc.body, e.Body())
		}
	}
}

// TestModel: the model of a forwarded body, or Parse's refusal.
func TestModel(t *testing.T) {
	var pp Parser
	for _, tc := range []struct {
		body  string
		model string
		param string // of the refusal
	}{
		{`{"model":"embedder","input":["a","b"]}`, "embedder", ""},
		{`{"input":"x","model":"Qwen/Qwen3-0.6B","encoding_format":"base64"}`, "Qwen/Qwen3-0.6B", ""},
		{`{"model":"m","tokens":[1,2,3]}`, "m", ""},
		{`{"input":"x"}`, "", "model"},
		{`{"model":""}`, "", "model"},
		{`{"model":7}`, "", "model"},
		{`{"model":null}`, "", "model"},
		{`["model"]`, "", ""},
		{`{"model":"m"`, "", ""},
		{``, "", ""},
	} {
		got, err := pp.Model([]byte(tc.body))
		if tc.model != "" {
			if err != nil || got != tc.model {
				t.Errorf("%s: %q, %v", tc.body, got, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || e.Param != tc.param || e.Type != "invalid_request_error" || e.Message == "" {
			t.Errorf("%s: %q, %+v, want a 400 on param %q", tc.body, got, err, tc.param)
		}
	}
}

func TestDetect(t *testing.T) {
	for body, want := range map[string]Kind{
		`{"messages":[]}`:  Chat,
		`{"input":"x"}`:    Responses,
		`{"prompt":"x"}`:   Completion,
		`{"token_ids":[]}`: Tokens,
	} {
		if k, err := Detect([]byte(body)); err != nil || k != want {
			t.Errorf("%s: %v %v", body, k, err)
		}
	}
	for _, body := range []string{`{}`, `x`, `[]`} {
		if _, err := Detect([]byte(body)); err == nil {
			t.Errorf("%s detected", body)
		}
	}
}

// FuzzParse: no body panics any parser, and a refusal is always an *Error.
func FuzzParse(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	f.Add(`{"model":"m","prompt":[1,2]}`)
	f.Add(`{"model":"m","input":[{"role":"user"}],"previous_response_id":"x"}`)
	f.Add(`{"model":"m","token_ids":[1],"lora":"a"}`)
	f.Fuzz(func(t *testing.T, body string) {
		for _, k := range []Kind{Chat, Completion, Responses, Tokens} {
			if _, err := Parse(k, []byte(body)); err != nil {
				var e *Error
				if !errors.As(err, &e) || e.Status < 400 || e.Status > 499 {
					t.Fatalf("%s: %v", k, err)
				}
			}
		}
		_, _ = Detect([]byte(body))
	})
}

// FuzzFastArrays: the token-array fast path reads every body exactly as
// the generic parser does: the same request or the same refusal.
func FuzzFastArrays(f *testing.F) {
	f.Add(`{"model":"m","token_ids":[1, 2,3],"cache_salt":"s"}`)
	f.Add(`{"model":"m","prompt":[01]}`)
	f.Add(`{"prompt":[1],"model":"m","prompt":[2]}`)
	f.Add(`{"model":"m","prompt":[[1,2]],"x":"]"}`)
	f.Add(`{"model":"m","token_ids":[4294967296]}`)
	f.Add(` {"model":"m", "x": {"token_ids":[1]}, "token_ids" : [ 7 ] } `)
	f.Add(`{"model":"m","token_ids":"x","token_ids":[1,2]}`)
	f.Add(`{"model":"m","prompt":{"a":1},"prompt":[1,2]}`)
	f.Add(`{"model":"m","prom\u0070t":[3],"prompt":[1,2]}`)
	f.Fuzz(func(t *testing.T, body string) {
		var p Parser
		for _, k := range []Kind{Completion, Tokens, Any} {
			a, errA := p.parse(k, []byte(body), true)
			b, errB := p.parse(k, []byte(body), false)
			if (errA == nil) != (errB == nil) {
				t.Fatalf("%s: fast %v, generic %v", k, errA, errB)
			}
			if errA != nil {
				if errA.Error() != errB.Error() {
					t.Fatalf("%s: fast %v, generic %v", k, errA, errB)
				}
				continue
			}
			a.pre, b.pre = nil, nil
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("%s: fast %+v, generic %+v", k, a, b)
			}
		}
	})
}

// TestFastArraysBounded: repeated or escaped keys leave the fast path, and
// what it keeps is bounded by the body.
func TestFastArraysBounded(t *testing.T) {
	for _, body := range []string{
		`{"token_ids":"x","token_ids":[1,2]}`,
		`{"prompt":{"a":1},"prompt":[1,2]}`,
		`{"prom\u0070t":[3],"prompt":[1,2]}`,
		`{"prompt":[1],"prompt":[1],"prompt":[1]}`,
	} {
		if _, pre := fastArrays([]byte(body), "token_ids", "prompt"); pre != nil {
			t.Errorf("%s: fast path taken", body)
		}
	}
	body := []byte(`{"model":"m","prompt":[1],` + strings.Repeat(`"x":[1],`, 20000) + `"y":1}`)
	allocs := testing.AllocsPerRun(2, func() { fastArrays(body, "token_ids", "prompt") })
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fastArrays(body, "token_ids", "prompt")
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > uint64(4*len(body)) {
		t.Fatalf("%d bytes allocated for a %d-byte body (%v allocations)", grew, len(body), allocs)
	}
}

// TestRawAnchorIgnoresSamplingAndLaterTurns: the raw anchor of a chat is
// the same on every turn and whatever the sampling parameters.
func TestRawAnchorIgnoresSamplingAndLaterTurns(t *testing.T) {
	a, _ := Parse(Chat, []byte(`{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`))
	b, _ := Parse(Chat, []byte(`{"model":"m","temperature":0.2,"messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"},{"role":"user","content":"v"}]}`))
	c, _ := Parse(Chat, []byte(`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"other"}]}`))
	if string(a.RawAnchor) != string(b.RawAnchor) || string(a.RawAnchor) == string(c.RawAnchor) || len(a.RawAnchor) == 0 {
		t.Fatalf("%s / %s / %s", a.RawAnchor, b.RawAnchor, c.RawAnchor)
	}
	p, _ := Parse(Completion, []byte(`{"model":"m","prompt":"`+strings.Repeat("x", 5000)+`","max_tokens":3}`))
	if len(p.RawAnchor) != 4096 {
		t.Fatalf("text prompt anchor of %d bytes", len(p.RawAnchor))
	}
}

// TestTokenBodyAllocation: reading a token-id body allocates the ids and
// a little more, not a body's worth of each (it once reserved a quarter
// of the body's length in ids, and the whole body again for the rest).
func TestTokenBodyAllocation(t *testing.T) {
	ids := make([]uint32, 8192)
	for i := range ids {
		ids[i] = uint32(i * 7919 % 151000)
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "token_ids": ids, "cache_salt": "s"})
	var p Parser
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := p.Parse(Tokens, body); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if grew, want := after.TotalAlloc-before.TotalAlloc, uint64(4*len(ids)+4096); grew > want {
		t.Fatalf("%d bytes allocated for %d ids in a %d-byte body, want at most %d", grew, len(ids), len(body), want)
	}
}
