package enginesim

import (
	"encoding/json"
	"net/http"
	"time"
)

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	MaxTokens     *int            `json:"max_tokens"`
	N             *int            `json:"n"`
	CacheSalt     *string         `json:"cache_salt"`
	IgnoreEOS     bool            `json:"ignore_eos"`
	Echo          bool            `json:"echo"`
	// KVTransferParams is kv_transfer_params (dict[str, Any] | None).
	Priority         int             `json:"priority"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

func (e *Engine) prepareCompletion(w http.ResponseWriter, r *http.Request, req *completionRequest) (identity, [][]uint32, []int, error) {
	id, err := e.decodeGenerate(w, r, req)
	if err != nil {
		return id, nil, nil, err
	}
	if err := checkN(req.N); err != nil {
		return id, nil, nil, err
	}
	prompts, err := parsePrompts("prompt", req.Prompt)
	if err != nil {
		return id, nil, nil, err
	}
	budgets := make([]int, len(prompts))
	for i, p := range prompts {
		// vLLM's completions default max_tokens is 16.
		if budgets[i], err = e.checkLength(len(p), req.MaxTokens, 16); err != nil {
			return id, nil, nil, err
		}
	}
	return id, prompts, budgets, nil
}

// completionsGen is /v1/completions: one or more prompts, each a choice.
type completionsGen struct {
	e       *Engine
	req     completionRequest
	id      identity
	prompt  int // prompt tokens, every prompt's
	rid     string
	created int64
}

func (c *completionsGen) prepare(w http.ResponseWriter, r *http.Request) (generation, error) {
	id, prompts, budgets, err := c.e.prepareCompletion(w, r, &c.req)
	c.id = id
	for _, p := range prompts {
		c.prompt += len(p)
	}
	return generation{id: id, salt: saltOf(c.req.CacheSalt), prompts: prompts, budgets: budgets,
		ignoreEOS: c.req.IgnoreEOS, stream: c.req.Stream, kvParams: c.req.KVTransferParams, priority: c.req.Priority}, err
}

func (c *completionsGen) begin() {
	c.rid = c.e.newID("cmpl-")
	c.created = time.Now().Unix()
}

// totals are the generated tokens of every prompt and the cached tokens
// vLLM reports: the last prompt's num_cached_tokens.
func totals(outs []output) (gen, cached int) {
	for _, o := range outs {
		gen += len(o.tokens)
	}
	return gen, outs[len(outs)-1].cached
}

func (c *completionsGen) whole(outs []output) any {
	var choices []any
	for i, o := range outs {
		choices = append(choices, map[string]any{"index": i, "text": text(o.tokens), "logprobs": nil,
			"finish_reason": o.finish, "stop_reason": nil, "prompt_logprobs": nil})
	}
	gen, cached := totals(outs)
	return map[string]any{"id": c.rid, "object": "text_completion", "created": c.created,
		"model": c.id.model, "choices": choices, "usage": c.e.usage(c.prompt, gen, cached), "kv_transfer_params": nil}
}

func (c *completionsGen) open(*sse) error { return nil }

func (c *completionsGen) next(s *sse, u update, _ []output) error {
	var t string
	var finish any
	switch {
	case u.hasToken:
		t = text([]uint32{u.token})
	case u.done:
		finish = u.finish
	default:
		return nil
	}
	return s.data(map[string]any{"id": c.rid, "object": "text_completion", "created": c.created, "model": c.id.model,
		"choices": []any{map[string]any{"index": u.index, "text": t, "logprobs": nil, "finish_reason": finish, "stop_reason": nil}}})
}

func (c *completionsGen) close(s *sse, outs []output) {
	if c.req.StreamOptions != nil && c.req.StreamOptions.IncludeUsage {
		gen, cached := totals(outs)
		_ = s.data(map[string]any{"id": c.rid, "object": "text_completion", "created": c.created, "model": c.id.model,
			"choices": []any{}, "usage": c.e.usage(c.prompt, gen, cached)})
	}
	s.done()
}
