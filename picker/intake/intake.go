package intake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/valyala/fastjson"
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
	// RetryAfter, when positive, is sent as the Retry-After header
	// (whole seconds, rounded up).
	RetryAfter time.Duration
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
	// with add_generation_prompt false; Responses: rendered as chat without
	// the generation prompt, so every turn finds the same anchor), to
	// render for the prefix hash; nil when the anchor is the prompt's first
	// tokens (completions, token bodies).
	AnchorBody []byte
	// Anchorable is false when the request has no anchor part at all (a
	// chat without system, developer or user messages).
	Anchorable bool
	// RawAnchor is the anchor as sent, for placing the request when no
	// tokens can be had: the anchor's messages (or input items) with the
	// instructions and tools, or a text prompt's first 4 KiB — never the
	// sampling parameters, so every turn and sibling gives the same bytes.
	RawAnchor []byte
	// Prompts is how many prompts a completions batch holds (0: a single
	// prompt). A batch is routed by its first prompt.
	Prompts int
	// RenderBody, when set, is what to render instead of the body: a
	// text batch's first prompt alone.
	RenderBody []byte
	// IncludeUsage: a streaming request asked for the final usage chunk.
	IncludeUsage bool
	// Unresolved names why the identity cannot be resolved exactly ("" when
	// it can).
	Unresolved string

	pre map[string][]uint32 // token arrays parsed ahead of the body
}

// Detect tells the kind of a decision-API body by its fields: messages →
// chat, input → responses, prompt → completion, token_ids → tokens.
func Detect(body []byte) (Kind, error) {
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil || v.Type() != fastjson.TypeObject {
		return 0, BadRequest("", "", "The body is not a JSON object.")
	}
	return kindOf(v)
}

func kindOf(v *fastjson.Value) (Kind, error) {
	switch {
	case v.Exists("messages"):
		return Chat, nil
	case v.Exists("input"):
		return Responses, nil
	case v.Exists("prompt"):
		return Completion, nil
	case v.Exists("token_ids"):
		return Tokens, nil
	}
	return 0, BadRequest("", "", "The body has none of messages, input, prompt or token_ids.")
}

// present reports a field that is there and not null.
func present(v *fastjson.Value) bool { return v != nil && v.Type() != fastjson.TypeNull }

// Parser parses bodies, reusing its parsers' memory across calls; the
// zero value is ready and safe for concurrent use.
type Parser struct {
	pool fastjson.ParserPool
}

// Parse reads a body of the given kind with a fresh parser.
func Parse(kind Kind, body []byte) (*Request, error) {
	var p Parser
	return p.Parse(kind, body)
}

// Any is the kind of a decision-API body: told by its fields (Detect).
const Any Kind = 0

// Parse reads a body of the given kind (or Any). The body is parsed once, by a
// validating parser that bounds nesting; only the fields routing uses are
// read (the engine validates the rest of what it is forwarded). Nothing in
// the Request refers to the parser's memory.
func (pp *Parser) Parse(kind Kind, body []byte) (*Request, error) {
	return pp.parse(kind, body, true)
}

// parse is Parse, with the token-array fast path or without (tests check
// the two agree).
func (pp *Parser) parse(kind Kind, body []byte, fast bool) (*Request, error) {
	p := pp.pool.Get()
	defer pp.pool.Put(p)
	var pre map[string][]uint32
	if fast {
		body, pre = fastArrays(body, "token_ids", "prompt")
	}
	v, err := p.ParseBytes(body)
	if err != nil || v.Type() != fastjson.TypeObject {
		return nil, BadRequest("", "", "We could not parse the JSON body of your request: it must be a JSON object.")
	}
	if kind == Any {
		if kind, err = kindOf(v); err != nil {
			return nil, err
		}
	}
	model, err := modelOf(v)
	if err != nil {
		return nil, err
	}
	r := &Request{Kind: kind, Model: model, Anchorable: true, pre: pre}
	if st := v.Get("stream"); present(st) {
		if r.Stream, err = st.Bool(); err != nil {
			return nil, BadRequest("stream", "", "stream must be a boolean")
		}
	}
	r.IncludeUsage = r.Stream && v.GetBool("stream_options", "include_usage")
	if salt := v.Get("cache_salt"); present(salt) {
		b, err := salt.StringBytes()
		if err != nil || len(b) == 0 {
			return nil, BadRequest("cache_salt", "", "Parameter 'cache_salt' must be a non-empty string if provided.")
		}
		r.CacheSalt = string(b)
	}
	switch kind {
	case Chat:
		return r, r.parseChat(v)
	case Completion:
		return r, r.parseCompletion(v)
	case Responses:
		return r, r.parseResponses(v)
	case Tokens:
		return r, r.parseTokens(v)
	}
	return nil, BadRequest("", "", "unknown request kind")
}

