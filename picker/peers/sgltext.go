package peers

import (
	"strings"

	"github.com/valyala/fastjson"
)

// SGLangResponsesText is a /v1/responses body's routing text as SMG's
// HTTP mode reads it (ResponsesRequest::extract_text_for_routing,
// shared/docs/peer-policies.md §3.2 "Responses text"), for
// Request.Text:
//   - a string input is the text as is;
//   - an item list gives, in order, the input_text and output_text parts
//     of its messages (type "message", or no type: a simple input
//     message, whose string content counts whole) and the reasoning_text
//     parts of its reasoning items, joined with single spaces — a
//     separator even for an empty part;
//   - nothing else counts: function_call arguments, function_call_output
//     outputs, every other tool, MCP, shell, patch, image-generation or
//     reference item, image, file and refusal parts, reasoning summaries,
//     and the instructions.
//
// A body that does not parse, or has no input, gives "".
func SGLangResponsesText(body []byte) string {
	var p fastjson.Parser
	v, err := p.ParseBytes(body)
	if err != nil {
		return ""
	}
	input := v.Get("input")
	if s, ok := sglString(input); ok {
		return s
	}
	var parts []string
	for _, item := range sglArray(input) {
		parts = sglItemText(item, parts)
	}
	return strings.Join(parts, " ")
}

// sglItemText appends the parts of one input item that SMG's routing
// text holds.
func sglItemText(item *fastjson.Value, parts []string) []string {
	typ, _ := sglString(item.Get("type"))
	switch typ {
	case "message", "":
		content := item.Get("content")
		if s, ok := sglString(content); ok {
			return append(parts, s)
		}
		return sglParts(content, parts, "input_text", "output_text")
	case "reasoning":
		return sglParts(item.Get("content"), parts, "reasoning_text")
	}
	return parts
}

// sglParts appends the text of content's parts whose type is one of
// types.
func sglParts(content *fastjson.Value, parts []string, types ...string) []string {
	for _, part := range sglArray(content) {
		typ, _ := sglString(part.Get("type"))
		text, ok := sglString(part.Get("text"))
		for _, want := range types {
			if ok && typ == want {
				parts = append(parts, text)
			}
		}
	}
	return parts
}

// sglArray is v's elements, none when v is not an array.
func sglArray(v *fastjson.Value) []*fastjson.Value {
	if v == nil || v.Type() != fastjson.TypeArray {
		return nil
	}
	a, _ := v.Array()
	return a
}

// sglString is v's string, when v is one.
func sglString(v *fastjson.Value) (string, bool) {
	if v == nil || v.Type() != fastjson.TypeString {
		return "", false
	}
	b, _ := v.StringBytes()
	return string(b), true
}
