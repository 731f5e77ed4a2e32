package render

import (
	"encoding/json"
	"fmt"
)

// ResponsesAsChat maps a Responses request to the chat completions request
// vLLM's Responses serving builds from it: instructions as a leading system
// message, a string input as a user message, message items with their
// text and image parts, function calls as assistant tool calls (adjacent
// ones merged), function call outputs as tool messages; reasoning items
// dropped; function tools reshaped. Used only when an engine lacks
// /v1/responses/render; the result is close to, not guaranteed equal to,
// the engine's own rendering (the metric label says which was used).
func ResponsesAsChat(body []byte) ([]byte, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, fmt.Errorf("render: responses body: %w", err)
	}
	var msgs []map[string]any
	if raw := req["instructions"]; raw != nil && string(raw) != "null" {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("render: instructions must be a string")
		}
		msgs = append(msgs, map[string]any{"role": "system", "content": s})
	}
	var text string
	if json.Unmarshal(req["input"], &text) == nil {
		msgs = append(msgs, map[string]any{"role": "user", "content": text})
	} else {
		var items []map[string]json.RawMessage
		if err := json.Unmarshal(req["input"], &items); err != nil {
			return nil, fmt.Errorf("render: input must be a string or a list of items")
		}
		for _, it := range items {
			var typ, role string
			_ = json.Unmarshal(it["type"], &typ)
			_ = json.Unmarshal(it["role"], &role)
			switch {
			case typ == "" || typ == "message":
				content, err := chatContent(it["content"])
				if err != nil {
					return nil, err
				}
				msgs = append(msgs, map[string]any{"role": role, "content": content})
			case typ == "function_call":
				var call struct {
					CallID    string `json:"call_id"`
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				}
				b, _ := json.Marshal(it)
				if err := json.Unmarshal(b, &call); err != nil {
					return nil, fmt.Errorf("render: function_call item: %w", err)
				}
				tc := map[string]any{"id": call.CallID, "type": "function", "function": map[string]any{"name": call.Name, "arguments": call.Arguments}}
				// Its own assistant message, as vLLM's
				// construct_chat_messages_with_tool_call makes it (no
				// content; never merged with the message before it).
				msgs = append(msgs, map[string]any{"role": "assistant", "tool_calls": []any{tc}})
			case typ == "function_call_output":
				var out struct {
					CallID string          `json:"call_id"`
					Output json.RawMessage `json:"output"`
				}
				b, _ := json.Marshal(it)
				if err := json.Unmarshal(b, &out); err != nil {
					return nil, fmt.Errorf("render: function_call_output item: %w", err)
				}
				var s string
				if json.Unmarshal(out.Output, &s) != nil {
					s = string(out.Output)
				}
				msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": out.CallID, "content": s})
			case typ == "reasoning":
			default:
				return nil, fmt.Errorf("render: input item type %q has no chat form", typ)
			}
		}
	}
	chat := map[string]any{"messages": msgs}
	for _, k := range []string{"model", "cache_salt", "tool_choice", "parallel_tool_calls"} {
		if v, ok := req[k]; ok {
			chat[k] = v
		}
	}
	if raw := req["tools"]; raw != nil && string(raw) != "null" {
		var tools []map[string]json.RawMessage
		if err := json.Unmarshal(raw, &tools); err != nil {
			return nil, fmt.Errorf("render: tools must be a list")
		}
		var out []any
		for _, t := range tools {
			var typ string
			_ = json.Unmarshal(t["type"], &typ)
			if typ != "function" {
				continue // built-in tools have no chat form
			}
			fn := map[string]json.RawMessage{}
			for _, k := range []string{"name", "description", "parameters", "strict"} {
				if v, ok := t[k]; ok {
					fn[k] = v
				}
			}
			out = append(out, map[string]any{"type": "function", "function": fn})
		}
		if len(out) > 0 {
			chat["tools"] = out
		}
	}
	return json.Marshal(chat)
}

// chatContent maps Responses content (a string or input_text /
// output_text / input_image parts) to chat content.
func chatContent(raw json.RawMessage) (any, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, fmt.Errorf("render: message content must be a string or a list of parts")
	}
	var out []any
	for _, p := range parts {
		var typ string
		_ = json.Unmarshal(p["type"], &typ)
		switch typ {
		case "input_text", "output_text", "text":
			var t string
			_ = json.Unmarshal(p["text"], &t)
			out = append(out, map[string]any{"type": "text", "text": t})
		case "input_image":
			var u string
			_ = json.Unmarshal(p["image_url"], &u)
			out = append(out, map[string]any{"type": "image_url", "image_url": map[string]any{"url": u}})
		default:
			return nil, fmt.Errorf("render: content part %q has no chat form", typ)
		}
	}
	return out, nil
}

// ResponsesAnchor maps a Responses request's anchor (the request cut after
// its first user message) to a chat request rendered without the
// generation prompt: the anchor's tokens then end where the conversation's
// stable part does, on every turn, whatever the template appends for the
// assistant's turn.
func ResponsesAnchor(body []byte) ([]byte, error) {
	chat, err := ResponsesAsChat(body)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(chat, &m); err != nil {
		return nil, err
	}
	m["add_generation_prompt"] = json.RawMessage("false")
	m["continue_final_message"] = json.RawMessage("false")
	return json.Marshal(m)
}