// modelOf reads a body's model: a non-empty string.
func modelOf(v *fastjson.Value) (string, error) {
	model := v.Get("model")
	if model == nil || model.Type() != fastjson.TypeString || len(model.GetStringBytes()) == 0 {
		return "", BadRequest("model", "", "you must provide a model parameter")
	}
	return string(model.GetStringBytes()), nil
}

// Model reads the model of a body the picker forwards without routing on
// its content (pooling, tokenize): a JSON object naming a model.
func (pp *Parser) Model(body []byte) (string, error) {
	p := pp.pool.Get()
	defer pp.pool.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil || v.Type() != fastjson.TypeObject {
		return "", BadRequest("", "", "We could not parse the JSON body of your request: it must be a JSON object.")
	}
	return modelOf(v)
}

// ids reads an array of token ids (integers below 2^32); ok is false for
// anything else.
func ids(v *fastjson.Value) ([]uint32, bool) {
	if v == nil {
		return nil, false
	}
	items, err := v.Array()
	if err != nil {
		return nil, false
	}
	out := make([]uint32, len(items))
	for i, it := range items {
		if it.Type() != fastjson.TypeNumber {
			return nil, false
		}
		n, err := it.Uint64()
		if err != nil || n > 1<<32-1 {
			return nil, false
		}
		out[i] = uint32(n)
	}
	return out, true
}

func role(v *fastjson.Value) (string, bool) {
	if v.Type() != fastjson.TypeObject {
		return "", false
	}
	return string(v.GetStringBytes("role")), true
}

func (r *Request) parseChat(v *fastjson.Value) error {
	msgs := v.GetArray("messages")
	if len(msgs) == 0 {
		return BadRequest("messages", "", "messages must be a non-empty array of chat messages")
	}
	cut := anchorCut(len(msgs), func(i int) (string, bool) { return role(msgs[i]) })
	if cut < 0 {
		return BadRequest("messages", "", "every message must be an object with a role")
	}
	if cut == 0 {
		r.Anchorable = false
		return nil
	}
	var a fastjson.Arena
	r.RawAnchor = rawAnchor(v, "messages", msgs[:cut], "tools")
	r.AnchorBody = rebuild(v, map[string]*fastjson.Value{
		"messages":               truncated(&a, msgs[:cut]),
		"add_generation_prompt":  a.NewFalse(),
		"continue_final_message": a.NewFalse(),
		"stream":                 a.NewFalse(),
	}, "stream_options")
	return nil
}

// rawAnchor writes the anchor's parts: the named fields of v as sent, then
// the anchor items.
func rawAnchor(v *fastjson.Value, itemsName string, items []*fastjson.Value, fields ...string) []byte {
	var out []byte
	for _, f := range fields {
		if fv := v.Get(f); fv != nil {
			out = appendString(out, f)
			out = fv.MarshalTo(append(out, ':'))
		}
	}
	out = appendString(out, itemsName)
	out = append(out, ':')
	for _, it := range items {
		out = it.MarshalTo(out)
	}
	return out
}

// truncated is a new array of the given items.
func truncated(a *fastjson.Arena, items []*fastjson.Value) *fastjson.Value {
	arr := a.NewArray()
	for i, it := range items {
		arr.SetArrayItem(i, it)
	}
	return arr
}

