package enginesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/kvroute/kvroute/test/enginesim/chat"
)

// decodeBody reads a JSON object body into v (unknown fields are ignored,
// as vLLM's request models allow them).
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body exceeds %d bytes", maxBody)}
		}
		return badRequest("reading the request body: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("Invalid JSON in request body: %v", err)
	}
	return nil
}

// identity is what a request's model name resolves to.
type identity struct {
	model  string // the name to report
	lora   string
	loraID int
}

// resolveModel maps a request's model name to the base model or a LoRA
// adapter; an empty name means the first served name.
func (e *Engine) resolveModel(name string) (identity, error) {
	served := e.cfg.servedNames()
	if name == "" {
		return identity{model: served[0]}, nil
	}
	for _, n := range served {
		if n == name {
			return identity{model: n}, nil
		}
	}
	for i, m := range e.cfg.LoRAModules {
		if m.Name == name {
			return identity{model: name, lora: name, loraID: i + 1}, nil
		}
	}
	return identity{}, &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", name), param: "model"}
}

// generateBody is a generate request's body (chat, completions,
// Responses): what every kind names, its model and its cache_salt, and its
// kv_transfer_params.
type generateBody interface {
	modelAndSalt() (model string, salt *string)
	transferParams() json.RawMessage
}

func (c *chatRequest) modelAndSalt() (string, *string)       { return c.Model, c.CacheSalt }
func (c *completionRequest) modelAndSalt() (string, *string) { return c.Model, c.CacheSalt }
func (c *responsesRequest) modelAndSalt() (string, *string)  { return c.Model, c.CacheSalt }

func (c *chatRequest) transferParams() json.RawMessage       { return c.KVTransferParams }
func (c *completionRequest) transferParams() json.RawMessage { return c.KVTransferParams }
func (c *responsesRequest) transferParams() json.RawMessage  { return c.KVTransferParams }

// decodeGenerate decodes a generate body into req and runs the checks
// every kind runs first, in vLLM's order: the body, its cache_salt (a
// validator run before the fields'), its kv_transfer_params' type, then
// its model.
func (e *Engine) decodeGenerate(w http.ResponseWriter, r *http.Request, req generateBody) (identity, error) {
	if err := decodeBody(w, r, req); err != nil {
		return identity{}, err
	}
	model, salt := req.modelAndSalt()
	if err := checkSalt(salt); err != nil {
		return identity{}, err
	}
	if err := checkKVTransferParams(req.transferParams()); err != nil {
		return identity{}, err
	}
	return e.resolveModel(model)
}

func checkSalt(salt *string) error {
	if salt != nil && *salt == "" {
		return &apiError{status: http.StatusBadRequest, msg: "Parameter 'cache_salt' must be a non-empty string if provided.", param: "cache_salt"}
	}
	return nil
}

func saltOf(salt *string) string {
	if salt == nil {
		return ""
	}
	return *salt
}

func checkN(n *int) error {
	if n != nil && *n != 1 {
		return badRequest("n=%d is not supported by the simulated engine (only n=1).", *n)
	}
	return nil
}

// checkLength enforces max_model_len and returns the output budget:
// maxTokens when set, else what the context leaves (or def when def > 0).
func (e *Engine) checkLength(promptLen int, maxTokens *int, def int) (int, error) {
	limit := e.cfg.MaxModelLen
	if promptLen > limit {
		return 0, badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, promptLen)
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return 0, badRequest("max_tokens must be at least 1, got %d.", *maxTokens)
		}
		if *maxTokens > limit-promptLen {
			return 0, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", limit, promptLen+*maxTokens, promptLen, *maxTokens)
		}
		return *maxTokens, nil
	}
	if def > 0 {
		return min(def, limit-promptLen), nil
	}
	return max(limit-promptLen, 1), nil
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// parsePrompts accepts a string, a list of strings, a list of token ids,
// or a list of lists of token ids: the field (prompt, or a pooling body's
// input) as named in errors.
func parsePrompts(field string, raw json.RawMessage) ([][]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("%s is required", field)
	}
	if ids, ok := tokenIDs(raw); ok { // the common token-id prompt, fast
		return [][]uint32{ids}, checkIDs(ids)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return [][]uint32{chat.Encode(s)}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return nil, badRequest("%s must be a string, a list of strings, a list of token ids or a list of lists of token ids", field)
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		return [][]uint32{ids}, checkIDs(ids)
	}
	if len(items) > maxPrompts {
		return nil, badRequest("%d prompts in one request; at most %d", len(items), maxPrompts)
	}
	var out [][]uint32
	for i, it := range items {
		if err := json.Unmarshal(it, &s); err == nil {
			out = append(out, chat.Encode(s))
			continue
		}
		ids := []uint32(nil) // a fresh slice: Unmarshal reuses a non-nil one
		if err := json.Unmarshal(it, &ids); err != nil {
			return nil, badRequest("%s[%d] must be a string or a list of token ids", field, i)
		}
		if err := checkIDs(ids); err != nil {
			return nil, err
		}
		out = append(out, ids)
	}
	return out, nil
}

// tokenIDs parses a JSON array of plain non-negative integers (no sign,
// fraction, exponent or leading zero) below 2^32; anything else is left to
// encoding/json (ok=false), which also words the errors.
func tokenIDs(raw json.RawMessage) (ids []uint32, ok bool) {
	i := 0
	space := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	space()
	if i == len(raw) || raw[i] != '[' {
		return nil, false
	}
	i++
	space()
	if i < len(raw) && raw[i] == ']' {
		return nil, false // empty: the general path's error
	}
	ids = make([]uint32, 0, len(raw)/4)
	for {
		start, v := i, uint64(0)
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + uint64(raw[i]-'0')
			if v > 1<<32-1 {
				return nil, false
			}
			i++
		}
		if i == start || (raw[start] == '0' && i-start > 1) {
			return nil, false
		}
		ids = append(ids, uint32(v))
		space()
		if i == len(raw) {
			return nil, false
		}
		if raw[i] == ']' {
			i++
			space()
			return ids, i == len(raw)
		}
		if raw[i] != ',' {
			return nil, false
		}
		i++
		space()
	}
}

func checkIDs(ids []uint32) error {
	for _, id := range ids {
		if id >= chat.VocabSize {
			return badRequest("Token id %d is out of vocabulary", id)
		}
	}
	return nil
}
