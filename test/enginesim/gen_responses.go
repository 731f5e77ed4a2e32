package enginesim

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	Tools              json.RawMessage `json:"tools"`
	Stream             bool            `json:"stream"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	PreviousResponseID *string         `json:"previous_response_id"`
	CacheSalt          *string         `json:"cache_salt"`
	IgnoreEOS          bool            `json:"ignore_eos"`
	// KVTransferParams is kv_transfer_params, which current vLLM takes on
	Priority int `json:"priority"`
	// Responses too.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

func (e *Engine) renderResponses(req *responsesRequest) ([]uint32, error) {
	if req.PreviousResponseID != nil && *req.PreviousResponseID != "" {
		return nil, &apiError{status: http.StatusBadRequest, param: "previous_response_id",
			msg: "previous_response_id is not supported: this engine is stateless; send the full conversation in input"}
	}
	if len(req.Input) == 0 || string(req.Input) == "null" {
		return nil, &apiError{status: http.StatusBadRequest, param: "input", msg: "input is required"}
	}
	instr := ""
	if req.Instructions != nil {
		instr = *req.Instructions
	}
	msgs, tools, err := chat.ParseResponsesInput(instr, req.Input, req.Tools)
	if err != nil {
		return nil, asBadRequest(err)
	}
	toks, err := chat.Render(msgs, tools, chat.RenderOptions{AddGenerationPrompt: true, Variant: e.cfg.Sim.ChatTemplate})
	if err != nil {
		return nil, asBadRequest(err)
	}
	return toks, nil
}

// prepareResponses decodes and checks a Responses body, renders it and
// sizes its output budget.
func (e *Engine) prepareResponses(w http.ResponseWriter, r *http.Request, req *responsesRequest) (identity, []uint32, int, error) {
	id, err := e.decodeGenerate(w, r, req)
	if err != nil {
		return id, nil, 0, err
	}
	toks, err := e.renderResponses(req)
	if err != nil {
		return id, nil, 0, err
	}
	budget, err := e.checkLength(len(toks), req.MaxOutputTokens, 0)
	return id, toks, budget, err
}

// responsesGen is /v1/responses (stateless): one message of output text.
type responsesGen struct {
	e      *Engine
	req    responsesRequest
	id     identity
	prompt int // input tokens
	respID string
	msgID  string
	seq    int // a stream's sequence_number
	// created is the response's creation time.
	created int64
}

func (c *responsesGen) prepare(w http.ResponseWriter, r *http.Request) (generation, error) {
	id, toks, budget, err := c.e.prepareResponses(w, r, &c.req)
	c.id, c.prompt = id, len(toks)
	return generation{id: id, salt: saltOf(c.req.CacheSalt), prompts: [][]uint32{toks}, budgets: []int{budget},
		ignoreEOS: c.req.IgnoreEOS, stream: c.req.Stream, kvParams: c.req.KVTransferParams, priority: c.req.Priority}, err
}

func (c *responsesGen) begin() {
	c.respID, c.msgID = c.e.newID("resp_"), c.e.newID("msg_")
	c.created = time.Now().Unix()
}

func (c *responsesGen) response(status string, output []any, usage any) map[string]any {
	var instr any
	if c.req.Instructions != nil {
		instr = *c.req.Instructions
	}
	return map[string]any{"id": c.respID, "object": "response", "created_at": c.created, "model": c.id.model,
		"status": status, "output": output, "usage": usage, "instructions": instr, "error": nil,
		"incomplete_details": nil, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{},
		"temperature": 1.0, "top_p": 1.0, "metadata": map[string]any{}, "text": map[string]any{"format": map[string]any{"type": "text"}}}
}

func (c *responsesGen) message(status, t string) map[string]any {
	content := []any{}
	if status == "completed" {
		content = []any{map[string]any{"type": "output_text", "text": t, "annotations": []any{}, "logprobs": []any{}}}
	}
	return map[string]any{"id": c.msgID, "type": "message", "role": "assistant", "status": status, "content": content}
}

func (c *responsesGen) usage(out, cached int) map[string]any {
	if !c.e.cfg.EnablePromptTokensDetails {
		cached = 0
	}
	return map[string]any{"input_tokens": c.prompt, "input_tokens_details": map[string]any{"cached_tokens": cached},
		"output_tokens": out, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": c.prompt + out}
}

func (c *responsesGen) whole(outs []output) any {
	o := outs[0]
	return c.response("completed", []any{c.message("completed", text(o.tokens))}, c.usage(len(o.tokens), o.cached))
}

// event writes one stream event with its type and sequence number.
func (c *responsesGen) event(s *sse, typ string, fields map[string]any) error {
	fields["type"], fields["sequence_number"] = typ, c.seq
	c.seq++
	return s.event(typ, fields)
}

func (c *responsesGen) open(s *sse) error {
	for _, ev := range []struct {
		typ    string
		fields map[string]any
	}{
		{"response.created", map[string]any{"response": c.response("in_progress", []any{}, nil)}},
		{"response.in_progress", map[string]any{"response": c.response("in_progress", []any{}, nil)}},
		{"response.output_item.added", map[string]any{"output_index": 0, "item": c.message("in_progress", "")}},
		{"response.content_part.added", map[string]any{"item_id": c.msgID, "output_index": 0, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}}},
	} {
		if err := c.event(s, ev.typ, ev.fields); err != nil {
			return err
		}
	}
	return nil
}

func (c *responsesGen) next(s *sse, u update, _ []output) error {
	if !u.hasToken {
		return nil
	}
	return c.event(s, "response.output_text.delta", map[string]any{"item_id": c.msgID, "output_index": 0, "content_index": 0,
		"delta": text([]uint32{u.token}), "logprobs": []any{}})
}

func (c *responsesGen) close(s *sse, outs []output) {
	o := outs[0]
	full := text(o.tokens)
	part := map[string]any{"type": "output_text", "text": full, "annotations": []any{}, "logprobs": []any{}}
	_ = c.event(s, "response.output_text.done", map[string]any{"item_id": c.msgID, "output_index": 0, "content_index": 0, "text": full, "logprobs": []any{}})
	_ = c.event(s, "response.content_part.done", map[string]any{"item_id": c.msgID, "output_index": 0, "content_index": 0, "part": part})
	_ = c.event(s, "response.output_item.done", map[string]any{"output_index": 0, "item": c.message("completed", full)})
	_ = c.event(s, "response.completed", map[string]any{"response": c.response("completed", []any{c.message("completed", full)}, c.usage(len(o.tokens), o.cached))})
}
