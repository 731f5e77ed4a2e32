package chat

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseResponsesInput(t *testing.T) {
	tests := []struct {
		name         string
		instructions string
		input        string
		want         []Message
	}{
		{
			name:  "string input",
			input: `"Tell me a joke."`,
			want:  []Message{{Role: "user", Content: "Tell me a joke."}},
		},
		{
			name:         "instructions",
			instructions: "Be brief.",
			input:        `"Hi"`,
			want:         []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}},
		},
		{
			name:  "message items",
			input: `[{"type":"message","role":"developer","content":"Rules."},{"type":"message","role":"user","content":[{"type":"input_text","text":"Hello "},{"type":"input_text","text":"there"}]}]`,
			want:  []Message{{Role: "developer", Content: "Rules."}, {Role: "user", Content: "Hello there"}},
		},
		{
			name:  "easy input messages",
			input: `[{"role":"system","content":"S"},{"role":"user","content":"U"},{"role":"assistant","content":"A"}]`,
			want:  []Message{{Role: "system", Content: "S"}, {Role: "user", Content: "U"}, {Role: "assistant", Content: "A"}},
		},
		{
			// vLLM keeps the first part's text of an assistant message.
			name:  "assistant output message",
			input: `[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Sure. ","annotations":[]},{"type":"refusal","refusal":"But no."}]}]`,
			want:  []Message{{Role: "assistant", Content: "Sure. "}},
		},
		{
			name:  "assistant refusal first",
			input: `[{"role":"assistant","content":[{"type":"refusal","refusal":"No."},{"type":"output_text","text":"x"}]}]`,
			want:  []Message{{Role: "assistant", Content: ""}},
		},
		{
			// vLLM since PR #42189: contiguous assistant-side items share
			// one assistant message.
			name: "assistant-side items merge",
			input: `[
				{"role":"user","content":"Weather in Paris and Rome?"},
				{"type":"reasoning","id":"rs_1","summary":[]},
				{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Checking."}]},
				{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
				{"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"again"}]},
				{"type":"function_call","call_id":"c2","name":"get_weather","arguments":"{\"city\":\"Rome\"}"},
				{"type":"function_call_output","call_id":"c1","output":"sunny"},
				{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"rain"},{"type":"output_text","text":"y"}]},
				{"type":"function_call","call_id":"c3","name":"noop"}
			]`,
			want: []Message{
				{Role: "user", Content: "Weather in Paris and Rome?"},
				{Role: "assistant", Content: "Checking.", ToolCalls: []ToolCall{
					{ID: "c1", Name: "get_weather", Arguments: `{"city":"Paris"}`},
				}},
				{Role: "assistant", Reasoning: "again", ToolCalls: []ToolCall{
					{ID: "c2", Name: "get_weather", Arguments: `{"city":"Rome"}`},
				}},
				{Role: "tool", ToolCallID: "c1", Content: "sunny"},
				{Role: "tool", ToolCallID: "c2", Content: "rainy"},
				{Role: "assistant", ToolCalls: []ToolCall{{ID: "c3", Name: "noop"}}},
			},
		},
		{
			name: "reasoning text: content first, then summary, encrypted ignored",
			input: `[
				{"role":"user","content":"Q"},
				{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"sum1"},{"type":"summary_text","text":"sum2"}],"content":[{"type":"reasoning_text","text":"think1"},{"type":"reasoning_text","text":"think2"}],"encrypted_content":"opaque","status":"completed"},
				{"role":"user","content":"Q2"},
				{"type":"reasoning","id":"rs_2","summary":[{"type":"summary_text","text":"sum"}],"content":[]},
				{"type":"reasoning","id":"rs_3","summary":[],"encrypted_content":"opaque"},
				{"role":"assistant","content":"A"},
				{"role":"assistant","content":"B"}
			]`,
			want: []Message{
				{Role: "user", Content: "Q"},
				{Role: "assistant", Reasoning: "think1"},
				{Role: "user", Content: "Q2"},
				{Role: "assistant", Reasoning: "sum"},
				{Role: "assistant", Content: "A"},
				{Role: "assistant", Content: "B"},
			},
		},
		{
			name:         "function call after instructions does not merge",
			instructions: "I",
			input:        `[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]`,
			want:         []Message{{Role: "system", Content: "I"}, {Role: "assistant", ToolCalls: []ToolCall{{ID: "c", Name: "f", Arguments: "{}"}}}},
		},
		{
			name:         "empty array with instructions",
			instructions: "I",
			input:        `[]`,
			want:         []Message{{Role: "system", Content: "I"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, tools, err := ParseResponsesInput(tt.instructions, json.RawMessage(tt.input), nil)
			if err != nil {
				t.Fatalf("ParseResponsesInput: %v", err)
			}
			if tools != nil {
				t.Errorf("tools = %v, want nil", tools)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseResponsesTools(t *testing.T) {
	tools := `[{"type":"function","name":"get_weather","description":"Weather.","parameters":{"type":"object"},"strict":true},{"type":"function","name":"noop"}]`
	_, got, err := ParseResponsesInput("", json.RawMessage(`"hi"`), json.RawMessage(tools))
	if err != nil {
		t.Fatal(err)
	}
	want := []Tool{
		{Name: "get_weather", Description: "Weather.", Parameters: json.RawMessage(`{"type":"object"}`)},
		{Name: "noop"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestParseResponsesInputErrors(t *testing.T) {
	tests := []struct {
		name         string
		instructions string
		input        string
		tools        string
		unsupported  bool
		want         string
	}{
		{name: "absent input", input: ``, want: "input: field required"},
		{name: "null input", input: `null`, want: "input: must be a string or an array"},
		{name: "malformed input", input: `[{"role":`, want: "input: invalid JSON"},
		{name: "empty", input: `[]`, want: "input: must contain at least one message"},
		{name: "item not object", input: `["hi"]`, want: "input[0]: must be an object"},
		{name: "no type no role", input: `[{"content":"x"}]`, want: "input[0].type: field required"},
		{name: "unknown item type", input: `[{"role":"user","content":"x"},{"type":"item_reference","id":"msg_1"}]`, want: `input[1].type: unknown or unsupported input item type "item_reference"`},
		{name: "tool role message", input: `[{"type":"message","role":"tool","content":"x"}]`, want: `input[0].role: unknown role "tool"`},
		{name: "missing content", input: `[{"type":"message","role":"user"}]`, want: "input[0].content: field required"},
		{name: "null content", input: `[{"role":"user","content":null}]`, want: "input[0].content: must be a string or an array"},
		{name: "unknown part", input: `[{"role":"user","content":[{"type":"text","text":"x"}]}]`, want: `input[0].content[0].type: unknown content part type "text"`},
		{name: "input_image", input: `[{"role":"user","content":[{"type":"input_text","text":"what?"},{"type":"input_image","image_url":"http://x"}]}]`, unsupported: true, want: `input[0].content[1]: content part type "input_image" is not supported`},
		{name: "input_file", input: `[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]`, unsupported: true, want: `"input_file"`},
		{name: "input_audio", input: `[{"role":"user","content":[{"type":"input_audio"}]}]`, unsupported: true, want: `"input_audio"`},
		{name: "function_call without call_id", input: `[{"type":"function_call","name":"f","arguments":"{}"}]`, want: "input[0].call_id: field required"},
		{name: "function_call without name", input: `[{"type":"function_call","call_id":"c","arguments":"{}"}]`, want: "input[0].name: field required"},
		{name: "output without output", input: `[{"type":"function_call_output","call_id":"c"}]`, want: "input[0].output: field required"},
		{name: "refusal in output", input: `[{"type":"function_call_output","call_id":"c","output":[{"type":"refusal","refusal":"no"}]}]`, want: `input[0].output[0].type: unknown content part type "refusal"`},
		{name: "image in output", input: `[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image"}]}]`, unsupported: true, want: `input[0].output[0]`},
		{name: "reasoning without id", input: `[{"type":"reasoning","summary":[]}]`, want: "input[0].id: field required"},
		{name: "reasoning without summary", input: `[{"type":"reasoning","id":"rs"}]`, want: "input[0].summary: field required"},
		{name: "reasoning summary part type", input: `[{"type":"reasoning","id":"rs","summary":[{"type":"reasoning_text","text":"x"}]}]`, want: `input[0].summary[0].type: must be "summary_text"`},
		{name: "reasoning content without text", input: `[{"type":"reasoning","id":"rs","summary":[],"content":[{"type":"reasoning_text"}]}]`, want: "input[0].content[0].text: field required"},
		{name: "reasoning encrypted not string", input: `[{"type":"reasoning","id":"rs","summary":[],"encrypted_content":1}]`, want: "input[0].encrypted_content: must be a string"},
		{name: "web_search tool", input: `"hi"`, tools: `[{"type":"web_search"}]`, unsupported: true, want: `tools[0]: tool type "web_search" is not supported`},
		{name: "mcp tool", input: `"hi"`, tools: `[{"type":"function","name":"f"},{"type":"mcp","server_label":"x"}]`, unsupported: true, want: `tools[1]: tool type "mcp"`},
		{name: "tool without name", input: `"hi"`, tools: `[{"type":"function"}]`, want: "tools[0].name: field required"},
		{name: "malformed tools", input: `"hi"`, tools: `[`, want: "tools: invalid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgs, tools, err := ParseResponsesInput(tt.instructions, json.RawMessage(tt.input), json.RawMessage(tt.tools))
			if err == nil {
				t.Fatalf("ParseResponsesInput succeeded: %+v %+v", msgs, tools)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
			var ue *UnsupportedError
			if got := errors.As(err, &ue); got != tt.unsupported {
				t.Errorf("errors.As(%v, *UnsupportedError) = %v, want %v", err, got, tt.unsupported)
			}
		})
	}
}
