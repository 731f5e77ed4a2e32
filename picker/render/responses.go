package render

import (
	"encoding/json"
	"fmt"
)

// ResponsesAsChat maps a Responses request to the chat completions request
// vLLM's Responses serving builds from it: instructions as a leading system
// message, a string input as a user message, message items with their
// text and image parts (an assistant message: its first part's text),
// reasoning items as an assistant message's "reasoning", function calls as
// its tool calls, function call outputs as tool messages — contiguous
// assistant-side items merged as chatBuilder says; function tools reshaped. Used only when an engine lacks
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
		b := chatBuilder{msgs: msgs}
		for _, it := range items {
			if err := b.add(it); err != nil {
				return nil, err
			}
		}
		msgs = b.msgs
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

// chatBuilder maps Responses input items to chat messages as vLLM's
// non-Harmony Responses path does (vllm/entrypoints/openai/responses/
// utils.py, construct_chat_messages_with_tool_call, since PR #42189, merged
// 2026-05-10): an item merges into the assistant message just before it
// when that message lacks what the item brings — a reasoning item its
// "reasoning", an assistant message its "content" — and function calls
// always append to its "tool_calls"; otherwise the item starts a message.
type chatBuilder struct {
	msgs []map[string]any
}

// lastAssistant returns the last message if it is an assistant message.
func (b *chatBuilder) lastAssistant() map[string]any {
	if n := len(b.msgs); n > 0 && b.msgs[n-1]["role"] == "assistant" {
		return b.msgs[n-1]
	}
	return nil
}

// add appends or merges the message of one input item.
func (b *chatBuilder) add(it map[string]json.RawMessage) error {
	var typ, role string
	_ = json.Unmarshal(it["type"], &typ)
	_ = json.Unmarshal(it["role"], &role)
	switch {
	case (typ == "" || typ == "message") && role == "assistant":
		text := assistantText(it["content"])
		if last := b.lastAssistant(); last != nil {
			if _, ok := last["content"]; !ok {
				last["content"] = text
				return nil
			}
		}
		b.msgs = append(b.msgs, map[string]any{"role": "assistant", "content": text})
	case typ == "" || typ == "message":
		content, err := chatContent(it["content"])
		if err != nil {
			return err
		}
		b.msgs = append(b.msgs, map[string]any{"role": role, "content": content})
	case typ == "function_call":
		var call struct {
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		}
		raw, _ := json.Marshal(it)
		if err := json.Unmarshal(raw, &call); err != nil {
			return fmt.Errorf("render: function_call item: %w", err)
		}
		tc := map[string]any{"id": call.CallID, "type": "function", "function": map[string]any{"name": call.Name, "arguments": call.Arguments}}
		if last := b.lastAssistant(); last != nil {
			calls, _ := last["tool_calls"].([]any)
			last["tool_calls"] = append(calls, tc)
			return nil
		}
		b.msgs = append(b.msgs, map[string]any{"role": "assistant", "tool_calls": []any{tc}})
	case typ == "function_call_output":
		var out struct {
			CallID string          `json:"call_id"`
			Output json.RawMessage `json:"output"`
		}
		raw, _ := json.Marshal(it)
		if err := json.Unmarshal(raw, &out); err != nil {
			return fmt.Errorf("render: function_call_output item: %w", err)
		}
		var s string
		if json.Unmarshal(out.Output, &s) != nil {
			s = string(out.Output)
		}
		b.msgs = append(b.msgs, map[string]any{"role": "tool", "tool_call_id": out.CallID, "content": s})
	case typ == "reasoning":
		text := reasoningText(it)
		if last := b.lastAssistant(); last != nil {
			if _, ok := last["reasoning"]; !ok {
				last["reasoning"] = text
				return nil
			}
		}
		b.msgs = append(b.msgs, map[string]any{"role": "assistant", "reasoning": text})
	default:
		return fmt.Errorf("render: input item type %q has no chat form", typ)
	}
	return nil
}

// assistantText is the text vLLM takes from an assistant message's
// content: a string as is, else the first part's "text" ("" if none).
func assistantText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil || len(parts) == 0 {
		return ""
	}
	return parts[0].Text
}

// reasoningText is the reasoning vLLM takes from a reasoning item: the
// first content part's text, else the first summary part's, else "";
// encrypted_content is ignored.
func reasoningText(it map[string]json.RawMessage) string {
	var parts struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Summary []struct {
			Text string `json:"text"`
		} `json:"summary"`
	}
	raw, _ := json.Marshal(it)
	_ = json.Unmarshal(raw, &parts)
	switch {
	case len(parts.Content) > 0:
		return parts.Content[0].Text
	case len(parts.Summary) > 0:
		return parts.Summary[0].Text
	}
	return ""
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
