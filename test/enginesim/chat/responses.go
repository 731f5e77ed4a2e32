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
		b := responsesBuilder{msgs: msgs}
		for i, item := range items {
			if err := b.add(item, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return nil, nil, err
			}
		}
		msgs = b.msgs
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

// responsesBuilder maps input items to chat messages the way vLLM's
// non-Harmony Responses path does (vllm/entrypoints/openai/responses/
// utils.py, construct_chat_messages_with_tool_call, since PR #42189, merged
// 2026-05-10): contiguous assistant-side items — reasoning, an assistant
// message, function calls — fill one assistant message. Each item merges
// into the assistant message just before it when that message lacks what
// the item brings: a reasoning item its reasoning, an assistant message its
// content; function calls always append to its tool calls. Otherwise the
// item starts a new assistant message.
type responsesBuilder struct {
	msgs []Message
	// Whether the last message, when an assistant message, has content or
	// reasoning (vLLM's "is not None": an empty string counts as set).
	hasContent, hasReasoning bool
}

// lastAssistant returns the last message if it is an assistant message.
func (b *responsesBuilder) lastAssistant() *Message {
	if n := len(b.msgs); n > 0 && b.msgs[n-1].Role == "assistant" {
		return &b.msgs[n-1]
	}
	return nil
}

// add appends or merges the message of one input item.
func (b *responsesBuilder) add(raw json.RawMessage, path string) error {
	o, err := decodeObject(raw, path)
	if err != nil {
		return err
	}
	typ, err := o.str("type", path)
	if err != nil {
		return err
	}
	if typ == "" {
		if _, ok := o["role"]; !ok {
			return fmt.Errorf("%s.type: field required", path)
		}
		typ = "message" // EasyInputMessage
	}

	switch typ {
	case "message":
		return b.addMessage(o, path)

	case "function_call":
		var tc ToolCall
		if tc.ID, err = o.reqStr("call_id", path); err != nil {
			return err
		}
		if tc.Name, err = o.reqStr("name", path); err != nil {
			return err
		}
		if tc.Arguments, err = o.arguments(path); err != nil {
			return err
		}
		if last := b.lastAssistant(); last != nil {
			last.ToolCalls = append(last.ToolCalls, tc)
			return nil
		}
		b.msgs = append(b.msgs, Message{Role: "assistant", ToolCalls: []ToolCall{tc}})
		b.hasContent, b.hasReasoning = false, false
		return nil

	case "function_call_output":
		callID, err := o.reqStr("call_id", path)
		if err != nil {
			return err
		}
		oraw, ok := o["output"]
		if !ok {
			return fmt.Errorf("%s.output: field required", path)
		}
		out, err := responsesText(oraw, path+".output", false)
		if err != nil {
			return err
		}
		b.msgs = append(b.msgs, Message{Role: "tool", ToolCallID: callID, Content: out})
		return nil

	case "reasoning":
		text, err := reasoningText(o, path)
		if err != nil {
			return err
		}
		if last := b.lastAssistant(); last != nil && !b.hasReasoning {
			last.Reasoning, b.hasReasoning = text, true
			return nil
		}
		b.msgs = append(b.msgs, Message{Role: "assistant", Reasoning: text})
		b.hasContent, b.hasReasoning = false, true
		return nil

	default:
		return fmt.Errorf("%s.type: unknown or unsupported input item type %q", path, typ)
	}
}

// addMessage appends or merges a message item: an assistant message
// fills the content of the assistant message before it when that one has
// none.
func (b *responsesBuilder) addMessage(o object, path string) error {
	role, err := o.reqStr("role", path)
	if err != nil {
		return err
	}
	switch role {
	case "user", "system", "developer", "assistant":
	default:
		return fmt.Errorf("%s.role: unknown role %q (expected one of user, system, developer, assistant)", path, role)
	}
	craw, ok := o["content"]
	if !ok {
		return fmt.Errorf("%s.content: field required", path)
	}
	if role != "assistant" {
		content, err := responsesText(craw, path+".content", true)
		if err != nil {
			return err
		}
		b.msgs = append(b.msgs, Message{Role: role, Content: content})
		return nil
	}
	content, err := assistantText(craw, path+".content")
	if err != nil {
		return err
	}
	if last := b.lastAssistant(); last != nil && !b.hasContent {
		last.Content, b.hasContent = content, true
		return nil
	}
	b.msgs = append(b.msgs, Message{Role: "assistant", Content: content})
	b.hasContent, b.hasReasoning = true, false
	return nil
}

// assistantText is the text vLLM takes from an assistant message item: a
// string as is; of parts, the first part's "text" only ("" when it has
// none, as a refusal part); "" for no parts. Parts are still checked.
func assistantText(raw json.RawMessage, path string) (string, error) {
	if kind(raw) == '"' {
		return decodeString(raw, path)
	}
	if _, err := responsesText(raw, path, true); err != nil {
		return "", err
	}
	parts, _ := decodeArray(raw, path) // checked by responsesText
	if len(parts) == 0 {
		return "", nil
	}
	first, _ := decodeObject(parts[0], path+"[0]")
	return first.str("text", path+"[0]")
}

// reasoningText checks a reasoning item (the fields of OpenAI's
// ResponseReasoningItemParam: id and summary required, content,
// encrypted_content and status optional) and returns the reasoning vLLM
// takes from it: the first content part's text, else the first summary
// part's text, else "". encrypted_content is ignored, as vLLM's dict-form
// path does for request input.
func reasoningText(o object, path string) (string, error) {
	if _, err := o.reqStr("id", path); err != nil {
		return "", err
	}
	sraw, ok := o["summary"]
	if !ok {
		return "", fmt.Errorf("%s.summary: field required", path)
	}
	summary, err := reasoningParts(sraw, path+".summary", "summary_text")
	if err != nil {
		return "", err
	}
	var content []string
	if craw, ok := o["content"]; ok && !isNull(craw) {
		if content, err = reasoningParts(craw, path+".content", "reasoning_text"); err != nil {
			return "", err
		}
	}
	if _, err := o.str("encrypted_content", path); err != nil {
		return "", err
	}
	switch {
	case len(content) > 0:
		return content[0], nil
	case len(summary) > 0:
		return summary[0], nil
	}
	return "", nil
}

// reasoningParts returns the texts of an array of {"type": typ, "text"}.
func reasoningParts(raw json.RawMessage, path, typ string) ([]string, error) {
	parts, err := decodeArray(raw, path)
	if err != nil {
		return nil, err
	}
	texts := make([]string, 0, len(parts))
	for j, p := range parts {
		ppath := fmt.Sprintf("%s[%d]", path, j)
		o, err := decodeObject(p, ppath)
		if err != nil {
			return nil, err
		}
		t, err := o.reqStr("type", ppath)
		if err != nil {
			return nil, err
		}
		if t != typ {
			return nil, fmt.Errorf("%s.type: must be %q", ppath, typ)
		}
		text, err := o.reqStr("text", ppath)
		if err != nil {
			return nil, err
		}
		texts = append(texts, text)
	}
	return texts, nil
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
