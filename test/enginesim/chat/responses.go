package chat

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ParseResponsesInput maps a stateless Responses API request ("instructions",
// "input", "tools") to chat messages and tools. See the package
// documentation for the mapping.
func ParseResponsesInput(instructions string, input json.RawMessage, tools json.RawMessage) ([]Message, []Tool, error) {
	var msgs []Message
	if instructions != "" {
		msgs = append(msgs, Message{Role: "system", Content: instructions})
	}

	const path = "input"
	if err := checkJSON(input, path); err != nil {
		return nil, nil, err
	}
	switch kind(input) {
	case '"':
		s, err := decodeString(input, path)
		if err != nil {
			return nil, nil, err
		}
		msgs = append(msgs, Message{Role: "user", Content: s})
	case '[':
		items, err := decodeArray(input, path)
		if err != nil {
			return nil, nil, err
		}
		for i, item := range items {
			if msgs, err = appendResponsesItem(msgs, item, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return nil, nil, err
			}
		}
	default:
		return nil, nil, fmt.Errorf("%s: must be a string or an array of input items", path)
	}
	if len(msgs) == 0 {
		return nil, nil, fmt.Errorf("%s: must contain at least one message", path)
	}

	ts, err := parseTools(tools, false)
	if err != nil {
		return nil, nil, err
	}
	return msgs, ts, nil
}

// appendResponsesItem appends the message(s) of one input item to msgs.
func appendResponsesItem(msgs []Message, raw json.RawMessage, path string) ([]Message, error) {
	o, err := decodeObject(raw, path)
	if err != nil {
		return nil, err
	}
	typ, err := o.str("type", path)
	if err != nil {
		return nil, err
	}
	if typ == "" {
		if _, ok := o["role"]; !ok {
			return nil, fmt.Errorf("%s.type: field required", path)
		}
		typ = "message" // EasyInputMessage
	}

	switch typ {
	case "message":
		role, err := o.reqStr("role", path)
		if err != nil {
			return nil, err
		}
		switch role {
		case "user", "system", "developer", "assistant":
		default:
			return nil, fmt.Errorf("%s.role: unknown role %q (expected one of user, system, developer, assistant)", path, role)
		}
		craw, ok := o["content"]
		if !ok {
			return nil, fmt.Errorf("%s.content: field required", path)
		}
		content, err := responsesText(craw, path+".content", true)
		if err != nil {
			return nil, err
		}
		return append(msgs, Message{Role: role, Content: content}), nil

	case "function_call":
		var tc ToolCall
		if tc.ID, err = o.reqStr("call_id", path); err != nil {
			return nil, err
		}
		if tc.Name, err = o.reqStr("name", path); err != nil {
			return nil, err
		}
		if tc.Arguments, err = o.arguments(path); err != nil {
			return nil, err
		}
		// Its own assistant message, as vLLM's
		// construct_chat_messages_with_tool_call makes it: never merged
		// into the message before it, nor with a parallel call.
		return append(msgs, Message{Role: "assistant", ToolCalls: []ToolCall{tc}}), nil

	case "function_call_output":
		callID, err := o.reqStr("call_id", path)
		if err != nil {
			return nil, err
		}
		oraw, ok := o["output"]
		if !ok {
			return nil, fmt.Errorf("%s.output: field required", path)
		}
		out, err := responsesText(oraw, path+".output", false)
		if err != nil {
			return nil, err
		}
		return append(msgs, Message{Role: "tool", ToolCallID: callID, Content: out}), nil

	case "reasoning":
		return msgs, nil

	default:
		return nil, fmt.Errorf("%s.type: unknown or unsupported input item type %q", path, typ)
	}
}

// responsesText returns a Responses content value, a string or an array of
// parts, as text. Refusal parts are accepted only when refusal is set.
func responsesText(raw json.RawMessage, path string, refusal bool) (string, error) {
	switch kind(raw) {
	case '"':
		return decodeString(raw, path)
	case '[':
	default:
		return "", fmt.Errorf("%s: must be a string or an array of content parts", path)
	}
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
		field := "text"
		switch {
		case typ == "input_text" || typ == "output_text":
		case typ == "refusal" && refusal:
			field = "refusal"
		case typ == "input_image" || typ == "input_file" || typ == "input_audio":
			return "", unsupported("%s: content part type %q", ppath, typ)
		default:
			return "", fmt.Errorf("%s.type: unknown content part type %q", ppath, typ)
		}
		text, err := o.reqStr(field, ppath)
		if err != nil {
			return "", err
		}
		sb.WriteString(text)
	}
	return sb.String(), nil
}