// rebuild writes object v with some fields replaced (or added) and others
// dropped. v itself is not modified.
func rebuild(v *fastjson.Value, set map[string]*fastjson.Value, drop ...string) []byte {
	out := []byte{'{'}
	done := map[string]bool{}
	v.GetObject().Visit(func(key []byte, val *fastjson.Value) {
		k := string(key)
		if slices.Contains(drop, k) || done[k] {
			return
		}
		if nv, ok := set[k]; ok {
			val, done[k] = nv, true
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = appendString(out, k)
		out = append(out, ':')
		out = val.MarshalTo(out)
	})
	keys := make([]string, 0, len(set))
	for k := range set {
		if !done[k] {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = appendString(out, k)
		out = append(out, ':')
		out = set[k].MarshalTo(out)
	}
	return append(out, '}')
}

// appendString appends s as a JSON string.
func appendString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
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

func (r *Request) parseCompletion(v *fastjson.Value) error {
	prompt := v.Get("prompt")
	if !present(prompt) {
		return BadRequest("prompt", "", "prompt is required")
	}
	if prompt.Type() == fastjson.TypeString {
		text := prompt.GetStringBytes()
		r.RawAnchor = append([]byte(nil), text[:min(len(text), 4096)]...)
		return nil // rendered by the engine
	}
	if got := r.pre["prompt"]; got != nil {
		r.TokenIDs = got
		return nil
	}
	if got, ok := ids(prompt); ok && len(got) > 0 {
		r.TokenIDs = got
		return nil
	}
	many, err := prompt.Array()
	if err != nil || len(many) == 0 {
		return BadRequest("prompt", "", "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids")
	}
	// A batch: the engine serves all its prompts, so it goes to one
	// endpoint, routed by its first prompt's keys (its tokens rendered
	// alone, or its ids). The prompts are all texts or all token lists, as
	// vLLM requires.
	text := many[0].Type() == fastjson.TypeString
	for i, p := range many {
		_, isIDs := ids(p)
		if (p.Type() == fastjson.TypeString) != text || (!text && !isIDs) {
			form := "list of token ids"
			if text {
				form = "string"
			}
			return BadRequest("prompt", "", "prompt[%d] must be a %s like prompt[0]: a batch is a list of strings or a list of lists of token ids", i, form)
		}
	}
	r.Prompts = len(many)
	if text {
		first := many[0].GetStringBytes()
		r.RawAnchor = append([]byte(nil), first[:min(len(first), 4096)]...)
		var a fastjson.Arena
		r.RenderBody = rebuild(v, map[string]*fastjson.Value{"prompt": a.NewStringBytes(first)})
		return nil
	}
	r.TokenIDs, _ = ids(many[0])
	return nil
}

func (r *Request) parseResponses(v *fastjson.Value) error {
	if prev := v.Get("previous_response_id"); present(prev) && !(prev.Type() == fastjson.TypeString && len(prev.GetStringBytes()) == 0) {
		return BadRequest("previous_response_id", "unresolved_previous_response",
			"previous_response_id cannot be routed: the conversation it names lives in a Responses server's store. "+
				"Rehydrate the conversation (send the full input) before routing.")
	}
	input := v.Get("input")
	if !present(input) {
		return BadRequest("input", "", "input is required")
	}
	var a fastjson.Arena
	if input.Type() == fastjson.TypeString {
		// The whole input is the first user message.
		r.RawAnchor = rawAnchor(v, "input", []*fastjson.Value{input}, "instructions", "tools")
		r.AnchorBody = rebuild(v, map[string]*fastjson.Value{"stream": a.NewFalse()}, "stream_options")
		return nil
	}
	items, err := input.Array()
	if err != nil || len(items) == 0 {
		return BadRequest("input", "", "input must be a string or a non-empty array of input items")
	}
	cut := anchorCut(len(items), func(i int) (string, bool) {
		if items[i].Type() != fastjson.TypeObject {
			return "", false
		}
		if t := string(items[i].GetStringBytes("type")); t != "" && t != "message" {
			return "", true // a tool call or output: not a message
		}
		return role(items[i])
	})
	if cut < 0 {
		return BadRequest("input", "", "every input item must be an object")
	}
	if cut == 0 {
		// No message to anchor on: the instructions and tools alone, or
		// nothing.
		if r.Anchorable = present(v.Get("instructions")); r.Anchorable {
			r.RawAnchor = rawAnchor(v, "input", nil, "instructions", "tools")
			r.AnchorBody = rebuild(v, map[string]*fastjson.Value{"input": a.NewArray(), "stream": a.NewFalse()}, "stream_options")
		}
		return nil
	}
	r.RawAnchor = rawAnchor(v, "input", items[:cut], "instructions", "tools")
	r.AnchorBody = rebuild(v, map[string]*fastjson.Value{"input": truncated(&a, items[:cut]), "stream": a.NewFalse()}, "stream_options")
	return nil
}

func (r *Request) parseTokens(v *fastjson.Value) error {
	got, ok := r.pre["token_ids"], r.pre["token_ids"] != nil
	if !ok {
		got, ok = ids(v.Get("token_ids"))
	}
	if !ok || len(got) == 0 {
		return BadRequest("token_ids", "", "token_ids must be a non-empty array of token ids")
	}
	r.TokenIDs = got
	if l := v.Get("lora"); present(l) {
		b, err := l.StringBytes()
		if err != nil {
			return BadRequest("lora", "", "lora must be the name of a LoRA adapter")
		}
		r.LoRA = string(b)
	}
	return nil
}
