package chat

import (
	"encoding/json"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the request parsers: they must never
// panic, and whatever they accept must render.
func FuzzParse(f *testing.F) {
	seeds := []string{
		``, `null`, `[]`, `"hi"`, `{}`, `[1]`, `[{`,
		`[{"role":"user","content":"hi"}]`,
		`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]`,
		`[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]`,
		`[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`,
		`[{"type":"function","name":"f","parameters":{}},{"type":"web_search"}]`,
		`[{"role":"user","content":[{"type":"input_text","text":"x"}]},{"type":"reasoning"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"y"}]`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		raw := json.RawMessage(data)
		msgs, err := ParseChatMessages(raw)
		if err == nil {
			renderAll(t, msgs, nil)
		}
		tools, err := ParseChatTools(raw)
		if err == nil {
			renderAll(t, []Message{{Role: "user", Content: "x"}}, tools)
		}
		msgs, tools, err = ParseResponsesInput(string(data), raw, raw)
		if err == nil {
			renderAll(t, msgs, tools)
		}
		msgs, tools, err = ParseResponsesInput("", raw, nil)
		if err == nil {
			renderAll(t, msgs, tools)
		}
	})
}

func renderAll(t *testing.T, msgs []Message, tools []Tool) {
	t.Helper()
	for _, opts := range []RenderOptions{{}, {AddGenerationPrompt: true}} {
		if _, err := Render(msgs, tools, opts); err != nil {
			t.Fatalf("Render(%+v, %+v, %+v): %v", msgs, tools, opts, err)
		}
	}
	if msgs[len(msgs)-1].Role == "assistant" {
		if _, err := Render(msgs, tools, RenderOptions{ContinueFinalMessage: true}); err != nil {
			t.Fatalf("Render(continue): %v", err)
		}
	}
}
