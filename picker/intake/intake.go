package intake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// Kind is a body's API.
type Kind int

// The kinds.
const (
	Chat       Kind = iota + 1 // /v1/chat/completions
	Completion                 // /v1/completions
	Responses                  // /v1/responses
	Tokens                     // the decision API's {model, token_ids, cache_salt, lora}
)

func (k Kind) String() string {
	switch k {
	case Chat:
		return "chat"
	case Completion:
		return "completion"
	case Responses:
		return "responses"
	case Tokens:
		return "tokens"
	}
	return "unknown"
}

// Error is a refusal in OpenAI's error format.
type Error struct {
	Status  int
	Type    string // "invalid_request_error", …
	Code    string // optional machine-readable code
	Param   string // optional offending field
	Message string
}

func (e *Error) Error() string { return e.Message }

// Body is the JSON error body: {"error": {message, type, param, code}}.
func (e *Error) Body() []byte {
	opt := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": e.Message, "type": e.Type, "param": opt(e.Param), "code": opt(e.Code)}})
	return b
}

// BadRequest is a 400 invalid_request_error.
func BadRequest(param, code, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Unresolved reasons (metric labels).
const (
	UnresolvedMultiplePrompts = "multiple_prompts" // a completion request with several prompts
)

// Request is what routing needs of a body.
type Request struct {
	Kind      Kind
	Model     string // as the caller named it: a served model or a LoRA adapter
	LoRA      string // Tokens bodies only: the adapter named apart from the model
	Stream    bool
	CacheSalt string // "" for none
	// TokenIDs is the prompt when the caller sent token ids (Tokens bodies,
	// completion prompts); nil when it must be rendered.
	TokenIDs []uint32
	// AnchorBody is the request cut after its first user message (chat:
	// with add_generation_prompt false), to render for the prefix hash;
	// nil when the anchor is the prompt's first tokens (completions, token
	// bodies) or the whole prompt (a Responses string input).
	AnchorBody []byte
	// Anchorable is false when the request has no anchor part at all (a
	// chat without system, developer or user messages).
	Anchorable bool
	// IncludeUsage: a streaming request asked for the final usage chunk.
	IncludeUsage bool
	// Unresolved names why the identity cannot be resolved exactly ("" when
	// it can).
	Unresolved string
}

// Detect tells the kind of a decision-API body by its fields: messages →
// chat, input → responses, prompt → completion, token_ids → tokens.
func Detect(body []byte) (Kind, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(body, &probe); err != nil {
		return 0, BadRequest("", "", "The body is not a JSON object: %v", err)
	}
	switch {
	case probe["messages"] != nil:
		return Chat, nil
	case probe["input"] != nil:
		return Responses, nil
	case probe["prompt"] != nil:
		return Completion, nil
	case probe["token_ids"] != nil:
		return Tokens, nil
	}
	return 0, BadRequest("", "", "The body has none of messages, input, prompt or token_ids.")
}

// common is what every body may carry.
type common struct {
	Model         *string         `json:"model"`
	Stream        bool            `json:"stream"`
	CacheSalt     json.RawMessage `json:"cache_salt"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// Parse reads a body of the given kind.
func Parse(kind Kind, body []byte) (*Request, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return nil, BadRequest("", "", "We could not parse the JSON body of your request: it must be a JSON object.")
	}
	var c common
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, BadRequest("", "", "Invalid request body: %v", err)
	}
	if c.Model == nil || *c.Model == "" {
		return nil, BadRequest("model", "", "you must provide a model parameter")
	}
	r := &Request{Kind: kind, Model: *c.Model, Stream: c.Stream, Anchorable: true}
	r.IncludeUsage = c.Stream && c.StreamOptions != nil && c.StreamOptions.IncludeUsage
	if c.CacheSalt != nil && string(c.CacheSalt) != "null" {
		var salt string
		if err := json.Unmarshal(c.CacheSalt, &salt); err != nil || salt == "" {
			return nil, BadRequest("cache_salt", "", "Parameter 'cache_salt' must be a non-empty string if provided.")
		}
		r.CacheSalt = salt
	}
	switch kind {
	case Chat:
		return r, r.parseChat(fields)
	case Completion:
		return r, r.parseCompletion(fields)
	case Responses:
		return r, r.parseResponses(fields)
	case Tokens:
		return r, r.parseTokens(fields)
	}
	return nil, BadRequest("", "", "unknown request kind")
}

type message struct {
	Role string `json:"role"`
}

func (r *Request) parseChat(fields map[string]json.RawMessage) error {
	var msgs []json.RawMessage
	if err := json.Unmarshal(fields["messages"], &msgs); err != nil || len(msgs) == 0 {
		return BadRequest("messages", "", "messages must be a non-empty array of chat messages")
	}
	cut := anchorCut(len(msgs), func(i int) (string, bool) {
		var m message
		if json.Unmarshal(msgs[i], &m) != nil {
			return "", false
		}
		return m.Role, true
	})
	if cut < 0 {
		return BadRequest("messages", "", "every message must be an object with a role")
	}
	if cut == 0 {
		r.Anchorable = false
		return nil
	}
	anchor := make(map[string]json.RawMessage, len(fields))
	for k, v := range fields {
		anchor[k] = v
	}
	anchor["messages"], _ = json.Marshal(msgs[:cut])
	anchor["add_generation_prompt"] = json.RawMessage("false")
	anchor["continue_final_message"] = json.RawMessage("false")
	anchor["stream"] = json.RawMessage("false")
	delete(anchor, "stream_options")
	r.AnchorBody, _ = json.Marshal(anchor)
	return nil
}

// anchorCut returns how many leading messages (or input items) form the
// anchor: through the first user message; without one, the leading
// system and developer messages. -1 when an item is malformed. role
// returns an item's role ("" for items that are not messages).
func anchorCut(n int, role func(int) (string, bool)) int {
	leading := 0
	for i := 0; i < n; i++ {
		r, ok := role(i)
		if !ok {
			return -1
		}
		switch r {
		case "user":
			return i + 1
		case "system", "developer":
			if leading == i {
				leading = i + 1
			}
		}
	}
	return leading
}

func (r *Request) parseCompletion(fields map[string]json.RawMessage) error {
	raw := fields["prompt"]
	if raw == nil || string(raw) == "null" {
		return BadRequest("prompt", "", "prompt is required")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return nil // rendered by the engine
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		r.TokenIDs = ids
		return nil
	}
	var many []json.RawMessage
	if err := json.Unmarshal(raw, &many); err != nil || len(many) == 0 {
		return BadRequest("prompt", "", "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids")
	}
	for i, p := range many {
		var s string
		var ids []uint32
		if json.Unmarshal(p, &s) != nil && json.Unmarshal(p, &ids) != nil {
			return BadRequest("prompt", "", "prompt[%d] must be a string or a list of token ids", i)
		}
	}
	if len(many) > 1 {
		r.Unresolved = UnresolvedMultiplePrompts
		return nil
	}
	var one []uint32
	if json.Unmarshal(many[0], &one) == nil {
		r.TokenIDs = one
	}
	return nil
}

type inputItem struct {
	Type string `json:"type"`
	Role string `json:"role"`
}

func (r *Request) parseResponses(fields map[string]json.RawMessage) error {
	if prev := fields["previous_response_id"]; prev != nil && string(prev) != "null" && string(prev) != `""` {
		return BadRequest("previous_response_id", "unresolved_previous_response",
			"previous_response_id cannot be routed: the conversation it names lives in a Responses server's store. "+
				"Rehydrate the conversation (send the full input) before routing.")
	}
	raw := fields["input"]
	if raw == nil || string(raw) == "null" {
		return BadRequest("input", "", "input is required")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return nil // the whole input is the first user message: the anchor is the prompt
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || len(items) == 0 {
		return BadRequest("input", "", "input must be a string or a non-empty array of input items")
	}
	cut := anchorCut(len(items), func(i int) (string, bool) {
		var it inputItem
		if json.Unmarshal(items[i], &it) != nil {
			return "", false
		}
		if it.Type != "" && it.Type != "message" {
			return "", true // a tool call or output: not a message
		}
		return it.Role, true
	})
	if cut < 0 {
		return BadRequest("input", "", "every input item must be an object")
	}
	if cut == 0 {
		// No message to anchor on: the instructions alone, rendered with
		// the whole request, or nothing.
		_, r.Anchorable = fields["instructions"]
		return nil
	}
	if cut == len(items) {
		return nil // the anchor is the whole request
	}
	anchor := make(map[string]json.RawMessage, len(fields))
	for k, v := range fields {
		anchor[k] = v
	}
	anchor["input"], _ = json.Marshal(items[:cut])
	anchor["stream"] = json.RawMessage("false")
	r.AnchorBody, _ = json.Marshal(anchor)
	return nil
}

func (r *Request) parseTokens(fields map[string]json.RawMessage) error {
	var ids []uint32
	if err := json.Unmarshal(fields["token_ids"], &ids); err != nil || len(ids) == 0 {
		return BadRequest("token_ids", "", "token_ids must be a non-empty array of token ids")
	}
	r.TokenIDs = ids
	if l := fields["lora"]; l != nil && !bytes.Equal(l, []byte("null")) {
		if err := json.Unmarshal(l, &r.LoRA); err != nil {
			return BadRequest("lora", "", "lora must be the name of a LoRA adapter")
		}
	}
	return nil
}
