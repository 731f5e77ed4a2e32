package chat

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ToolCall is a function call made by the assistant.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string // the JSON string as sent
}

// Message is one chat message.
type Message struct {
	Role       string     // system, developer, user, assistant or tool
	Content    string     // text parts concatenated in order, no separator
	ToolCalls  []ToolCall // assistant only
	ToolCallID string     // tool only
	Name       string     // optional
	// Reasoning is an assistant message's reasoning, as vLLM passes it to
	// the template (from a Responses reasoning item). The template does not
	// render it: like Qwen2.5's, and unlike Qwen3's (which renders it only
	// after the last user turn), so it shapes turns, not tokens.
	Reasoning string
}

// Tool is a function tool offered to the model.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage // verbatim JSON schema; nil if absent
}

func isChatRole(role string) bool {
	switch role {
	case "system", "developer", "user", "assistant", "tool":
		return true
	}
	return false
}

// ParseChatMessages parses the "messages" array of /v1/chat/completions (and
// of the chat form of /tokenize).
//
// Content is a string, null (assistant messages only, typically with
// tool_calls), or an array of parts; the "text" of parts of type "text" are
// concatenated in order. Any other part type ("image_url", "input_audio",
// "video_url", "file", ...) gives an *UnsupportedError. tool_calls (assistant
// only) are [{"id","type":"function","function":{"name","arguments"}}].
// Roles other than system, developer, user, assistant and tool, an empty
// array and malformed JSON are errors naming the offending field.
func ParseChatMessages(raw json.RawMessage) ([]Message, error) {
	const path = "messages"
	if err := checkJSON(raw, path); err != nil {
		return nil, err
	}
	items, err := decodeArray(raw, path)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%s: must contain at least one message", path)
	}
	msgs := make([]Message, 0, len(items))
	for i, item := range items {
		m, err := parseChatMessage(item, fmt.Sprintf("%s[%d]", path, i))
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

func parseChatMessage(raw json.RawMessage, path string) (Message, error) {
	var m Message
	o, err := decodeObject(raw, path)
	if err != nil {
		return m, err
	}
	if m.Role, err = o.reqStr("role", path); err != nil {
		return m, err
	}
	if !isChatRole(m.Role) {
		return m, fmt.Errorf("%s.role: unknown role %q (expected one of system, developer, user, assistant, tool)", path, m.Role)
	}
	if m.Name, err = o.str("name", path); err != nil {
		return m, err
	}

	craw, ok := o["content"]
	switch {
	case (!ok || isNull(craw)) && m.Role == "assistant":
		// No content: allowed for assistant messages (typically with tool_calls).
	case !ok:
		return m, fmt.Errorf("%s.content: field required", path)
	case kind(craw) == '"':
		if m.Content, err = decodeString(craw, path+".content"); err != nil {
			return m, err
		}
	case kind(craw) == '[':
		if m.Content, err = chatContentParts(craw, path+".content"); err != nil {
			return m, err
		}
	default:
		return m, fmt.Errorf("%s.content: must be a string or an array of content parts", path)
	}

	if traw, ok := o["tool_calls"]; ok && !isNull(traw) {
		tpath := path + ".tool_calls"
		calls, err := decodeArray(traw, tpath)
		if err != nil {
			return m, err
		}
		if len(calls) > 0 && m.Role != "assistant" {
			return m, fmt.Errorf("%s: only assistant messages can have tool calls", tpath)
		}
		for k, c := range calls {
			tc, err := parseChatToolCall(c, fmt.Sprintf("%s[%d]", tpath, k))
			if err != nil {
				return m, err
			}
			m.ToolCalls = append(m.ToolCalls, tc)
		}
	}

	if m.Role == "tool" {
		if m.ToolCallID, err = o.str("tool_call_id", path); err != nil {
			return m, err
		}
	}
	return m, nil
}

// chatContentParts concatenates the texts of an array of chat content parts.
func chatContentParts(raw json.RawMessage, path string) (string, error) {
	parts, err := decodeArray(raw, path)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	for j, p := range parts {
		ppath := fmt.Sprintf("%s[%d]", path, j)
		o, err := decodeObject(p, ppath)
		if err != nil {
			return "", err
		}
		typ, err := o.reqStr("type", ppath)
		if err != nil {
			return "", err
		}
		if typ != "text" {
			return "", unsupported("%s: content part type %q", ppath, typ)
		}
		text, err := o.reqStr("text", ppath)
		if err != nil {
			return "", err
		}
		sb.WriteString(text)
	}
	return sb.String(), nil
}

func parseChatToolCall(raw json.RawMessage, path string) (ToolCall, error) {
	var tc ToolCall
	o, err := decodeObject(raw, path)
	if err != nil {
		return tc, err
	}
	if tc.ID, err = o.str("id", path); err != nil {
		return tc, err
	}
	typ, err := o.str("type", path)
	if err != nil {
		return tc, err
	}
	if typ != "" && typ != "function" {
		return tc, fmt.Errorf("%s.type: unknown tool call type %q (expected \"function\")", path, typ)
	}
	fpath := path + ".function"
	f, err := o.reqObject("function", path)
	if err != nil {
		return tc, err
	}
	if tc.Name, err = f.reqStr("name", fpath); err != nil {
		return tc, err
	}
	if tc.Arguments, err = f.arguments(fpath); err != nil {
		return tc, err
	}
	return tc, nil
}

// ParseChatTools parses the "tools" array of /v1/chat/completions:
// [{"type":"function","function":{"name","description","parameters"}}].
// Absent or null gives nil; tool types other than "function" give an
// *UnsupportedError.
func ParseChatTools(raw json.RawMessage) ([]Tool, error) {
	return parseTools(raw, true)
}

// parseTools parses a tools array; nested selects the chat format (function
// fields under "function") over the Responses format (fields inline).
func parseTools(raw json.RawMessage, nested bool) ([]Tool, error) {
	const path = "tools"
	if kind(raw) == 0 {
		return nil, nil
	}
	if err := checkJSON(raw, path); err != nil {
		return nil, err
	}
	if isNull(raw) {
		return nil, nil
	}
	items, err := decodeArray(raw, path)
	if err != nil {
		return nil, err
	}
	var tools []Tool
	for i, item := range items {
		tpath := fmt.Sprintf("%s[%d]", path, i)
		o, err := decodeObject(item, tpath)
		if err != nil {
			return nil, err
		}
		typ, err := o.reqStr("type", tpath)
		if err != nil {
			return nil, err
		}
		if typ != "function" {
			return nil, unsupported("%s: tool type %q", tpath, typ)
		}
		if nested {
			if o, err = o.reqObject("function", tpath); err != nil {
				return nil, err
			}
			tpath += ".function"
		}
		t, err := parseFunction(o, tpath)
		if err != nil {
			return nil, err
		}
		tools = append(tools, t)
	}
	return tools, nil
}

func parseFunction(o object, path string) (Tool, error) {
	var t Tool
	var err error
	if t.Name, err = o.reqStr("name", path); err != nil {
		return t, err
	}
	if t.Description, err = o.str("description", path); err != nil {
		return t, err
	}
	if p, ok := o["parameters"]; ok && !isNull(p) {
		if kind(p) != '{' {
			return t, fmt.Errorf("%s.parameters: must be an object", path)
		}
		t.Parameters = p
	}
	return t, nil
}
