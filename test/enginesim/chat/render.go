package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// RenderOptions are the chat template options of a request.
type RenderOptions struct {
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	// Variant selects the template: "" is the Qwen3-like template this
	// package documents; TemplateAlt ends every role header with a blank
	// line, as a replica deployed with another chat template would — for
	// testing that such a replica is caught.
	Variant string
}

// TemplateAlt is the alternative template variant.
const TemplateAlt = "alt"

// Render applies the chat template to msgs and tools and returns the token
// ids. See the package documentation for the template.
func Render(msgs []Message, tools []Tool, opts RenderOptions) ([]uint32, error) {
	return AppendRender(nil, msgs, tools, opts)
}

// AppendRender is Render appending the tokens to dst. On error dst is
// returned unchanged.
func AppendRender(dst []uint32, msgs []Message, tools []Tool, opts RenderOptions) ([]uint32, error) {
	if opts.AddGenerationPrompt && opts.ContinueFinalMessage {
		return dst, errors.New("add_generation_prompt and continue_final_message cannot both be true")
	}
	if opts.ContinueFinalMessage && (len(msgs) == 0 || msgs[len(msgs)-1].Role != "assistant") {
		return dst, errors.New("continue_final_message requires the final message to be an assistant message")
	}
	header := "\n"
	if opts.Variant == TemplateAlt {
		header = "\n\n"
	}
	toolLines := make([]string, len(tools))
	for i, t := range tools {
		line, err := marshalToolLine(t)
		if err != nil {
			return dst, fmt.Errorf("tools[%d]: %v", i, err)
		}
		toolLines[i] = line
	}

	if len(tools) > 0 {
		dst = append(dst, ImStart)
		dst = AppendEncode(dst, "system")
		dst = AppendEncode(dst, header)
		if len(msgs) > 0 && (msgs[0].Role == "system" || msgs[0].Role == "developer") {
			dst = AppendEncode(dst, msgs[0].Content)
			dst = AppendEncode(dst, "\n\n")
			msgs = msgs[1:]
		}
		dst = AppendEncode(dst, "# Tools\n")
		for _, line := range toolLines {
			dst = AppendEncode(dst, line)
			dst = AppendEncode(dst, "\n")
		}
		dst = append(dst, ImEnd)
		dst = AppendEncode(dst, "\n")
	}

	for i, m := range msgs {
		role := m.Role
		if role == "developer" {
			role = "system"
		}
		dst = append(dst, ImStart)
		dst = AppendEncode(dst, role)
		dst = AppendEncode(dst, header)
		if m.Role == "tool" {
			dst = AppendEncode(dst, "<tool_response>\n")
			dst = AppendEncode(dst, m.Content)
			dst = AppendEncode(dst, "\n</tool_response>")
		} else {
			dst = AppendEncode(dst, m.Content)
			if m.Role == "assistant" {
				for _, tc := range m.ToolCalls {
					dst = AppendEncode(dst, "\n<tool_call>\n")
					dst = AppendEncode(dst, toolCallJSON(tc))
					dst = AppendEncode(dst, "\n</tool_call>")
				}
			}
		}
		if opts.ContinueFinalMessage && i == len(msgs)-1 {
			break
		}
		dst = append(dst, ImEnd)
		dst = AppendEncode(dst, "\n")
	}

	if opts.AddGenerationPrompt {
		dst = append(dst, ImStart)
		dst = AppendEncode(dst, "assistant")
		dst = AppendEncode(dst, header)
	}
	return dst, nil
}

// toolLine is the JSON form of a tool in the tools block; the field order is
// fixed by the struct.
type toolLine struct {
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// marshalToolLine returns the one-line JSON of t.
func marshalToolLine(t Tool) (string, error) {
	var params json.RawMessage
	if len(t.Parameters) > 0 {
		var buf bytes.Buffer
		if err := json.Compact(&buf, t.Parameters); err != nil {
			return "", fmt.Errorf("parameters: %v", err)
		}
		params = buf.Bytes()
	}
	return marshal(toolLine{
		Type:     "function",
		Function: toolFunction{Name: t.Name, Description: t.Description, Parameters: params},
	})
}

// toolCallJSON returns the body of a <tool_call> block.
func toolCallJSON(tc ToolCall) string {
	name, _ := marshal(tc.Name) // a string always marshals
	args := tc.Arguments
	if args == "" {
		args = "{}"
	}
	return `{"name": ` + name + `, "arguments": ` + args + `}`
}

// marshal returns the compact JSON of v without HTML escaping.
func marshal(v any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(buf.String(), "\n"), nil
}
