package intake

import "testing"

func TestText(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind Kind
		body string
		want string
	}{
		{"a text prompt", Completion, `{"model":"m","prompt":"Hello there"}`, "Hello there"},
		{"prompts", Completion, `{"model":"m","prompt":["a b","c"]}`, "a b c"},
		{"token prompt", Completion, `{"model":"m","prompt":[1,2,3]}`, ""},
		{"chat", Chat, `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi ü"}]}`, "Be brief. Hi ü"},
		{"chat parts", Chat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"here"}]}]}`, "look here"},
		{"chat, told by its fields", Any, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "x"},
		{"responses string", Responses, `{"model":"m","input":"What now?"}`, "What now?"},
		{"responses items", Responses, `{"model":"m","input":[{"role":"user","content":"list"},{"type":"function_call","call_id":"c","name":"ls","arguments":"{\"d\":1}"},{"type":"function_call_output","call_id":"c","output":"a.txt"},{"role":"assistant","content":[{"type":"output_text","text":"done"}]}]}`, `list {"d":1} a.txt done`},
		{"empty message contents skipped", Chat, `{"model":"m","messages":[{"role":"user","content":""},{"role":"user","content":"y"}]}`, "y"},
		{"not JSON", Chat, `{`, ""},
		{"no fields", Any, `{"model":"m"}`, ""},
		{"tokens", Tokens, `{"model":"m","token_ids":[1,2]}`, ""},
	} {
		if got := Text(tc.kind, []byte(tc.body)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func FuzzText(f *testing.F) {
	f.Add(`{"messages":[{"content":"x"}]}`)
	f.Add(`{"input":[{"content":[{"text":"y"}]}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		for _, k := range []Kind{Any, Chat, Completion, Responses, Tokens} {
			_ = Text(k, []byte(body))
		}
	})
}
