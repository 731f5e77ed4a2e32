package enginesim_test

import (
	"net/http"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/test/enginesim"
)

// TestFrontRendersAsTheEngine: the front end's prompt is the engine's own
// render of the same body, for each generate kind, and its refusals carry
// the engine's status.
func TestFrontRendersAsTheEngine(t *testing.T) {
	cfg := testConfig()
	cfg.EnableScaleOutEndpoints = true // the Responses render endpoint
	p := start(t, cfg)
	url := p.Engines()[0].URL()
	f, err := enginesim.NewFront(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ path, render, body string }{
		{"/v1/chat/completions", "/v1/chat/completions/render", `{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"route this request"}],"max_tokens":5,"cache_salt":"s1"}`},
		{"/v1/completions", "/v1/completions/render", `{"model":"Qwen/Qwen3-0.6B","prompt":"one two three four","max_tokens":3}`},
		{"/v1/responses", "/v1/responses/render", `{"model":"Qwen/Qwen3-0.6B","instructions":"be brief","input":[{"role":"user","content":"hello there"}],"max_output_tokens":4}`},
	}
	for _, c := range cases {
		g, err := f.Prepare(c.path, []byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		var out struct {
			TokenIDs []uint32 `json:"token_ids"`
		}
		var batch []struct {
			TokenIDs []uint32 `json:"token_ids"`
		}
		var want []uint32
		if c.path == "/v1/completions" {
			if code := postRaw(t, url+c.render, []byte(c.body), &batch); code != http.StatusOK || len(batch) != 1 {
				t.Fatalf("%s: render %d, %d prompts", c.render, code, len(batch))
			}
			want = batch[0].TokenIDs
		} else {
			if code := postRaw(t, url+c.render, []byte(c.body), &out); code != http.StatusOK {
				t.Fatalf("%s: render %d", c.render, code)
			}
			want = out.TokenIDs
		}
		if len(want) == 0 || !slices.Equal(g.Prompt, want) {
			t.Errorf("%s: front's prompt %d tokens, the engine renders %d (equal %v)", c.path, len(g.Prompt), len(want), slices.Equal(g.Prompt, want))
		}
		if g.MaxTokens < 3 || g.MaxTokens > 5 {
			t.Errorf("%s: max tokens %d", c.path, g.MaxTokens)
		}
	}
	if _, err := f.Prepare("/v1/chat/completions", []byte(`{"model":"nope","messages":[{"role":"user","content":"x"}]}`)); enginesim.StatusOf(err) != http.StatusNotFound {
		t.Errorf("unknown model: %v (status %d), want 404", err, enginesim.StatusOf(err))
	}
	if _, err := f.Prepare("/v1/chat/completions", []byte(`{"model":`)); enginesim.StatusOf(err) != http.StatusBadRequest {
		t.Errorf("bad JSON: %v, want 400", err)
	}
}
