package chat

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseChatMessages(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want []Message
	}{
		{
			name: "string content",
			raw:  `[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi","name":"bob"}]`,
			want: []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi", Name: "bob"}},
		},
		{
			name: "text parts concatenated without separator",
			raw:  `[{"role":"user","content":[{"type":"text","text":"Hello "},{"type":"text","text":"world"}]}]`,
			want: []Message{{Role: "user", Content: "Hello world"}},
		},
		{
			name: "empty parts",
			raw:  `[{"role":"developer","content":[]}]`,
			want: []Message{{Role: "developer"}},
		},
		{
			name: "null content with tool calls",
			raw: `[{"role":"user","content":"weather?"},
				{"role":"assistant","content":null,"tool_calls":[
					{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
					{"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},
				{"role":"tool","tool_call_id":"call_1","content":"sunny"}]`,
			want: []Message{
				{Role: "user", Content: "weather?"},
				{Role: "assistant", ToolCalls: []ToolCall{
					{ID: "call_1", Name: "get_weather", Arguments: `{"city": "Paris"}`},
					{ID: "call_2", Name: "get_time", Arguments: "{}"},
				}},
				{Role: "tool", ToolCallID: "call_1", Content: "sunny"},
			},
		},
		{
			name: "absent content and object arguments",
			raw:  `[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":{"a": 1}}}]}]`,
			want: []Message{{Role: "assistant", ToolCalls: []ToolCall{{ID: "c", Name: "f", Arguments: `{"a":1}`}}}},
		},
		{
			name: "null and empty tool_calls, unknown fields ignored",
			raw:  `[{"role":"user","content":"a","tool_calls":null,"extra":1},{"role":"assistant","content":"b","tool_calls":[],"refusal":null}]`,
			want: []Message{{Role: "user", Content: "a"}, {Role: "assistant", Content: "b"}},
		},
		{
			name: "special tokens are plain text",
			raw:  `[{"role":"user","content":"<|im_end|>"}]`,
			want: []Message{{Role: "user", Content: "<|im_end|>"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseChatMessages(json.RawMessage(tt.raw))
			if err != nil {
				t.Fatalf("ParseChatMessages: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseChatMessagesErrors(t *testing.T) {
	tests := []struct {
		name        string
		raw         string
		unsupported bool
		want        string // substring of the error
	}{
		{"absent", ``, false, "messages: field required"},
		{"malformed", `[{"role":"user",`, false, "messages: invalid JSON"},
		{"trailing garbage", `[] x`, false, "messages: invalid JSON"},
		{"null", `null`, false, "messages: must be an array"},
		{"object", `{"role":"user"}`, false, "messages: must be an array"},
		{"empty", `[]`, false, "messages: must contain at least one message"},
		{"not an object", `[1]`, false, "messages[0]: must be an object"},
		{"bad role", `[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"bot","content":"x"}]`, false, `messages[2].role: unknown role "bot"`},
		{"role case", `[{"role":"User","content":"x"}]`, false, `messages[0].role: unknown role "User"`},
		{"key case", `[{"Role":"user","content":"x"}]`, false, `messages[0].role: field required`},
		{"missing role", `[{"content":"x"}]`, false, "messages[0].role: field required"},
		{"role not string", `[{"role":1,"content":"x"}]`, false, "messages[0].role: must be a string"},
		{"missing content", `[{"role":"user"}]`, false, "messages[0].content: field required"},
		{"null user content", `[{"role":"user","content":null}]`, false, "messages[0].content: must be a string or an array"},
		{"number content", `[{"role":"user","content":5}]`, false, "messages[0].content: must be a string or an array"},
		{"part not object", `[{"role":"user","content":["x"]}]`, false, "messages[0].content[0]: must be an object"},
		{"part without type", `[{"role":"user","content":[{"text":"x"}]}]`, false, "messages[0].content[0].type: field required"},
		{"part without text", `[{"role":"user","content":[{"type":"text"}]}]`, false, "messages[0].content[0].text: field required"},
		{"image_url", `[{"role":"user","content":[{"type":"text","text":"what?"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]`, true, `messages[0].content[1]: content part type "image_url" is not supported`},
		{"input_audio", `[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]`, true, `"input_audio"`},
		{"video_url", `[{"role":"user","content":[{"type":"video_url","video_url":{}}]}]`, true, `"video_url"`},
		{"file", `[{"role":"user","content":[{"type":"file","file":{}}]}]`, true, `"file"`},
		{"unknown part", `[{"role":"user","content":[{"type":"hologram"}]}]`, true, `"hologram"`},
		{"tool_calls on user", `[{"role":"user","content":"x","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]}]`, false, "messages[0].tool_calls: only assistant messages"},
		{"tool_calls not array", `[{"role":"assistant","tool_calls":{}}]`, false, "messages[0].tool_calls: must be an array"},
		{"tool call without function", `[{"role":"assistant","tool_calls":[{"id":"a","type":"function"}]}]`, false, "messages[0].tool_calls[0].function: field required"},
		{"tool call without name", `[{"role":"assistant","tool_calls":[{"id":"a","function":{"arguments":"{}"}}]}]`, false, "messages[0].tool_calls[0].function.name: field required"},
		{"tool call bad type", `[{"role":"assistant","tool_calls":[{"id":"a","type":"custom","function":{"name":"f"}}]}]`, false, `messages[0].tool_calls[0].type: unknown tool call type "custom"`},
		{"tool call bad arguments", `[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":[1]}}]}]`, false, "messages[0].tool_calls[0].function.arguments: must be a string"},
		{"bad tool_call_id", `[{"role":"tool","content":"x","tool_call_id":7}]`, false, "messages[0].tool_call_id: must be a string"},
		{"bad name", `[{"role":"user","content":"x","name":true}]`, false, "messages[0].name: must be a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgs, err := ParseChatMessages(json.RawMessage(tt.raw))
			if err == nil {
				t.Fatalf("ParseChatMessages succeeded: %+v", msgs)
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

func TestParseChatTools(t *testing.T) {
	raw := `[
		{"type":"function","function":{"name":"get_weather","description":"Get the weather.","parameters":{"type": "object", "properties": {"city": {"type": "string"}}}}},
		{"type":"function","function":{"name":"noop","parameters":null}},
		{"type":"function","function":{"name":"bare"}}
	]`
	got, err := ParseChatTools(json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := []Tool{
		{Name: "get_weather", Description: "Get the weather.", Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string"}}}`)},
		{Name: "noop"},
		{Name: "bare"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}

	for _, raw := range []string{``, `null`, ` null `, `[]`} {
		got, err := ParseChatTools(json.RawMessage(raw))
		if err != nil || got != nil {
			t.Errorf("ParseChatTools(%q) = %v, %v; want nil, nil", raw, got, err)
		}
	}
}

func TestParseChatToolsErrors(t *testing.T) {
	tests := []struct {
		raw         string
		unsupported bool
		want        string
	}{
		{`[{"type":"function"`, false, "tools: invalid JSON"},
		{`{}`, false, "tools: must be an array"},
		{`[{"function":{"name":"f"}}]`, false, "tools[0].type: field required"},
		{`[{"type":"function"}]`, false, "tools[0].function: field required"},
		{`[{"type":"function","function":{"description":"x"}}]`, false, "tools[0].function.name: field required"},
		{`[{"type":"function","function":{"name":"f","parameters":"x"}}]`, false, "tools[0].function.parameters: must be an object"},
		{`[{"type":"function","function":{"name":"f"}},{"type":"custom","custom":{"name":"g"}}]`, true, `tools[1]: tool type "custom" is not supported`},
	}
	for _, tt := range tests {
		_, err := ParseChatTools(json.RawMessage(tt.raw))
		if err == nil {
			t.Errorf("ParseChatTools(%s) succeeded", tt.raw)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseChatTools(%s): error %q does not contain %q", tt.raw, err, tt.want)
		}
		var ue *UnsupportedError
		if got := errors.As(err, &ue); got != tt.unsupported {
			t.Errorf("ParseChatTools(%s): errors.As(*UnsupportedError) = %v, want %v", tt.raw, got, tt.unsupported)
		}
	}
}

func TestUnsupportedError(t *testing.T) {
	err := &UnsupportedError{What: "image input"}
	if got, want := err.Error(), "image input is not supported by the simulated engine"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
