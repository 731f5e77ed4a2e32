package enginesim

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

type chatRequest struct {
	Model                string          `json:"model"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	N                    *int            `json:"n"`
	CacheSalt            *string         `json:"cache_salt"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	IgnoreEOS            bool            `json:"ignore_eos"`
	RequestID            string          `json:"request_id"`
	KVTransferParams     json.RawMessage `json:"kv_transfer_params"`
	Priority             int             `json:"priority"`
}

// renderChat turns a chat body into tokens, with vLLM's checks.
func (e *Engine) renderChat(req *chatRequest) ([]uint32, error) {
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	if addGen && req.ContinueFinalMessage {
		return nil, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	msgs, err := chat.ParseChatMessages(req.Messages)
	if err != nil {
		return nil, asBadRequest(err)
	}
	tools, err := chat.ParseChatTools(req.Tools)
	if err != nil {
		return nil, asBadRequest(err)
	}
	toks, err := chat.Render(msgs, tools, chat.RenderOptions{AddGenerationPrompt: addGen, ContinueFinalMessage: req.ContinueFinalMessage,
		Variant: e.cfg.Sim.ChatTemplate})
	if err != nil {
		return nil, asBadRequest(err)
	}
	return toks, nil
}

// prepareChat decodes and checks a chat body, renders it and sizes its
// output budget, with vLLM's checks in vLLM's order.
func (e *Engine) prepareChat(w http.ResponseWriter, r *http.Request, req *chatRequest) (identity, []uint32, int, error) {
	id, err := e.decodeGenerate(w, r, req)
	if err != nil {
		return id, nil, 0, err
	}
	if err := checkN(req.N); err != nil {
		return id, nil, 0, err
	}
	toks, err := e.renderChat(req)
	if err != nil {
		return id, nil, 0, err
	}
	maxTok := req.MaxCompletionTokens
	if maxTok == nil {
		maxTok = req.MaxTokens
	}
	budget, err := e.checkLength(len(toks), maxTok, 0)
	return id, toks, budget, err
}

// chatGen is /v1/chat/completions.
type chatGen struct {
	e       *Engine
	req     chatRequest
	id      identity
	prompt  int // prompt tokens
	rid     string
	created int64
}

func (c *chatGen) prepare(w http.ResponseWriter, r *http.Request) (generation, error) {
	id, toks, budget, err := c.e.prepareChat(w, r, &c.req)
	c.id, c.prompt = id, len(toks)
	return generation{id: id, salt: saltOf(c.req.CacheSalt), prompts: [][]uint32{toks}, budgets: []int{budget},
		ignoreEOS: c.req.IgnoreEOS, stream: c.req.Stream, kvParams: c.req.KVTransferParams, priority: c.req.Priority}, err
}

func (c *chatGen) begin() {
	c.rid = c.e.newID("chatcmpl-")
	c.created = time.Now().Unix()
}

func (c *chatGen) whole(outs []output) any {
	o := outs[0]
	return map[string]any{
		"id": c.rid, "object": "chat.completion", "created": c.created, "model": c.id.model,
		"choices": []any{map[string]any{
			"index":         0,
			"message":       map[string]any{"role": "assistant", "content": text(o.tokens), "tool_calls": []any{}},
			"logprobs":      nil,
			"finish_reason": o.finish,
			"stop_reason":   nil,
		}},
		"usage":              c.e.usage(c.prompt, len(o.tokens), o.cached),
		"prompt_logprobs":    nil,
		"kv_transfer_params": nil,
		"service_tier":       nil,
		"system_fingerprint": nil,
	}
}

func (c *chatGen) open(*sse) error { return nil }

func (c *chatGen) chunk(delta map[string]any, finish any) map[string]any {
	return map[string]any{"id": c.rid, "object": "chat.completion.chunk", "created": c.created, "model": c.id.model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}}
}

func (c *chatGen) next(s *sse, u update, _ []output) error {
	if u.first {
		// vLLM sends the role chunk with the request's first output,
		// after its prefill (an error before it is the first event).
		if err := s.data(c.chunk(map[string]any{"role": "assistant", "content": ""}, nil)); err != nil {
			return err
		}
	}
	if u.hasToken {
		return s.data(c.chunk(map[string]any{"content": text([]uint32{u.token})}, nil))
	}
	if u.done {
		return s.data(c.chunk(map[string]any{}, u.finish))
	}
	return nil
}

func (c *chatGen) close(s *sse, outs []output) {
	if c.req.StreamOptions != nil && c.req.StreamOptions.IncludeUsage {
		_ = s.data(map[string]any{"id": c.rid, "object": "chat.completion.chunk", "created": c.created, "model": c.id.model,
			"choices": []any{}, "usage": c.e.usage(c.prompt, len(outs[0].tokens), outs[0].cached)})
	}
	s.done()
}
